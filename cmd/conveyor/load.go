package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/conveyor-llm/conveyor/api"
	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/kernels"
	"github.com/conveyor-llm/conveyor/models/ort"
	"github.com/conveyor-llm/conveyor/models/plan"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// loadOptions say how load opens a model: how a Hugging Face checkpoint is built and how
// the runner opens the model.
type loadOptions struct {
	// quantize builds a Hugging Face checkpoint with int8 or int4 weights ("" = float);
	// a model directory is opened as it was built.
	quantize string
	// dtype is the float type of a checkpoint's step graph on the GPU: "" or "auto" (the
	// checkpoint's, convert.GPUStepDType), float16 or bfloat16.
	dtype  string
	runner models.RunnerOptions
	// built, when set, is told that load built the checkpoint's graph into dir.
	built func(src, dir string, took time.Duration)
	// log receives load's warnings; nil = slog.Default().
	log *slog.Logger
}

// loaded is a model load opened: the directory, its tokenizer and its runner.
type loaded struct {
	dir          string // the model directory opened: the one given, or the graph built from a checkpoint
	quantization string // the directory's weights as built: none, int8 or int4
	tok          *tokenizer.Tokenizer
	model        models.Model
	runner       models.RunnerOptions // the plan's: device, path and KV cache type resolved
}

// load opens the model at dir for a command: its tokenizer and its runner (the caller
// closes it), as plan.Resolve decides from the flags, the model and the hardware. A
// model directory is opened as it is. A Hugging Face checkpoint (config.json and
// *.safetensors without model.onnx) or a GGUF file is the one thing load builds: its
// ONNX graph is built once into the cache ($CONVEYOR_CACHE_DIR; convert.Prepare)
// and reused after, and o.built is told; `conveyor build-model` builds explicitly. This
// file is the only one of the commands but build-model that knows the builder.
func load(dir string, o loadOptions) (*loaded, error) {
	start := time.Now()
	p, err := plan.Resolve(dir, plan.Flags{Runner: o.runner, Quantize: o.quantize, DType: o.dtype})
	if o.runner.Device == models.DeviceCUDA && (err == nil || errors.Is(err, models.ErrModelDir)) {
		// Asked for the GPU: say whether there is one before building for it, or before
		// what the model directory would need there (the flags' own errors come first).
		if err := models.CUDAUnavailable(o.runner); err != nil {
			return nil, err
		}
	}
	if err != nil {
		return nil, err
	}
	// $CONVEYOR_CACHE_DIR says where a checkpoint's graph is built ("" = convert's
	// default, the user's cache directory).
	src := dir
	dir, built, err := convert.Prepare(dir, os.Getenv(convert.CacheDirEnv), p.Build)
	if err != nil {
		return nil, err
	}
	if built && o.built != nil {
		o.built(src, dir, time.Since(start))
	}
	tok, err := tokenizer.Load(dir)
	var m models.Model
	if err == nil {
		m, err = models.Open(dir, p.Runner)
	}
	if err != nil && !built && dir != src && (errors.Is(err, models.ErrModelDir) || errors.Is(err, tokenizer.ErrInvalid) || errors.Is(err, fs.ErrNotExist)) {
		// A cached build of a checkpoint that does not load (a disk that filled up, a file
		// damaged since): built again, once, rather than failing the same way every start.
		log := o.log
		if log == nil {
			log = slog.Default()
		}
		log.Warn("the cached build does not load; building it again", "dir", dir, "err", err)
		if rerr := os.RemoveAll(dir); rerr != nil {
			return nil, fmt.Errorf("%w (removing the cached build: %v)", err, rerr)
		}
		if dir, built, err = convert.Prepare(src, os.Getenv(convert.CacheDirEnv), p.Build); err != nil {
			return nil, err
		}
		if built && o.built != nil {
			o.built(src, dir, time.Since(start))
		}
		if tok, err = tokenizer.Load(dir); err == nil {
			m, err = models.Open(dir, p.Runner)
		}
	}
	if err != nil {
		return nil, err
	}
	return &loaded{dir: dir, quantization: convert.BuiltQuantization(dir), tok: tok, model: m, runner: p.Runner}, nil
}

// reopen opens the loaded model's directory again, with the same options.
func (l *loaded) reopen() (models.Model, error) { return models.Open(l.dir, l.runner) }

