package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/conveyor-llm/conveyor/bench"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/ort"
)

// runBenchCompare starts `conveyor serve` once per scheduling policy on 127.0.0.1 and
// runs the same workload against each at a sweep of request rates.
func runBenchCompare(args []string) error {
	fs := flag.NewFlagSet("bench compare", flag.ContinueOnError)
	model := fs.String("model", "models/default", "model directory every server serves")
	out := fs.String("out", "docs/benchmarks", "directory for report.md and the PNG charts")
	pols := fs.String("policies", "continuous,static,sequential", "scheduling policies to compare")
	rates := fs.String("rates", "0.5,1,2,4,8", "request rates in requests/s (comma-separated)")
	burst := fs.Float64("burstiness", 1, "gamma shape of inter-arrival times: 1 = Poisson")
	slo := fs.String("slo", "ttft=2000,tpot=100", "goodput objective (milliseconds)")
	threads := fs.Int("threads", runtime.NumCPU(), "ONNX Runtime intra-op threads of every server")
	kv := fs.String("kv-cache-memory", "256MiB", "KV-cache budget of every server")
	batch := fs.Int("max-batch-size", 8, "static policy: batch size (TorchServe batchSize)")
	delay := fs.Duration("max-batch-delay", 100*time.Millisecond, "static policy: longest wait for a full batch (TorchServe maxBatchDelay)")
	maxSeqs := fs.Int("max-num-seqs", 64, "continuous policy: sequences per step at most")
	attention := fs.String("attention", "", "attention path of every server: graph or dense (default: the server's, graph when the model has a step graph)")
	var device, cudaProvider string
	deviceFlags(fs, &device, &cudaProvider)
	speculative := fs.String("speculative-config", "", `speculative decoding of every server, as serve's (vLLM's JSON: {"method": "ngram", "num_speculative_tokens": 4} or {"method": "draft_model", "model": DIR, "num_speculative_tokens": 4}); "" = off`)
	logDir := fs.String("server-log", "", "file to append the servers' logs to (default: discard)")
	notes := fs.String("notes", "", "Markdown file whose text the report ends with (under \"Notes\")")
	workload := workloadFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: conveyor bench compare [flags]\n\nflags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	wc, err := workload()
	if err != nil {
		return err
	}
	objective, err := parseSLO(*slo)
	if err != nil {
		return err
	}
	rateList, err := parseRates(*rates)
	if err != nil {
		return fmt.Errorf("bench compare: %v", err)
	}
	if err := checkBurstiness(*burst); err != nil {
		return fmt.Errorf("bench compare: %v", err)
	}
	policies := strings.Split(*pols, ",")
	for _, p := range policies {
		if p != "continuous" && p != "static" && p != "sequential" {
			return fmt.Errorf("--policies: unknown policy %q (continuous, static, sequential)", p)
		}
	}
	var noteText []byte
	if *notes != "" {
		if noteText, err = os.ReadFile(*notes); err != nil {
			return fmt.Errorf("--notes: %w", err)
		}
	}
	exe, err := serveExecutable()
	if err != nil {
		return err
	}
	serverFlags := []string{
		"--model", *model, "--threads", strconv.Itoa(*threads), "--kv-cache-memory", *kv,
		"--max-batch-size", strconv.Itoa(*batch), "--max-batch-delay", delay.String(),
		"--max-num-seqs", strconv.Itoa(*maxSeqs), "--max-queue", "100000",
	}
	if *attention != "" {
		if err := checkAttention(*attention); err != nil {
			return err
		}
		serverFlags = append(serverFlags, "--attention", *attention)
	}
	if err := checkDevice(device); err != nil {
		return err
	}
	serverFlags = append(serverFlags, "--device", device)
	if *speculative != "" {
		if _, err := parseSpeculativeConfig(*speculative); err != nil {
			return fmt.Errorf("bench compare: %v", err)
		}
		serverFlags = append(serverFlags, "--speculative-config", *speculative)
	}
	// The servers do not see this process's CONVEYOR_* variables (serveEnv): what locates
	// ONNX Runtime is passed as flags instead, so that the report's server flags say it.
	if cudaProvider == "" {
		cudaProvider = os.Getenv(ort.CUDAProviderEnv)
	}
	if cudaProvider != "" {
		serverFlags = append(serverFlags, "--cuda-provider", cudaProvider)
	}
	if lib := os.Getenv(models.ORTLibEnv); lib != "" {
		serverFlags = append(serverFlags, "--ort-lib", lib)
	}
	logw, closeLog, err := openServerLog(*logDir)
	if err != nil {
		return fmt.Errorf("bench compare: %w", err)
	}
	defer closeLog()
	if err := prepareOutDir(*out); err != nil {
		return fmt.Errorf("bench compare: --out: %w", err)
	}
	ctx, stop := notifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := func(ctx context.Context, policy string) (bench.Server, error) {
		return startServer(ctx, exe, append([]string{"--scheduler", policy}, serverFlags...), logw)
	}
	points, err := bench.Compare(ctx, bench.CompareConfig{
		Policies: policies, Rates: rateList, Workload: wc, Burstiness: *burst, SLO: objective,
		Model: "default", Start: start, Log: os.Stdout,
	})
	if ctx.Err() != nil {
		// Whatever Compare returned (a server that did not start, or none), the sweep was
		// cut short: its last run counts requests that were never sent.
		return fmt.Errorf("bench compare: interrupted after %d of %d runs; no report written", finishedRuns(points), len(policies)*len(rateList))
	}
	if err != nil {
		return err
	}
	meta := bench.ReportMeta{
		Command: "conveyor bench compare " + strings.Join(args, " "),
		Machine: machineDescription(device),
		Model:   modelDescription(*model),
		Server:  serverFlags,
		Load:    fmt.Sprintf("%s; Poisson arrivals (gamma burstiness %g); streaming, ignore_eos", wc, *burst),
		Date:    time.Now().UTC().Format("2006-01-02"),
		Notes:   string(noteText),
	}
	werr := bench.WriteReport(*out, meta, points)
	if werr != nil && !errors.Is(werr, bench.ErrChart) {
		return fmt.Errorf("bench compare: %w", werr)
	}
	if h, ok := bench.Headline(points); ok {
		fmt.Println(strings.Trim(h, "*"))
	}
	fmt.Printf("report: %s\n", filepath.Join(*out, "report.md"))
	if err := noneCompletedInAny(points, filepath.Join(*out, "report.md")); err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("bench compare: report written, but %w", werr)
	}
	return nil
}

