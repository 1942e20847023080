package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/ort"
)

func TestBenchCompareFlagErrors(t *testing.T) {
	err := runBenchCompare([]string{"--attention", "flash", "--model", t.TempDir(), "--out", t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "--attention") {
		t.Errorf("bench compare --attention flash: %v, want an error naming --attention", err)
	}
}

// TestBenchHelperFakeServe is not a test: it is the `conveyor serve` that fakeServeExe
// starts for the bench compare tests, run in a child process (BENCH_FAKE_SERVE names its
// behaviour). It records its arguments and environment in $BENCH_FAKE_RECORD, listens on
// the --port it was given, answers /health, has no /metrics and, like serve, refuses
// requests without the key when $CONVEYOR_API_KEY is set. Otherwise every request streams
// one completion token ("ok"), is refused ("refuse"), or sends SIGINT to its parent, the
// bench, and waits ("interrupt"). It runs until bench stops it with SIGTERM.
func TestBenchHelperFakeServe(t *testing.T) {
	mode := os.Getenv("BENCH_FAKE_SERVE")
	if mode == "" {
		t.Skip("the fake server of the bench compare tests; it runs only as their child")
	}
	args := flag.Args()
	if rec := os.Getenv("BENCH_FAKE_RECORD"); rec != "" {
		b, _ := json.Marshal(fakeServeRecord{Args: args, Env: os.Environ()})
		if err := os.WriteFile(rec, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	port := ""
	for i, a := range args {
		if a == "--port" && i+1 < len(args) {
			port = args[i+1]
		}
	}
	var once sync.Once
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("/metrics", http.NotFound)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if key := os.Getenv("CONVEYOR_API_KEY"); key != "" && r.Header.Get("Authorization") != "Bearer "+key {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error": {"message": "invalid API key"}}`)
			return
		}
		switch mode {
		case "ok":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\": [{\"text\": \"a\"}]}\n\ndata: {\"choices\": [], \"usage\": {\"completion_tokens\": 1}}\n\ndata: [DONE]\n\n")
		case "interrupt":
			io.Copy(io.Discard, r.Body) // then a client that leaves ends r.Context()
			once.Do(func() { syscall.Kill(os.Getppid(), syscall.SIGINT) })
			<-r.Context().Done()
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error": {"message": "the fake server refuses"}}`)
		}
	})
	t.Fatal(http.ListenAndServe("127.0.0.1:"+port, mux))
}

// fakeServeRecord is what the fake server was started with.
type fakeServeRecord struct {
	Args []string `json:"args"`
	Env  []string `json:"env"`
}

// readServeRecord reads what the fake server recorded in path.
func readServeRecord(t *testing.T, path string) fakeServeRecord {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec fakeServeRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// fakeServeExe makes bench compare and bench soak start TestBenchHelperFakeServe in mode
// instead of `conveyor serve`, through a script that runs this test binary; it returns the
// file the fake records its arguments and environment in. CONVEYOR_ORT_LIB points at no
// library, so that the report's machine line leaves this process's ONNX Runtime unloaded.
func fakeServeExe(t *testing.T, mode string) (record string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	record = filepath.Join(dir, "record.json")
	script := fmt.Sprintf("#!/bin/sh\nBENCH_FAKE_SERVE=%s BENCH_FAKE_RECORD='%s' exec '%s' -test.run='^TestBenchHelperFakeServe$' -- \"$@\"\n", mode, record, self)
	exe := filepath.Join(dir, "fake-conveyor")
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	saved := serveExecutable
	serveExecutable = func() (string, error) { return exe, nil }
	t.Cleanup(func() { serveExecutable = saved })
	t.Setenv(models.ORTLibEnv, filepath.Join(dir, "no-libonnxruntime.so"))
	return record
}

// runCompareQuietly runs `conveyor bench compare` with a one-request workload at one rate
// and returns its exit code and stderr; its stdout (the per-run lines) is discarded.
func runCompareQuietly(t *testing.T, out string, extra ...string) (int, string) {
	t.Helper()
	stdout := os.Stdout
	os.Stdout, _ = os.Open(os.DevNull)
	defer func() { os.Stdout = stdout }()
	args := append([]string{"bench", "compare", "--model", t.TempDir(), "--out", out, "--policies", "continuous", "--rates", "inf",
		"--num-requests", "2", "--dataset", "fixed", "--input-len", "4", "--output-len", "1", "--threads", "1", "--device", "cpu"}, extra...)
	var o, e bytes.Buffer
	code := runMain(args, &o, &e)
	return code, e.String()
}

// TestBenchCompareServerEnvironment: the started servers do not see the bench's CONVEYOR_*
// settings (a CONVEYOR_API_KEY would have them refuse every request, unseen in the
// report), keep CONVEYOR_CACHE_DIR, and get the ONNX Runtime library and CUDA provider as
// flags, which the report's server flags show.
func TestBenchCompareServerEnvironment(t *testing.T) {
	record := fakeServeExe(t, "ok")
	lib := os.Getenv(models.ORTLibEnv)
	cache := t.TempDir()
	t.Setenv("CONVEYOR_API_KEY", "sk-server-key")
	t.Setenv("CONVEYOR_MAX_NUM_SEQS", "1")
	t.Setenv("CONVEYOR_CACHE_DIR", cache)
	t.Setenv(ort.CUDAProviderEnv, "/opt/cuda/libonnxruntime_providers_cuda.so")
	out := filepath.Join(t.TempDir(), "out")
	if code, stderr := runCompareQuietly(t, out); code != 0 {
		t.Fatalf("bench compare: exit %d: %s", code, stderr)
	}
	rec := readServeRecord(t, record)
	var conveyorEnv []string
	for _, kv := range rec.Env {
		if strings.HasPrefix(kv, "CONVEYOR_") {
			conveyorEnv = append(conveyorEnv, kv)
		}
	}
	if want := []string{"CONVEYOR_CACHE_DIR=" + cache}; !slices.Equal(conveyorEnv, want) {
		t.Errorf("server environment has %q, want only %q", conveyorEnv, want)
	}
	args := strings.Join(rec.Args, " ")
	for _, want := range []string{"--ort-lib " + lib, "--cuda-provider /opt/cuda/libonnxruntime_providers_cuda.so"} {
		if !strings.Contains(args, want) {
			t.Errorf("server args %q lack %q", args, want)
		}
	}
	report, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(report), "--ort-lib "+lib) || strings.Contains(string(report), "sk-server-key") {
		t.Errorf("report's server flags do not show --ort-lib, or show the key:\n%s", report)
	}
}