// checkDType checks a --dtype value: one GPUStepDType takes, and not float16 or bfloat16
// on the CPU, where a checkpoint's graph is float32.
func checkDType(dtype, device string) error {
	if _, err := convert.GPUStepDType(nil, dtype); err != nil {
		return err
	}
	if dtype != "auto" && dtype != "" && device == models.DeviceCPU {
		return fmt.Errorf("--dtype %s is the GPU step graph's type; on the CPU a checkpoint is served in float32 (or --quantize)", dtype)
	}
	return nil
}

// checkQuantize checks a --quantize value.
func checkQuantize(s string) error {
	_, err := convert.ParseQuantization(s)
	return err
}

// modelDescription is the model directory with its architecture and size from
// config.json, when it has one.
func modelDescription(dir string) string {
	cfg, err := convert.LoadConfig(dir)
	if err != nil {
		return dir
	}
	return fmt.Sprintf("%s (%s, %.1fM parameters, %d layers, hidden %d, vocabulary %d)",
		dir, cfg.ModelType, float64(cfg.NumParams())/1e6, cfg.NumHiddenLayers, cfg.HiddenSize, cfg.VocabSize)
}

// deviceFlags defines --device and --cuda-provider on fs.
func deviceFlags(fs *flag.FlagSet, device, cudaProvider *string) {
	fs.StringVar(device, "device", models.DeviceAuto, "where the model runs: cpu, cuda (ONNX Runtime's CUDA provider from make ort-gpu, with the CUDA 13 and cuDNN 9 libraries on LD_LIBRARY_PATH) or auto (the GPU when one is usable, else the CPU)")
	fs.StringVar(cudaProvider, "cuda-provider", "", "ONNX Runtime's CUDA provider library (default $"+ort.CUDAProviderEnv+" or "+ort.DefaultCUDAProvider+")")
}

// attentionHelp describes --attention for every command that takes it.
const attentionHelp = "attention path: graph (the whole model as one step graph with PagedAttention reading and writing the KV blocks in place: ONNX Runtime's on a GPU, Conveyor's own on CPUs; every model Conveyor builds) or dense (the Hugging Face Optimum interface, for ONNX decoders Conveyor did not build, such as Optimum exports); default: graph when the model has one for the device, else dense"

// activationReserveBytes is what gpuKVBudget leaves, beyond the model's weights, for a
// step's activations and ONNX Runtime's workspace: 1 GiB, or 5% of the GPU if more.
func activationReserveBytes(total int64) int64 { return max(1<<30, total/20) }

// gpuKVBudget returns the KV-cache bytes that bring the process to util of its GPU's
// memory, the model's weights already loaded: util·total − what is in use now (every
// process's) − the activations' reserve. A model not on a GPU, or a fraction too small to
// hold anything, is an error that says so.
func gpuKVBudget(m models.Model, util float64) (int64, error) {
	if !m.Spec().KVOnDevice {
		return 0, fmt.Errorf("--gpu-memory-utilization sizes a cache in GPU memory, and the model runs on %s (--device cuda)", m.Device())
	}
	free, total, err := m.DeviceMemory()
	if err != nil {
		return 0, err
	}
	kv := int64(util*float64(total)) - (total - free) - activationReserveBytes(total)
	if kv <= 0 {
		return 0, fmt.Errorf("--gpu-memory-utilization %v leaves no room for a KV cache: %s of %s in use with the weights loaded, %s kept for activations",
			util, humanBytes(total-free), humanBytes(total), humanBytes(activationReserveBytes(total)))
	}
	return kv, nil
}

// checkGPUKV refuses a --kv-cache-memory that does not fit in the free memory of the GPU
// the model runs on, the activations' reserve kept (as gpuKVBudget keeps it): the cache is
// allocated on the first step, and a server that cannot hold it should not start. A model
// whose cache is not on a GPU passes.
func checkGPUKV(m models.Model, kvBytes int64) error {
	if !m.Spec().KVOnDevice {
		return nil
	}
	free, total, err := m.DeviceMemory()
	if err != nil {
		return err
	}
	if room := free - activationReserveBytes(total); kvBytes > room {
		return fmt.Errorf("--kv-cache-memory %s does not fit on %s: %s of %s free with the weights loaded, %s kept for activations; lower it, or size the cache with --gpu-memory-utilization",
			humanBytes(kvBytes), m.Device(), humanBytes(free), humanBytes(total), humanBytes(activationReserveBytes(total)))
	}
	return nil
}

