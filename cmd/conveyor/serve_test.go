package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestServeFlagsDefaultsEnvAndPrecedence(t *testing.T) {
	o, err := parseServeFlags(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.host != "127.0.0.1" || o.port != 8000 || o.scheduler != "continuous" || int64(o.kvCacheBytes) != 1<<30 || o.modelName() != "default" ||
		o.device != "auto" || o.cudaProvider != "" {
		t.Fatalf("defaults: %+v", o)
	}
	e := env(map[string]string{
		"CONVEYOR_MAX_NUM_SEQS":      "64",
		"CONVEYOR_KV_CACHE_MEMORY":   "512MiB",
		"CONVEYOR_MAX_BATCH_DELAY":   "20ms",
		"CONVEYOR_SERVED_MODEL_NAME": "from-env",
		"CONVEYOR_NO_WEBUI":          "true",
		"CONVEYOR_PORT":              "9000",
		"CONVEYOR_DEVICE":            "cuda",
		"CONVEYOR_CUDA_PROVIDER":     "/p/libonnxruntime_providers_cuda.so",
	})
	o, err = parseServeFlags([]string{"--port", "9100", "--model", "/m/tiny"}, e, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.maxNumSeqs != 64 || int64(o.kvCacheBytes) != 512<<20 || o.maxBatchDelay != 20*time.Millisecond ||
		o.modelName() != "from-env" || !o.noWebUI || o.port != 9100 || o.device != "cuda" || o.cudaProvider != "/p/libonnxruntime_providers_cuda.so" {
		t.Fatalf("env/flags: %+v", o)
	}
	ec, err := o.engineConfig(nil)
	if err != nil || ec.MaxNumSeqs != 64 || ec.KVCacheBytes != 512<<20 {
		t.Fatalf("engine config %+v, %v", ec, err)
	}
}

func TestServeFlagErrorsAreOneLine(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--port", "abc"}, nil, "-port"},
		{[]string{"--port", "70000"}, nil, "--port"},
		{[]string{"--kv-cache-memory", "lots"}, nil, "kv-cache-memory"},
		{[]string{"--scheduler", "fifo"}, nil, "fifo"},
		{[]string{"--max-num-seqs", "0"}, nil, "--max-num-seqs 0 must be >= 1"},
		{[]string{"--max-num-seqs", "8", "--max-num-batched-tokens", "4"}, nil, "--max-num-batched-tokens 4 must be >= --max-num-seqs 8"},
		{[]string{"--threads", "100000"}, nil, "--threads 100000: want 0 (all cores) to"},
		{[]string{"--host", ""}, nil, "--host is empty"},
		{[]string{"--speculative-config", `{"method": "ngram", "num_speculative_tokens": 4} x`}, nil, "text after the JSON object"},
		{[]string{"--speculative-config", `{"method": "eagle"}`}, nil, `method "eagle" is not supported`},
		{[]string{"--speculative-config", `{"method": "ngram", "num_speculative_tokens": 65}`}, nil, "num_speculative_tokens 65"},
		{[]string{"--log-format", "xml"}, nil, "log-format"},
		{[]string{"--generation-config", "model"}, nil, "generation-config"},
		{[]string{"--attention", "flash"}, nil, "--attention"},
		{[]string{"--kv-cache-dtype", "int3"}, nil, "--kv-cache-dtype"},
		{[]string{"--device", "gpu"}, nil, `--device "gpu": want cpu, cuda or auto`},
		{nil, map[string]string{"CONVEYOR_DEVICE": "tpu"}, `--device "tpu"`},
		{[]string{"--target-step-time", "soon"}, nil, "--target-step-time"},
		{[]string{"--target-step-time", "-5ms"}, nil, "--target-step-time"},
		{[]string{"--shutdown-delay", "-1s"}, nil, "--shutdown-delay -1s must be >= 0"},
		{[]string{"--nope"}, nil, "nope"},
		{[]string{"extra"}, nil, "extra"},
		{nil, map[string]string{"CONVEYOR_THREADS": "many"}, "CONVEYOR_THREADS"},
	}
	for _, tc := range cases {
		var out bytes.Buffer
		_, err := parseServeFlags(tc.args, env(tc.env), &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: error %v, want one mentioning %q", tc.args, tc.env, err, tc.want)
		}
		if out.Len() != 0 {
			t.Errorf("%v: printed usage on a bad value: %q", tc.args, out.String())
		}
	}
	var stderr bytes.Buffer
	if code := runMain([]string{"serve", "--port", "abc"}, io.Discard, &stderr); code != 1 || strings.Count(stderr.String(), "\n") != 1 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestServeHelpDocumentsDefaultsAndUnits(t *testing.T) {
	var out bytes.Buffer
	_, err := parseServeFlags([]string{"-h"}, env(nil), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err %v", err)
	}
	for _, want := range []string{"CONVEYOR_MAX_NUM_SEQS", "(default 8000)", "(default 1GiB)", "MiB", "(default 50ms)", "--max-queue", "429"} {
		if !strings.Contains(out.String(), want) && !strings.Contains(out.String(), strings.TrimPrefix(want, "-")) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "512MiB": 512 << 20, "1GiB": 1 << 30, "1G": 1 << 30, "1.5g": 3 << 29,
		"500MB": 500e6, "64k": 64 << 10, "2 GiB": 2 << 30, "10b": 10} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1GiB", "1XB", "one"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) should fail", in)
		}
	}
	if s := formatBytes(512 << 20); s != "512MiB" {
		t.Errorf("formatBytes: %s", s)
	}
}

