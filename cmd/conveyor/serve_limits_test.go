package main

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/models"
)

// TestServeHTTPLimitFlags: the header cap and the connection timeouts reach api.Config.
func TestServeHTTPLimitFlags(t *testing.T) {
	o, err := parseServeFlags([]string{"--max-header-bytes", "16KiB", "--read-header-timeout", "3s",
		"--idle-timeout", "45s", "--max-connections", "7", "--max-body-bytes-in-flight", "32MiB", "--body-read-timeout", "9s"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, err := o.apiConfig(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxHeaderBytes != 16<<10 || c.ReadHeaderTimeout != 3*time.Second || c.IdleTimeout != 45*time.Second || c.MaxConnections != 7 {
		t.Fatalf("api config: header %d, read-header %v, idle %v, connections %d", c.MaxHeaderBytes, c.ReadHeaderTimeout, c.IdleTimeout, c.MaxConnections)
	}
	if c.MaxBodyBytesInFlight != 32<<20 || c.BodyReadTimeout != 9*time.Second {
		t.Fatalf("api config: bodies in flight %d, body read timeout %v", c.MaxBodyBytesInFlight, c.BodyReadTimeout)
	}
	for _, args := range [][]string{{"--max-header-bytes", "0"}, {"--idle-timeout", "0s"}, {"--read-header-timeout", "0s"},
		{"--max-body-bytes-in-flight", "1MiB"}, {"--body-read-timeout", "0s"}, {"--max-connections", "0"}} {
		if _, err := parseServeFlags(args, env(nil), io.Discard); err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), args[0]+" ") {
			t.Errorf("%v: %v, want a one-line error naming %s", args, err, args[0])
		}
	}
}

func writeMeminfo(t *testing.T, availKB, totalKB int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "meminfo")
	text := "MemTotal:       " + strconv.Itoa(totalKB) + " kB\nMemFree:         1000 kB\nMemAvailable:   " + strconv.Itoa(availKB) + " kB\nSwapTotal: 0 kB\n"
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKVCacheMemoryOverAvailableRefused: a KV budget above MemAvailable is refused at
// start-up with one line that gives the numbers; one below it is accepted.
func TestKVCacheMemoryOverAvailableRefused(t *testing.T) {
	p := writeMeminfo(t, 2<<20, 8<<20) // 2 GiB available of 8 GiB
	if err := checkKVMemory(1<<30, p); err != nil {
		t.Fatalf("1GiB of 2GiB available: %v", err)
	}
	err := checkKVMemory(3<<30, p)
	if err == nil {
		t.Fatal("3GiB with 2GiB available was accepted")
	}
	msg := err.Error()
	for _, want := range []string{"--kv-cache-memory 3.0GiB", "MemAvailable 2.0GiB", "MemTotal 8.0GiB"} {
		if !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
			t.Errorf("error %q: want one line containing %q", msg, want)
		}
	}
	if err := checkKVMemory(1<<40, filepath.Join(t.TempDir(), "missing")); err != nil {
		t.Errorf("without meminfo: %v, want no check", err)
	}

	// Through the command: serve refuses before loading anything.
	old := meminfoPath
	meminfoPath = p
	defer func() { meminfoPath = old }()
	_, err = parseServeFlags([]string{"--kv-cache-memory", "4GiB"}, env(nil), io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "serve: --kv-cache-memory 4.0GiB is more than the memory available") {
		t.Fatalf("serve --kv-cache-memory 4GiB with 2GiB available: %v", err)
	}
	if _, err := parseServeFlags([]string{"--kv-cache-memory", "512MiB"}, env(nil), io.Discard); err != nil {
		t.Fatalf("serve --kv-cache-memory 512MiB: %v", err)
	}
	// On the GPU the budget is GPU memory: the host's says nothing about it.
	if _, err := parseServeFlags([]string{"--kv-cache-memory", "4GiB", "--device", "cuda"}, env(nil), io.Discard); err != nil {
		t.Fatalf("serve --device cuda --kv-cache-memory 4GiB with 2GiB of host memory available: %v", err)
	}
}

