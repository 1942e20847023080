package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/conveyor-llm/conveyor/api"
	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/api/toolcall"
	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/modeldir"
	"github.com/conveyor-llm/conveyor/scheduler"
)

func init() {
	register(command{
		name:    "serve",
		summary: "serve a model over the OpenAI-compatible HTTP API (completions, chat, SSE, metrics)",
		run:     runServe,
	})
}

// serveOptions are the flags of `conveyor serve`. Its model and engine flags (modelFlags)
// are shared with `conveyor run-batch`, which sets cmd to name itself in errors.
type serveOptions struct {
	cmd             string // the command errors name: "serve" (the default) or "run-batch"
	modelDir        string
	attention       string
	kvCacheDType    string
	quantize        string
	dtype           string
	toolCallParser  string
	targetStepTime  string
	speculative     string
	stepTrace       string
	host            string
	port            int
	servedName      string
	scheduler       string
	maxNumSeqs      int
	maxBatchedToks  int
	kvCacheBytes    byteSize
	gpuMemUtil      float64 // --gpu-memory-utilization; 0: --kv-cache-memory sizes the cache
	blockSizeTokens int
	maxBatchSize    int
	maxBatchDelay   time.Duration
	maxQueue        int
	maxModelLen     int
	apiKey          string
	ortLib          string
	device          string
	cudaProvider    string
	threads         int
	spin            bool
	noWebUI         bool
	noPrefixCache   bool
	shutdownTimeout time.Duration
	shutdownDelay   time.Duration
	maxConnections  int
	// The HTTP server's limits, flags of serve only (httpLimits says they were defined;
	// run-batch keeps api.DefaultConfig's).
	httpLimits     bool
	maxHeaderBytes byteSize
	readHeaderWait time.Duration // --read-header-timeout
	bodiesInFlight byteSize      // --max-body-bytes-in-flight
	bodyReadWait   time.Duration // --body-read-timeout
	idleTimeout    time.Duration
	logFormat      string
	genConfig      string
	// The /v1/responses store (responses_store.go).
	dataDir, responsesRetention string
}

// envPrefix is prepended to a flag's name in upper snake case to give its environment
// variable: --max-num-seqs <-> CONVEYOR_MAX_NUM_SEQS.
const envPrefix = "CONVEYOR_"

// envName is the environment variable of a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// byteSize is a flag value in bytes that accepts binary and decimal suffixes:
// 512MiB, 1GiB, 1.5G (binary), 500MB (decimal), or a plain number of bytes.
type byteSize int64

func (b *byteSize) String() string { return formatBytes(int64(*b)) }

func (b *byteSize) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

// parseBytes parses a size such as "512MiB", "1GiB", "2G", "300MB", "4096".
// K, M, G, T and KiB..TiB are powers of 1024; KB, MB, GB, TB are powers of 1000.
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult := map[string]float64{
		"": 1, "b": 1,
		"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
		"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	}[unit]
	x, err := strconv.ParseFloat(num, 64)
	if mult == 0 || err != nil || x < 0 {
		return 0, fmt.Errorf("invalid size %q (use bytes or a suffix: 512MiB, 1GiB, 500MB)", s)
	}
	v := x * mult
	if v > 1<<62 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(v), nil
}