// serveExecutable is the conveyor binary that bench compare and bench soak start as
// `conveyor serve`: this one (tests replace it).
var serveExecutable = os.Executable

// openServerLog opens --server-log for appending before anything runs; "" discards the
// servers' logs. The error names the flag.
func openServerLog(path string) (io.Writer, func(), error) {
	if path == "" {
		return io.Discard, func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("--server-log: %w", err)
	}
	return f, func() { f.Close() }, nil
}

// finishedRuns counts the runs of an interrupted sweep that ran to their end. Compare
// stops after the run the interrupt came in, so only the last can be cut short: it is when
// requests were left unsent or ended by the cancelled context.
func finishedRuns(points []bench.Point) int {
	if len(points) == 0 {
		return 0
	}
	for msg := range points[len(points)-1].Report.Errors {
		if strings.HasPrefix(msg, notSentPrefix) || strings.Contains(msg, context.Canceled.Error()) {
			return len(points) - 1
		}
	}
	return len(points)
}

// noneCompletedInAny is bench compare's error when not one request of any run completed
// (a server that refuses every request measures nothing), as noneCompleted is bench's; the
// report is written first, and the error names the most frequent failure.
func noneCompletedInAny(points []bench.Point, report string) error {
	failed, errs := 0, map[string]int{}
	for _, p := range points {
		if p.Report.Completed > 0 {
			return nil
		}
		failed += p.Report.Failed
		for msg, n := range p.Report.Errors {
			errs[msg] += n
		}
	}
	if len(points) == 0 {
		return nil
	}
	common, most := "", 0
	for msg, n := range errs {
		if n > most || n == most && msg < common {
			common, most = msg, n
		}
	}
	if common == "" {
		return fmt.Errorf("bench compare: no request completed in any run (%d failed); report written to %s", failed, report)
	}
	return fmt.Errorf("bench compare: no request completed in any run (%d failed; the most frequent failure, %d times: %s); report written to %s", failed, most, common, report)
}