// checkAttention checks an --attention value (the rule is RunnerOptions.Validate's).
func checkAttention(attention string) error {
	if (models.RunnerOptions{Attention: attention}).Validate() == nil {
		return nil
	}
	if attention == "paged" {
		return fmt.Errorf("--attention paged is retired: the step graph (--attention %s, the default) runs every model Conveyor builds", models.AttentionGraph)
	}
	return fmt.Errorf("--attention %q: want %s or %s", attention, models.AttentionGraph, models.AttentionDense)
}

// flagTerms names the configuration fields that engine, scheduler and kvcache errors
// name as the flags and --speculative-config keys that set them.
var flagTerms = strings.NewReplacer(
	"Speculation.NumTokens", "num_speculative_tokens", "Speculation.MaxBatch", "disable_by_batch_size",
	"Speculation.LookupMin", "prompt_lookup_min", "LookupMax", "prompt_lookup_max",
	"MaxNumBatchedTokens", "--max-num-batched-tokens", "MaxNumSeqs", "--max-num-seqs", "MaxModelLen", "--max-model-len",
	"MaxBatchSize", "--max-batch-size", "MaxBatchDelay", "--max-batch-delay", "MaxQueue", "--max-queue",
	"KVCacheBytes", "--kv-cache-memory", "BlockSizeTokens", "--block-size",
)

// inFlagTerms is err with its message in flagTerms (errors.Is and As still see err).
func inFlagTerms(err error) error {
	if err == nil {
		return nil
	}
	return &flagTermsError{msg: flagTerms.Replace(err.Error()), err: err}
}

type flagTermsError struct {
	msg string
	err error
}

func (e *flagTermsError) Error() string { return e.msg }
func (e *flagTermsError) Unwrap() error { return e.err }

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// checkThreads checks a --threads value (the rule is RunnerOptions.Validate's).
func checkThreads(threads int) error {
	if (models.RunnerOptions{IntraOpThreads: threads}).Validate() != nil {
		return fmt.Errorf("--threads %d: want 0 (all cores) to %d (eight per core of this machine's %d)", threads, models.MaxIntraOpThreads(), runtime.NumCPU())
	}
	return nil
}

// checkDevice checks a --device value (the rule is RunnerOptions.Validate's).
func checkDevice(device string) error {
	if (models.RunnerOptions{Device: device}).Validate() != nil {
		return fmt.Errorf("--device %q: want %s, %s or %s", device, models.DeviceCPU, models.DeviceCUDA, models.DeviceAuto)
	}
	return nil
}

// loadedModel is a model loaded from the flags with its engine running: what `conveyor
// serve` and `conveyor run-batch` put behind an api.Server with SetBackend.
type loadedModel struct {
	dir          string // the built model directory
	runner       models.Model
	draft        models.Model // speculative decoding's draft model; nil: none
	eng          *engine.Engine
	stopEngine   context.CancelFunc
	backend      api.Backend
	quantization string
	start        time.Time // when loading began
}

// loadModel loads the model of the flags (load: a Hugging Face checkpoint is built
// first) and starts an engine configured by ecfg. Errors name the command (o.name()).
// The caller ends it with shutdown.
func (o *serveOptions) loadModel(log *slog.Logger, ecfg engine.Config) (*loadedModel, error) {
	log.Info("loading model", "dir", o.modelDir)
	start := time.Now()
	lo := loadOptions{
		quantize: o.quantize,
		dtype:    o.dtype,
		runner: models.RunnerOptions{ORTLib: o.ortLib, IntraOpThreads: o.threads, NoSpin: !o.spin, Attention: o.attention,
			KVCacheDType: o.kvCacheDType, Device: o.device, CUDAProvider: o.cudaProvider},
		built: func(src, dir string, took time.Duration) {
			log.Info("built the checkpoint's ONNX graph", "checkpoint", src, "dir", dir, "seconds", took.Seconds())
		},
		log: log,
	}
	l, err := load(o.modelDir, lo)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.name(), err)
	}
	var draft models.Model
	sc, err := parseSpeculativeConfig(o.speculative)
	if err == nil {
		lo.runner.Device = l.model.Device() // the draft runs where the model does
		draft, err = sc.loadDraft(l, lo)
	}
	if err != nil {
		l.model.Close()
		return nil, fmt.Errorf("%s: %w", o.name(), err)
	}
	if draft != nil {
		ecfg.DraftModel = draft
		log.Info("speculative decoding with a draft model", "draft", sc.draft, "device", draft.Device(), "attention", draft.Attention(),
			"num_speculative_tokens", sc.NumTokens)
	}
	m, err := o.startEngine(log, ecfg, l, start)
	if err != nil {
		if draft != nil {
			draft.Close()
		}
		l.model.Close()
		return nil, err
	}
	m.draft = draft
	return m, nil
}