// formatBytes prints n with the largest exact binary suffix.
func formatBytes(n int64) string {
	for _, u := range []struct {
		s string
		v int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.v && n%u.v == 0 {
			return strconv.FormatInt(n/u.v, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}

// serveFlags defines the flags of `conveyor serve` on fs with their defaults: the model
// and engine flags, then the HTTP server's own.
func serveFlags(fs *flag.FlagSet, o *serveOptions) {
	ac := api.DefaultConfig()
	modelFlags(fs, o)
	fs.StringVar(&o.host, "host", "127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
	fs.IntVar(&o.port, "port", 8000, "TCP port to listen on")
	fs.StringVar(&o.apiKey, "api-key", "", "require \"Authorization: Bearer KEY\" on /v1/*, /tokenize, /detokenize (/health and /metrics stay open)")
	fs.BoolVar(&o.noWebUI, "no-webui", false, "do not serve the built-in chat page at /")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM/SIGINT, how long in-flight requests may finish before they are aborted")
	fs.DurationVar(&o.shutdownDelay, "shutdown-delay", 0, "on SIGTERM/SIGINT, how long /health answers 503 while every request is still served, before the listener closes and the drain starts (lets load balancers that follow /health stop routing first)")
	fs.IntVar(&o.maxConnections, "max-connections", ac.MaxConnections, "open client connections at most (more wait to be accepted)")
	o.httpLimits = true
	o.maxHeaderBytes = byteSize(ac.MaxHeaderBytes)
	fs.Var(&o.maxHeaderBytes, "max-header-bytes", "request line and headers of a request at most, in bytes (suffixes KiB, MiB); larger get HTTP 431")
	fs.DurationVar(&o.readHeaderWait, "read-header-timeout", ac.ReadHeaderTimeout, "a client that has not sent a request's headers within this is disconnected")
	o.bodiesInFlight = byteSize(ac.MaxBodyBytesInFlight)
	fs.Var(&o.bodiesInFlight, "max-body-bytes-in-flight", fmt.Sprintf("request bodies read and parsed at once, in bytes (at least the %s body limit); further requests wait their turn. Bounds memory under a storm of large requests", formatBytes(ac.MaxBodyBytes)))
	fs.DurationVar(&o.bodyReadWait, "body-read-timeout", ac.BodyReadTimeout, "a client whose request body has not arrived within this of its turn is disconnected")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", ac.IdleTimeout, "a keep-alive connection idle this long is closed")
	responsesFlags(fs, o)
	fs.StringVar(&o.stepTrace, "step-trace", "", "write one JSON line per engine step to this file: rows, tokens, past, schedule/forward/sample/emit times in ms, Go GC pauses")
}

// modelFlags defines the flags that load the model and configure the engine, shared by
// `conveyor serve` and `conveyor run-batch`.
func modelFlags(fs *flag.FlagSet, o *serveOptions) {
	ec := engine.DefaultConfig()
	o.kvCacheBytes = byteSize(ec.KVCacheBytes)
	fs.StringVar(&o.modelDir, "model", "models/default", "model directory: model.onnx, config.json, tokenizer.json; or a Hugging Face checkpoint directory or a GGUF file (built to ONNX once, cached)")
	fs.StringVar(&o.servedName, "served-model-name", "", "model id clients send in \"model\" (default: the model directory's base name)")
	fs.StringVar(&o.scheduler, "scheduler", "continuous", "batching policy: continuous, static or sequential")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", ec.MaxNumSeqs, "sequences in one forward pass at most")
	fs.IntVar(&o.maxBatchedToks, "max-num-batched-tokens", ec.MaxNumBatchedTokens, "tokens fed to the model in one step at most (long prompts are prefilled in chunks)")
	fs.Var(&o.kvCacheBytes, "kv-cache-memory", "KV-cache memory budget in bytes; suffixes KiB/MiB/GiB (1024) or KB/MB/GB (1000)")
	fs.Float64Var(&o.gpuMemUtil, "gpu-memory-utilization", 0, "on a GPU, size the KV cache so that the process uses this fraction of the GPU's memory (vLLM's flag; 0.9 leaves a tenth to others), instead of --kv-cache-memory; 0 = off")
	fs.StringVar(&o.targetStepTime, "target-step-time", "auto", fmt.Sprintf("bound on a step's time while sequences decode (prompt chunks are sized from measured step times): auto (%d× the decode rows' own time, at least %v), off, or a duration such as 50ms; --max-num-batched-tokens stays the upper bound", scheduler.AutoStepTimeFactor, scheduler.MinAutoStepTime))
	fs.StringVar(&o.speculative, "speculative-config", "", `speculative decoding, as vLLM's JSON: {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4, "disable_by_batch_size": 8} proposes tokens by prompt lookup, {"method": "draft_model", "model": DIR, "num_speculative_tokens": 4, "quantization": "int4"} by a smaller model with the same tokenizer (its argmax for greedy requests, drawn from its distribution for sampled ones); either is verified in the shared step (greedy outputs are those of decoding without it, sampled ones distributed as they are); "" = off`)
	fs.IntVar(&o.blockSizeTokens, "block-size", ec.BlockSizeTokens, "tokens per KV-cache block; 0 = the model's default: 16, on the GPU the smallest with which FlashAttention runs for its head size (256 for heads up to 64, 128 up to 128, else 64). The step graph takes powers of two of at least 16 (on the GPU, of at least that default)")
	fs.IntVar(&o.maxBatchSize, "max-batch-size", ec.MaxBatchSize, "sequences per batch with --scheduler static")
	fs.DurationVar(&o.maxBatchDelay, "max-batch-delay", ec.MaxBatchDelay, "how long a static batch waits to fill (e.g. 50ms)")
	fs.IntVar(&o.maxQueue, "max-queue", ec.MaxQueue, "requests waiting for a batch slot at most (continuous batching admits what fits in --max-num-seqs at once); more get HTTP 429")
	fs.IntVar(&o.maxModelLen, "max-model-len", 0, "tokens per sequence (prompt + completion) at most; 0 = the model's context, which is also the most it takes (more is refused)")
	fs.StringVar(&o.ortLib, "ort-lib", "", "ONNX Runtime library (default $"+models.ORTLibEnv+" or "+models.DefaultORTLib+")")
	deviceFlags(fs, &o.device, &o.cudaProvider)
	fs.IntVar(&o.threads, "threads", 0, "ONNX Runtime intra-op threads; 0 = all cores")
	fs.BoolVar(&o.spin, "spin", true, "let ONNX Runtime's idle workers spin (at the lowest priority) between runs; --spin=false lets them sleep (an int8 model's never spin: its products run on Conveyor's own threads)")
	fs.StringVar(&o.kvCacheDType, "kv-cache-dtype", models.KVCacheAuto, "KV cache element type: float32, float16 (half the memory per token: twice the blocks in the same --kv-cache-memory, half the bytes each step reads) or auto (float16 for a checkpoint built for the CPU; a built model directory's and the dense path's own type)")
	fs.StringVar(&o.toolCallParser, "tool-call-parser", "", "tool-call format for chat requests with tools: hermes, llama3_json, mistral or generic; default chosen from the chat template")
	fs.StringVar(&o.dtype, "dtype", "auto", "with a Hugging Face checkpoint on the GPU: the step graph's float type, auto (the checkpoint's torch_dtype: bfloat16, else float16; Gemma 2 and 3 bfloat16, as vLLM's --dtype auto), float16 or bfloat16")
	fs.StringVar(&o.quantize, "quantize", "", "with a Hugging Face checkpoint or GGUF file: build it with int8 (per-channel) or int4 (block-quantized) linear layers, or none; a GGUF file's default is the nearest to its own types (int4 for 4-bit files, int8 for 5- to 8-bit ones); a built directory is served as it was built")
	fs.StringVar(&o.attention, "attention", "", attentionHelp)
	fs.BoolVar(&o.noPrefixCache, "no-prefix-caching", false, "do not share KV blocks between identical prompt prefixes")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format on stderr: text or json")
	fs.StringVar(&o.genConfig, "generation-config", "none", "sampling defaults for fields a request leaves out: none (OpenAI's: temperature 1, top_p 1) or auto (the model's generation_config.json, as vLLM)")
}

// parseServeFlags parses args over the environment: every flag can also be set as
// CONVEYOR_<NAME> (e.g. CONVEYOR_MAX_NUM_SEQS=64); a flag on the command line wins.
func parseServeFlags(args []string, getenv func(string) string, output io.Writer) (*serveOptions, error) {
	o := &serveOptions{cmd: "serve"}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(output)
	serveFlags(fs, o)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, "usage: conveyor serve --model DIR [flags]")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Serves the OpenAI-compatible API: POST /v1/completions, POST /v1/chat/completions, /v1/responses, GET /v1/models,")
		fmt.Fprintln(w, "GET /health, GET /metrics, POST /tokenize, POST /detokenize, and a chat page at /.")
		fmt.Fprintln(w, "Every flag can also be set through the environment as CONVEYOR_<FLAG> in upper snake case")
		fmt.Fprintln(w, "(--max-num-seqs -> CONVEYOR_MAX_NUM_SEQS); the command line wins.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "flags:")
		fs.PrintDefaults()
	}
	if err := parseEnvFlags(fs, args, getenv, output); err != nil {
		return nil, err
	}
	if o.dataDir == "auto" {
		o.dataDir = defaultDataDir(getenv)
	}
	if o.host == "" { // run-batch listens nowhere: its options have none
		return nil, errors.New("serve: --host is empty: give an address to listen on (0.0.0.0 for every interface)")
	}
	return o, o.validate()
}

// parseEnvFlags parses args into fs over the environment: each flag is first set from
// CONVEYOR_<NAME> when that is set, then from args, so the command line wins. Errors name
// fs (its name is the command's) in one line; -h prints the usage to output and returns
// flag.ErrHelp.
func parseEnvFlags(fs *flag.FlagSet, args []string, getenv func(string) string, output io.Writer) error {
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		v := getenv(envName(f.Name))
		if v == "" || envErr != nil {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErr = fmt.Errorf("%s: %s=%q: %v", fs.Name(), envName(f.Name), v, err)
		}
	})
	if envErr != nil {
		return envErr
	}
	fs.SetOutput(io.Discard) // a bad flag is reported in one line, not with the usage text
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(output)
			fs.Usage()
			return err
		}
		return fmt.Errorf("%s: %v", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// validate checks values the engine and server configs do not check themselves.
func (o *serveOptions) validate() error {
	switch {
	case o.modelDir == "":
		return fmt.Errorf("%s: --model is required", o.name())
	case o.port < 0 || o.port > 65535:
		return fmt.Errorf("%s: --port %d is not a TCP port", o.name(), o.port)
	case checkThreads(o.threads) != nil:
		return fmt.Errorf("%s: %w", o.name(), checkThreads(o.threads))
	case o.gpuMemUtil < 0 || o.gpuMemUtil > 1 || math.IsNaN(o.gpuMemUtil):
		return fmt.Errorf("%s: --gpu-memory-utilization %v: want a fraction in (0, 1], or 0 for --kv-cache-memory", o.name(), o.gpuMemUtil)
	case o.gpuMemUtil > 0 && o.device == models.DeviceCPU:
		return fmt.Errorf("%s: --gpu-memory-utilization sizes a cache in GPU memory: not with --device cpu", o.name())
	case checkAttention(o.attention) != nil:
		return fmt.Errorf("%s: %w", o.name(), checkAttention(o.attention))
	case o.kvCacheDType != "" && o.kvCacheDType != models.KVCacheAuto && o.kvCacheDType != "float32" && o.kvCacheDType != "float16":
		return fmt.Errorf("%s: --kv-cache-dtype %q: want float32, float16 or auto", o.name(), o.kvCacheDType)
	}
	if !o.mayServeOnGPU() {
		if err := checkKVMemory(int64(o.kvCacheBytes), meminfoPath); err != nil {
			return fmt.Errorf("%s: %w", o.name(), err)
		}
	}
	if o.toolCallParser != "" {
		if _, err := toolcall.ByName(o.toolCallParser); err != nil {
			return fmt.Errorf("%s: --tool-call-parser: %w", o.name(), err)
		}
	}
	if err := checkQuantize(o.quantize); err != nil {
		return fmt.Errorf("%s: --quantize: %w", o.name(), err)
	}
	if err := checkDevice(o.device); err != nil {
		return fmt.Errorf("%s: %w", o.name(), err)
	}
	if err := checkDType(o.dtype, o.device); err != nil {
		return fmt.Errorf("%s: %w", o.name(), err)
	}
	if _, err := parseSpeculativeConfig(o.speculative); err != nil {
		return fmt.Errorf("%s: %v", o.name(), err)
	}
	switch {
	case o.maxModelLen < 0:
		return fmt.Errorf("%s: --max-model-len %d must be >= 0", o.name(), o.maxModelLen)
	case o.shutdownTimeout < 0:
		return fmt.Errorf("%s: --shutdown-timeout %v must be >= 0", o.name(), o.shutdownTimeout)
	case o.shutdownDelay < 0:
		return fmt.Errorf("%s: --shutdown-delay %v must be >= 0", o.name(), o.shutdownDelay)
	case o.logFormat != "text" && o.logFormat != "json":
		return fmt.Errorf("%s: --log-format %q must be text or json", o.name(), o.logFormat)
	case o.genConfig != "auto" && o.genConfig != "none":
		return fmt.Errorf("%s: --generation-config %q must be auto or none", o.name(), o.genConfig)
	}
	if _, err := o.engineConfig(nil); err != nil {
		return err
	}
	if _, err := o.apiConfig(nil, nil); err != nil {
		return err
	}
	return nil
}

// mayServeOnGPU reports whether the model may keep its KV cache in GPU memory, where the
// host's available memory says nothing about the budget: --device cuda, or auto with a
// model directory that has a GPU step graph. loadModel checks the host's memory once the
// device is known.
func (o *serveOptions) mayServeOnGPU() bool {
	switch o.device {
	case models.DeviceCUDA:
		return true
	case models.DeviceCPU:
		return false
	}
	m, err := modeldir.LoadStep(o.modelDir)
	return err == nil && m.AttentionDomain == modeldir.StepDomainMicrosoft
}

// meminfoPath is where checkKVMemory reads the machine's available memory (a variable for tests).
var meminfoPath = "/proc/meminfo"

// checkKVMemory refuses a KV-cache budget (bytes, allocated whole at start-up) larger than
// the memory the kernel reports available (MemAvailable in meminfo): such a server would
// swap or be killed under load rather than fail at start. Without a readable meminfo (not
// Linux) there is nothing to check against.
func checkKVMemory(kvBytes int64, meminfo string) error {
	avail, total, ok := convert.ReadMeminfo(meminfo)
	if !ok || kvBytes <= avail {
		return nil
	}
	return fmt.Errorf("--kv-cache-memory %s is more than the memory available: MemAvailable %s of MemTotal %s (%s)",
		humanBytes(kvBytes), humanBytes(avail), humanBytes(total), meminfo)
}

// humanBytes prints n in GiB or MiB with one decimal.
func humanBytes(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1fGiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
}

// engineConfig builds the engine's configuration from the flags.
func (o *serveOptions) engineConfig(onStep func(engine.StepInfo)) (engine.Config, error) {
	c := engine.DefaultConfig()
	p, err := engine.ParsePolicy(o.scheduler)
	if err != nil {
		return c, fmt.Errorf("%s: --scheduler: %v", o.name(), err)
	}
	c.Policy = p
	c.MaxNumSeqs = o.maxNumSeqs
	c.MaxNumBatchedTokens = o.maxBatchedToks
	c.KVCacheBytes = int64(o.kvCacheBytes)
	c.BlockSizeTokens = o.blockSizeTokens
	c.MaxBatchSize = o.maxBatchSize
	c.MaxBatchDelay = o.maxBatchDelay
	c.MaxQueue = o.maxQueue
	c.MaxModelLen = o.maxModelLen
	c.EnablePrefixCaching = !o.noPrefixCache
	switch o.targetStepTime {
	case "auto", "":
		c.TargetStepTime = 0
	case "off":
		c.TargetStepTime = -1
	default:
		d, err := time.ParseDuration(o.targetStepTime)
		if err != nil || d <= 0 {
			return c, fmt.Errorf("%s: --target-step-time %q: want auto, off or a positive duration such as 50ms", o.name(), o.targetStepTime)
		}
		c.TargetStepTime = d
	}
	sc, err := parseSpeculativeConfig(o.speculative)
	if err != nil {
		return c, fmt.Errorf("%s: %v", o.name(), err)
	}
	c.Speculation = sc.Speculation
	c.OnStep = onStep
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%s: %v", o.name(), inFlagTerms(err))
	}
	return c, nil
}

// name is the command errors name.
func (o *serveOptions) name() string {
	if o.cmd == "" {
		return "serve"
	}
	return o.cmd
}

// modelName is the served model id.
func (o *serveOptions) modelName() string {
	if o.servedName != "" {
		return o.servedName
	}
	return filepath.Base(filepath.Clean(o.modelDir))
}

// apiConfig builds the HTTP server's configuration from the flags.
func (o *serveOptions) apiConfig(log *slog.Logger, m *api.Metrics) (api.Config, error) {
	c := api.DefaultConfig()
	c.ModelName = o.modelName()
	c.APIKey = o.apiKey
	c.MaxConnections = o.maxConnections
	if o.httpLimits {
		c.MaxHeaderBytes = int(min(int64(o.maxHeaderBytes), 1<<30))
		c.ReadHeaderTimeout, c.IdleTimeout = o.readHeaderWait, o.idleTimeout
		c.MaxBodyBytesInFlight, c.BodyReadTimeout = int64(o.bodiesInFlight), o.bodyReadWait
		if c.MaxBodyBytesInFlight < c.MaxBodyBytes {
			return c, fmt.Errorf("%s: --max-body-bytes-in-flight must be at least the body limit, %s; got %s",
				o.name(), formatBytes(c.MaxBodyBytes), formatBytes(c.MaxBodyBytesInFlight))
		}
		if c.BodyReadTimeout <= 0 {
			return c, fmt.Errorf("%s: --body-read-timeout must be > 0, got %v", o.name(), c.BodyReadTimeout)
		}
	}
	c.EnableWebUI = !o.noWebUI
	c.Logger = log
	c.Metrics = m
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%s: %v", o.name(), apiFlagTerms.Replace(err.Error()))
	}
	return c, nil
}