// serveEnv is the environment of a started `conveyor serve`: this process's, without its
// CONVEYOR_* variables. serve reads every flag from CONVEYOR_<FLAG> (and ONNX Runtime
// reads a few more), so a CONVEYOR_API_KEY or CONVEYOR_MAX_NUM_SEQS left in the shell
// would change the servers under test (every request refused, or another batch size)
// without the report's server flags showing it. Only CONVEYOR_CACHE_DIR is kept: it is
// where a Hugging Face checkpoint given as --model was built to ONNX, and changes where the
// server finds the model, not how it serves it. The ONNX Runtime library and CUDA provider
// ($CONVEYOR_ORT_LIB, $CONVEYOR_ORT_CUDA_PROVIDER) are passed as --ort-lib and
// --cuda-provider instead, where the report shows them (serveEnvFlags).
func serveEnv(environ []string) []string {
	env := make([]string, 0, len(environ))
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "CONVEYOR_") && name != convert.CacheDirEnv {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// serveEnvFlags returns the flags that stand for the CONVEYOR_* variables serveEnv drops
// and the server needs to start as this process would: --ort-lib $CONVEYOR_ORT_LIB and
// --cuda-provider $CONVEYOR_ORT_CUDA_PROVIDER, each when set.
func serveEnvFlags(getenv func(string) string) []string {
	var flags []string
	if v := getenv(models.ORTLibEnv); v != "" {
		flags = append(flags, "--ort-lib", v)
	}
	if v := getenv(ort.CUDAProviderEnv); v != "" {
		flags = append(flags, "--cuda-provider", v)
	}
	return flags
}

// startServer runs `conveyor serve` on a free loopback port and waits for /health.
func startServer(ctx context.Context, exe string, flags []string, logw io.Writer) (bench.Server, error) {
	p, err := startServeProcess(ctx, exe, append([]string{"--served-model-name", "default"}, flags...), logw, 2*time.Minute)
	if err != nil {
		return bench.Server{}, err
	}
	return bench.Server{BaseURL: p.base, Stop: func() error { p.stop(); return nil }}, nil
}

// servedProcess is a `conveyor serve` child process: its address, its pid (bench soak
// reads its RSS from /proc) and how to stop it (SIGTERM, then SIGKILL after 30 s).
type servedProcess struct {
	base string
	pid  int
	stop func()
}

// startServeProcess runs `exe serve` with flags on a free loopback port, in serveEnv's
// environment (no CONVEYOR_* settings: flags alone say how it serves), and waits up to
// wait for /health to answer 200. A server that exits or never becomes healthy is an error
// that ends with the last lines it wrote to stderr (its own error, for a bad flag or model).
func startServeProcess(ctx context.Context, exe string, flags []string, logw io.Writer, wait time.Duration) (*servedProcess, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args := append([]string{"serve", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--no-webui"}, flags...)
	cmd := exec.Command(exe, args...)
	cmd.Env = serveEnv(os.Environ())
	tail := &stderrTail{}
	cmd.Stdout, cmd.Stderr = logw, io.MultiWriter(logw, tail)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	p := &servedProcess{base: fmt.Sprintf("http://127.0.0.1:%d", port), pid: cmd.Process.Pid}
	p.stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("conveyor serve exited early (%v)%s", err, tail.said())
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		resp, err := http.Get(p.base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
	}
	p.stop()
	return nil, fmt.Errorf("conveyor serve did not become healthy within %v%s", wait, tail.said())
}

// stderrTail keeps the end of a child process's stderr, for the error that says why it
// stopped.
type stderrTail struct {
	mu  sync.Mutex
	buf []byte // the last stderrTailBytes bytes written
}

const (
	stderrTailBytes = 4096 // kept of the stream
	stderrSaidBytes = 400  // quoted in an error at most
	stderrSaidLines = 2    // non-empty lines quoted at most
)

func (t *stderrTail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - stderrTailBytes; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

// said returns ": " and what the process last said: its error line when its stderr ends
// with one (runMain's "conveyor: ..."), else its last non-empty lines joined with " | ";
// cut to stderrSaidBytes, keeping the end. It is "" when nothing was written.
func (t *stderrTail) said() string {
	t.mu.Lock()
	lines := strings.Split(string(t.buf), "\n")
	t.mu.Unlock()
	var last []string
	for i := len(lines) - 1; i >= 0 && len(last) < stderrSaidLines; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			last = append([]string{l}, last...)
		}
	}
	if len(last) > 0 && strings.HasPrefix(last[len(last)-1], "conveyor: ") {
		last = last[len(last)-1:]
	}
	if len(last) == 0 {
		return ""
	}
	s := strings.Join(last, " | ")
	if len(s) > stderrSaidBytes {
		s = "…" + strings.ToValidUTF8(s[len(s)-stderrSaidBytes:], "")
	}
	return ": " + s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// machineDescription names the cores, the CPU model (from /proc/cpuinfo where there is
// one), the ONNX Runtime build the servers run on and the device they were asked for.
func machineDescription(device string) string {
	cpu := runtime.GOOS + "/" + runtime.GOARCH
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v) + ", " + cpu
				break
			}
		}
	}
	ortVersion := "(not loaded)"
	if models.InitORT("") == nil {
		ortVersion = models.ORTVersion()
	}
	return fmt.Sprintf("%d cores (%s), ONNX Runtime %s, --device %s", runtime.NumCPU(), cpu, ortVersion, device)
}