// startEngine starts an engine configured by ecfg (its DraftModel set) over the loaded
// model l. Errors name the command; the caller closes the models on one.
func (o *serveOptions) startEngine(log *slog.Logger, ecfg engine.Config, l *loaded, start time.Time) (*loadedModel, error) {
	runner, tok, dir := l.model, l.tok, l.dir
	if o.gpuMemUtil > 0 {
		kv, err := gpuKVBudget(runner, o.gpuMemUtil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.name(), err)
		}
		ecfg.KVCacheBytes = kv
		log.Info("KV cache sized from GPU memory", "gpu_memory_utilization", o.gpuMemUtil, "kv_cache_bytes", kv)
	} else if err := checkGPUKV(runner, ecfg.KVCacheBytes); err != nil {
		return nil, fmt.Errorf("%s: %w", o.name(), err)
	}
	if !runner.Spec().KVOnDevice && o.mayServeOnGPU() { // auto chose the CPU: the cache is host memory
		if err := checkKVMemory(int64(o.kvCacheBytes), meminfoPath); err != nil {
			return nil, fmt.Errorf("%s: %w", o.name(), err)
		}
	}
	// After several failed forward passes in a row the engine reopens the model from its
	// directory (engine.Config.ReopenModel).
	ecfg.ReopenModel = func() (engine.Model, error) {
		m, err := l.reopen()
		if err != nil {
			return nil, err
		}
		return m, nil
	}
	eng, err := engine.New(ecfg, runner, tok)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.name(), inFlagTerms(err))
	}
	defaults, err := o.samplingDefaults(log, dir, eng.Limits())
	if err != nil {
		_ = eng.Close()
		return nil, fmt.Errorf("%s: %w", o.name(), err)
	}
	engCtx, stopEngine := context.WithCancel(context.Background())
	eng.Start(engCtx)
	quantization := l.quantization
	return &loadedModel{
		dir: dir, runner: runner, eng: eng, stopEngine: stopEngine, quantization: quantization, start: start,
		backend: api.Backend{Engine: eng, Tokenizer: openai.NewTokenizer(tok), MaxModelLen: eng.MaxModelLen(), Defaults: defaults,
			Quantization: quantization, KVCacheDType: runner.Spec().KVDType.String(),
			Formats: openai.NewFormats(tok, runner.Spec().VocabSize, eng.EOSTokenIDs()), ToolCallParser: o.toolCallParser,
			MaxPrompts: eng.MaxPrompts},
	}, nil
}

// logReady logs the "ready" line with what is being served; attrs come first (addr).
func (m *loadedModel) logReady(log *slog.Logger, o *serveOptions, modelName string, attrs ...any) {
	attrs = append(attrs, "model", modelName, "load_seconds", time.Since(m.start).Seconds(),
		"max_model_len", m.eng.MaxModelLen(), "kv_blocks", m.eng.NumKVBlocks(), "scheduler", o.scheduler, "device", m.runner.Device(), "attention", m.runner.Attention(),
		"kv_cache_dtype", m.runner.Spec().KVDType.String(), "quantization", m.quantization)
	log.Info("ready", append(attrs, kernelAttrs(m.runner.Attention(), m.runner.Device(), m.quantization)...)...)
}

// kernelAttrs names the instruction sets Conveyor's own kernels picked on this CPU for
// a model served on attentionPath on device with quantization: attention_isa for the
// step graph on the CPU (Conveyor's PagedAttention), and int8_isa when its int8 products
// run on Int8Linear.
func kernelAttrs(attentionPath, device, quantization string) []any {
	if attentionPath != models.AttentionGraph || device != models.DeviceCPU {
		return nil
	}
	attrs := []any{"attention_isa", kernels.PagedAttentionISA()}
	if quantization == "int8" {
		attrs = append(attrs, "int8_isa", kernels.Int8ISA())
	}
	return attrs
}

// shutdown lets the engine finish its live requests for up to grace, aborts the rest,
// stops the engine loop and closes the model.
func (m *loadedModel) shutdown(log *slog.Logger, grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := m.eng.Shutdown(ctx); err != nil {
		log.Warn("engine aborted remaining requests", "err", err)
	}
	m.stopEngine()
	m.runner.Close()
	if m.draft != nil {
		m.draft.Close()
	}
}