// apiFlagTerms names the api.Config fields that api.Config.Validate names as the flags
// that set them.
var apiFlagTerms = strings.NewReplacer("api: ", "",
	"MaxConnections", "--max-connections", "MaxHeaderBytes", "--max-header-bytes",
	"ReadHeaderTimeout", "--read-header-timeout", "IdleTimeout", "--idle-timeout")

func runServe(args []string) error {
	o, err := parseServeFlags(args, os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	ctx, stop := notifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return serve(ctx, o, os.Stdout, os.Stderr, nil)
}

// serve listens, loads the model (with /health answering 503 meanwhile), serves until ctx
// is done, then drains: /health answers 503 for --shutdown-delay while everything else is
// still served, the listener closes, in-flight requests get --shutdown-timeout to finish,
// the rest are aborted, and the engine stops. A ctx done during the load stops at once. ready, when not nil, receives the
// listening address once the model is loaded.
func serve(ctx context.Context, o *serveOptions, stdout, stderr io.Writer, ready chan<- string) error {
	var h slog.Handler = slog.NewTextHandler(stderr, nil)
	if o.logFormat == "json" {
		h = slog.NewJSONHandler(stderr, nil)
	}
	log := slog.New(h)
	metrics := api.NewMetrics()
	acfg, err := o.apiConfig(log, metrics)
	if err != nil {
		return err
	}
	var closeStore func()
	if acfg.Responses, closeStore, err = o.openResponseStore(log, os.Getenv); err != nil {
		return err
	}
	defer closeStore() // after the drain, which waits for background responses
	onStep := metrics.OnStep
	if o.stepTrace != "" {
		trace, err := openStepTrace(o.stepTrace)
		if err != nil {
			return fmt.Errorf("%s: %w", o.name(), err)
		}
		defer func() {
			if err := trace.Close(); err != nil {
				log.Error("step trace", "err", err)
			}
		}()
		onStep = func(s engine.StepInfo) {
			metrics.OnStep(s)
			trace.OnStep(s)
		}
	}
	ecfg, err := o.engineConfig(onStep)
	if err != nil {
		return err
	}
	ecfg.Logger = log // the engine's reports in --log-format too
	srv, err := api.New(acfg)
	if err != nil {
		return fmt.Errorf("%s: %w", o.name(), err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	if err != nil {
		return fmt.Errorf("%s: %w", o.name(), err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	drain := func() {
		sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("in-flight requests were aborted at the drain deadline", "err", err)
		}
		<-served
	}

	// The load runs while ctx is watched: SIGTERM during a long load (a checkpoint being
	// built, a large graph being optimised) stops the server at once. The load itself
	// cannot be interrupted; what it loads is shut down when it returns.
	type loadResult struct {
		m   *loadedModel
		err error
	}
	loaded := make(chan loadResult, 1)
	go func() {
		m, err := o.loadModel(log, ecfg)
		loaded <- loadResult{m, err}
	}()
	var r loadResult
	select {
	case r = <-loaded:
	case <-ctx.Done():
		log.Info("shutting down while the model loads")
		drain()
		go func() {
			if r := <-loaded; r.m != nil {
				r.m.shutdown(log, 5*time.Second)
			}
		}()
		return nil
	}
	if r.err != nil {
		drain()
		return r.err
	}
	m := r.m
	srv.SetBackend(m.backend)
	addr := ln.Addr().String()
	m.logReady(log, o, acfg.ModelName, "addr", addr)
	printBanner(stdout, addr, acfg.ModelName, o.apiKey != "", !o.noWebUI)
	if ready != nil {
		ready <- addr
	}

	select {
	case <-ctx.Done():
		if o.shutdownDelay > 0 {
			log.Info("shutting down: /health answers 503 while requests are still served", "delay", o.shutdownDelay)
			srv.Unready()
			time.Sleep(o.shutdownDelay)
		}
		log.Info("shutting down: draining in-flight requests", "timeout", o.shutdownTimeout)
	case err := <-served:
		served <- err // drain() waits on it
		log.Error("server stopped", "err", err)
	}
	drain()
	m.shutdown(log, 5*time.Second)
	log.Info("stopped")
	return nil
}

// printBanner tells a newcomer where the server is and how to call it.
func printBanner(w io.Writer, addr, model string, withKey, webUI bool) {
	url := "http://" + addr
	auth := ""
	if withKey {
		auth = ` -H "Authorization: Bearer $CONVEYOR_API_KEY"`
	}
	page := ""
	if webUI {
		page = fmt.Sprintf(" (chat page: %s/)", url)
	}
	fmt.Fprintf(w, "Conveyor is serving %q at %s%s\n", model, url, page)
	fmt.Fprintf(w, "Try:\n  curl -N %s/v1/completions -H 'Content-Type: application/json'%s \\\n", url, auth)
	fmt.Fprintf(w, "    -d '{\"model\": %q, \"prompt\": \"Once upon a time\", \"max_tokens\": 32, \"stream\": true}'\n", model)
}

// samplingDefaults reads the model's generation_config.json with --generation-config
// auto: its temperature, top_p, top_k and repetition_penalty become the defaults of
// requests that leave them out, as vLLM's --generation-config auto does. The default,
// none, keeps OpenAI's defaults, which clients assume. A value the engine's rules refuse
// is dropped with a warning.
func (o *serveOptions) samplingDefaults(log *slog.Logger, dir string, lim engine.Limits) (openai.SamplingDefaults, error) {
	var d openai.SamplingDefaults
	if o.genConfig == "none" {
		return d, nil
	}
	g, err := modeldir.LoadGenerationConfig(dir)
	if err != nil {
		return d, err
	}
	d, dropped := openai.SamplingDefaults{Temperature: g.Temperature, TopP: g.TopP, TopK: g.TopK, RepetitionPenalty: g.RepetitionPenalty}.Checked(lim)
	for _, err := range dropped {
		log.Warn("generation_config.json default ignored", "reason", err.Error())
	}
	g.Temperature, g.TopP, g.TopK, g.RepetitionPenalty = d.Temperature, d.TopP, d.TopK, d.RepetitionPenalty
	var set []any
	for _, f := range []struct {
		name string
		v    *float64
	}{{"temperature", g.Temperature}, {"top_p", g.TopP}, {"repetition_penalty", g.RepetitionPenalty}} {
		if f.v != nil {
			set = append(set, f.name, *f.v)
		}
	}
	if g.TopK != nil {
		set = append(set, "top_k", *g.TopK)
	}
	if len(set) > 0 {
		log.Info("sampling defaults from generation_config.json", set...)
	}
	return d, nil
}