// TestBenchCompareFailsWhenNoneCompleted: a sweep in which no request of any run completed
// writes its report and exits 1 with one line naming the failure, as bench does.
func TestBenchCompareFailsWhenNoneCompleted(t *testing.T) {
	fakeServeExe(t, "refuse")
	out := filepath.Join(t.TempDir(), "out")
	code, stderr := runCompareQuietly(t, out)
	want := "conveyor: bench compare: no request completed in any run (2 failed; the most frequent failure, 2 times: HTTP 503: the fake server refuses); report written to " + filepath.Join(out, "report.md") + "\n"
	if code != 1 || stderr != want {
		t.Errorf("exit %d, stderr %q; want 1, %q", code, stderr, want)
	}
	if _, err := os.Stat(filepath.Join(out, "report.md")); err != nil {
		t.Errorf("no report: %v", err)
	}
}

// TestBenchCompareInterrupted: Ctrl-C during a sweep says it was interrupted (not
// "context canceled"), writes no report and exits 1.
func TestBenchCompareInterrupted(t *testing.T) {
	fakeServeExe(t, "interrupt")
	out := filepath.Join(t.TempDir(), "out")
	code, stderr := runCompareQuietly(t, out, "--rates", "inf,1")
	want := "conveyor: bench compare: interrupted after 0 of 2 runs; no report written\n"
	if code != 1 || stderr != want {
		t.Errorf("exit %d, stderr %q; want 1, %q", code, stderr, want)
	}
	if _, err := os.Stat(filepath.Join(out, "report.md")); !os.IsNotExist(err) {
		t.Errorf("an interrupted sweep wrote a report: %v", err)
	}
}

func TestServeEnv(t *testing.T) {
	got := serveEnv([]string{"PATH=/bin", "CONVEYOR_API_KEY=x", "CONVEYOR_ORT_LIB=/l.so", "CONVEYOR_CACHE_DIR=/c", "HOME=/h", "CONVEYOR_ORT_PROFILE=p", "XCONVEYOR_Y=1"})
	if want := []string{"PATH=/bin", "CONVEYOR_CACHE_DIR=/c", "HOME=/h", "XCONVEYOR_Y=1"}; !slices.Equal(got, want) {
		t.Errorf("serveEnv = %q, want %q", got, want)
	}
	flags := serveEnvFlags(env(map[string]string{models.ORTLibEnv: "/l.so", ort.CUDAProviderEnv: "/p.so", "CONVEYOR_API_KEY": "x"}))
	if want := []string{"--ort-lib", "/l.so", "--cuda-provider", "/p.so"}; !slices.Equal(flags, want) {
		t.Errorf("serveEnvFlags = %q, want %q", flags, want)
	}
}