// startServe runs serve on the tiny model (served as "tiny", one thread, an 8 MiB KV
// cache, on a free port) with args added, and returns its address once it is ready, the
// cancel that stands for SIGTERM and the channel serve's result arrives on.
func startServe(t *testing.T, stdout, stderr io.Writer, args ...string) (string, context.CancelFunc, <-chan error) {
	t.Helper()
	o, err := parseServeFlags(append([]string{"--model", tinyModelDir(t), "--port", "0", "--ort-lib", testORTLib(t), "--threads", "1",
		"--kv-cache-memory", "8MiB", "--served-model-name", "tiny"}, args...), env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, o, stdout, stderr, ready) }()
	select {
	case addr := <-ready:
		return addr, cancel, done
	case err := <-done:
		cancel()
		t.Fatalf("serve returned early: %v", err)
		return "", nil, nil
	}
}

// TestServeLoadsServesAndDrains runs the whole command on the tiny model: /health turns
// 200 once loaded, a completion works, and cancelling the context (what SIGTERM does)
// drains and returns.
func TestServeLoadsServesAndDrains(t *testing.T) {
	var stdout, stderr bytes.Buffer
	addr, cancel, done := startServe(t, &stdout, &stderr, "--max-num-seqs", "8", "--max-num-batched-tokens", "128")
	defer cancel()
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/health: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"tiny","prompt":"Once upon a time","max_tokens":4,"temperature":0}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"completion_tokens":4`) {
		t.Fatalf("completion: %d %s", resp.StatusCode, body)
	}
	if !strings.Contains(stdout.String(), "curl") || !strings.Contains(stdout.String(), "http://"+addr) {
		t.Fatalf("banner: %q", stdout.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if !strings.Contains(stderr.String(), "msg=ready") || !strings.Contains(stderr.String(), " device=cpu ") {
		t.Errorf("the ready line does not name the device the model runs on:\n%s", stderr.String())
	}
	http.DefaultClient.CloseIdleConnections()
	if _, err := http.Get("http://" + addr + "/health"); err == nil {
		t.Fatal("still serving after shutdown")
	}
}

// TestServeShutdownDelay: after SIGTERM, --shutdown-delay keeps serving with /health at 503
// (over new connections too: the listener is still open), then drains and returns.
func TestServeShutdownDelay(t *testing.T) {
	var stderr bytes.Buffer
	addr, cancel, done := startServe(t, io.Discard, &stderr, "--shutdown-delay", "2s")
	defer cancel()
	cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var health int
	for range 100 { // the signal is seen at once; allow for a slow machine
		resp, err := client.Get("http://" + addr + "/health")
		if err != nil {
			t.Fatalf("/health during the shutdown delay: %v", err)
		}
		resp.Body.Close()
		if health = resp.StatusCode; health == 503 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if health != 503 {
		t.Fatalf("/health after SIGTERM: %d, want 503", health)
	}
	resp, err := client.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"tiny","prompt":"Once upon a time","max_tokens":2}`))
	if err != nil {
		t.Fatalf("completion during the shutdown delay: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("completion during the shutdown delay: %d", resp.StatusCode)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not return after the shutdown delay")
	}
	if _, err := client.Get("http://" + addr + "/health"); err == nil {
		t.Fatal("still listening after the drain")
	}
}

// TestServeStopsDuringLoad: SIGTERM while the model loads stops the server without
// waiting to serve first.
func TestServeStopsDuringLoad(t *testing.T) {
	lib := testORTLib(t)
	o, err := parseServeFlags([]string{"--model", tinyModelDir(t), "--port", "0", "--ort-lib", lib, "--threads", "1",
		"--kv-cache-memory", "8MiB"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ready := make(chan string, 1)
	// The abandoned load may still log after serve returns.
	var stderr lockedBuffer
	if err := serve(ctx, o, io.Discard, &stderr, ready); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if len(ready) != 0 || strings.Contains(stderr.String(), "msg=ready") {
		t.Fatalf("served after a SIGTERM during the load:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "shutting down while the model loads") {
		t.Fatalf("no shutdown line:\n%s", stderr.String())
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent writes and reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