// TestGPUMemoryUtilization: the fraction is checked, refused on the CPU, and turned into
// a KV budget from the GPU's figures with the weights loaded.
func TestGPUMemoryUtilization(t *testing.T) {
	for _, args := range [][]string{
		{"--gpu-memory-utilization", "1.5"}, {"--gpu-memory-utilization", "-0.1"},
		{"--gpu-memory-utilization", "0.9", "--device", "cpu"},
	} {
		if _, err := parseServeFlags(args, env(nil), io.Discard); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want a one-line error", args, err)
		}
	}
	if _, err := parseServeFlags([]string{"--gpu-memory-utilization", "0.9", "--device", "cuda"}, env(nil), io.Discard); err != nil {
		t.Errorf("--gpu-memory-utilization 0.9 --device cuda: %v", err)
	}

	const gib = int64(1) << 30
	gpu := &fakeGPUModel{free: 78 * gib, total: 80 * gib} // 2 GiB of weights loaded
	kv, err := gpuKVBudget(gpu, 0.9)
	if want := int64(0.9*float64(80*gib)) - 2*gib - 4*gib; err != nil || kv != want {
		t.Errorf("budget at 0.9 of 80 GiB with 2 GiB used: %d, %v; want %d (4 GiB kept for activations)", kv, err, want)
	}
	if _, err := gpuKVBudget(gpu, 0.05); err == nil || !strings.Contains(err.Error(), "leaves no room") {
		t.Errorf("a fraction below what is in use: %v", err)
	}
	// An explicit --kv-cache-memory must fit in what is free, the activations' reserve kept.
	if err := checkGPUKV(gpu, 70*gib); err != nil {
		t.Errorf("70 GiB of cache with 78 GiB free: %v", err)
	}
	if err := checkGPUKV(gpu, 75*gib); err == nil || strings.Contains(err.Error(), "\n") ||
		!strings.Contains(err.Error(), "--kv-cache-memory 75.0GiB does not fit") || !strings.Contains(err.Error(), "--gpu-memory-utilization") {
		t.Errorf("75 GiB of cache with 78 GiB free and 4 GiB kept: %v, want one line naming both flags", err)
	}
	gpu.onHost = true
	if _, err := gpuKVBudget(gpu, 0.9); err == nil || !strings.Contains(err.Error(), "--device cuda") {
		t.Errorf("a model on the CPU: %v", err)
	}
	if err := checkGPUKV(gpu, 1000*gib); err != nil {
		t.Errorf("a model on the CPU is not checked against GPU memory: %v", err)
	}
}

// fakeGPUModel reports GPU memory figures; nothing else of it is used.
type fakeGPUModel struct {
	models.Model
	free, total int64
	onHost      bool
}

func (m *fakeGPUModel) Spec() models.Spec { return models.Spec{KVOnDevice: !m.onHost} }
func (m *fakeGPUModel) Device() string    { return "cuda:0 (test)" }
func (m *fakeGPUModel) DeviceMemory() (free, total int64, err error) {
	return m.free, m.total, nil
}

// TestDTypeFlag: --dtype takes auto, float16 and bfloat16, refuses anything else and a
// 16-bit type on the CPU with one line, and is accepted for the GPU or auto.
func TestDTypeFlag(t *testing.T) {
	for _, args := range [][]string{
		{"--dtype", "float32"}, {"--dtype", "half"}, {"--dtype", "bfloat16", "--device", "cpu"},
	} {
		if _, err := parseServeFlags(args, env(nil), io.Discard); err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "--dtype") {
			t.Errorf("%v: %v, want a one-line error naming --dtype", args, err)
		}
	}
	for _, args := range [][]string{{"--dtype", "bfloat16", "--device", "cuda"}, {"--dtype", "float16"}, {"--dtype", "auto", "--device", "cpu"}} {
		if _, err := parseServeFlags(args, env(nil), io.Discard); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestSpeculativeConfigFlag: --speculative-config takes vLLM's ngram and draft_model
// JSON and refuses anything else with one line naming the flag.
func TestSpeculativeConfigFlag(t *testing.T) {
	dir := t.TempDir()
	for _, bad := range []string{`{"method": "draft_model", "model": "/no/such/draft", "num_speculative_tokens": 4}`, `{"method": "ngram"}`,
		`{"method": "draft_model", "num_speculative_tokens": 4}`, `{"method": "eagle", "num_speculative_tokens": 4}`,
		`{"method": "draft_model", "model": "` + dir + `", "num_speculative_tokens": 4, "prompt_lookup_max": 3}`,
		`{"method": "draft_model", "model": "` + dir + `", "num_speculative_tokens": 4, "quantization": "int3"}`,
		`{"method": "ngram", "model": "` + dir + `", "num_speculative_tokens": 4}`,
		`{"method": "ngram", "num_speculative_tokens": 0}`, `{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2}`,
		`{"method": "ngram", "num_speculative_tokens": 4, "colour": "red"}`, `not json`} {
		if _, err := parseServeFlags([]string{"--speculative-config", bad}, env(nil), io.Discard); err == nil ||
			strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "--speculative-config") {
			t.Errorf("%s: %v, want a one-line error naming --speculative-config", bad, err)
		}
	}
	sp, err := parseSpeculativeConfig(`{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}`)
	if err != nil || sp.NumTokens != 4 || sp.LookupMin != 2 || sp.LookupMax != 4 || sp.MaxBatch != defaultSpecMaxBatch || sp.External || sp.draft != "" {
		t.Errorf("ngram config: %+v, %v", sp, err)
	}
	sp, err = parseSpeculativeConfig(`{"method": "draft_model", "model": "` + dir + `", "num_speculative_tokens": 3, "quantization": "int4", "disable_by_batch_size": 2}`)
	if err != nil || sp.NumTokens != 3 || !sp.External || sp.draft != dir || sp.draftQuantize != "int4" || sp.MaxBatch != 2 {
		t.Errorf("draft_model config: %+v, %v", sp, err)
	}
}

// TestDTypeRefusedForBuiltDirectory: --dtype asks how a checkpoint is built; for a built
// directory, which is served as it was built, it is refused with one line, not ignored.
func TestDTypeRefusedForBuiltDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "model.onnx"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := load(dir, loadOptions{dtype: "bfloat16", runner: models.RunnerOptions{Device: models.DeviceCUDA}})
	if err == nil || !strings.Contains(err.Error(), "--dtype bfloat16 applies to Hugging Face checkpoints") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("%v; want one line refusing --dtype", err)
	}
}
