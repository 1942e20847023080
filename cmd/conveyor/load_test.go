package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/kernels"
)

// TestKernelAttrs: the ready line names the attention kernel's instruction set for the
// step graph on the CPU only, and the int8 kernel's only for int8 models (whose products
// run on it).
func TestKernelAttrs(t *testing.T) {
	for _, tc := range []struct {
		path, device, quant string
		want                []any
	}{
		{models.AttentionGraph, models.DeviceCPU, "int8", []any{"attention_isa", kernels.PagedAttentionISA(), "int8_isa", kernels.Int8ISA()}},
		{models.AttentionGraph, models.DeviceCPU, "int4", []any{"attention_isa", kernels.PagedAttentionISA()}},
		{models.AttentionGraph, models.DeviceCPU, "none", []any{"attention_isa", kernels.PagedAttentionISA()}},
		{models.AttentionGraph, "cuda:0 (NVIDIA H200)", "int4", nil},
		{models.AttentionDense, models.DeviceCPU, "int8", nil},
	} {
		if got := kernelAttrs(tc.path, tc.device, tc.quant); !slices.Equal(got, tc.want) {
			t.Errorf("%s %s %s: %v, want %v", tc.path, tc.device, tc.quant, got, tc.want)
		}
	}
}

// TestLoad: a model directory opens as it is; a Hugging Face checkpoint is built once
// into the cache (and load says so), then opened from there.
func TestLoad(t *testing.T) {
	ropts := models.RunnerOptions{ORTLib: testORTLib(t), IntraOpThreads: 1, Device: models.DeviceCPU}
	dir := tinyModelDir(t)
	l, err := load(dir, loadOptions{runner: ropts, built: func(string, string, time.Duration) { t.Error("a model directory was built") }})
	if err != nil {
		t.Fatal(err)
	}
	if l.dir != dir || l.tok == nil || l.model.Spec().VocabSize == 0 || l.model.Device() != models.DeviceCPU {
		t.Errorf("loaded %+v", l)
	}
	again, err := l.reopen()
	if err != nil {
		t.Fatal(err)
	}
	again.Close()
	l.model.Close()

	t.Setenv(convert.CacheDirEnv, t.TempDir())
	ckpt := t.TempDir()
	if _, err := convert.WriteRandomCheckpoint(filepath.Join("..", "..", "models", "testdata", "tiny-llama", "config.json"), ckpt, 3); err != nil {
		t.Fatal(err)
	}
	var builtDir string
	l, err = load(ckpt, loadOptions{quantize: "int8", runner: ropts, built: func(_, d string, _ time.Duration) { builtDir = d }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.model.Close()
	if builtDir == "" || l.dir != builtDir || l.quantization != "int8" {
		t.Errorf("checkpoint: built into %q, opened %q, weights %q; want the built int8 directory opened", builtDir, l.dir, l.quantization)
	}
	// A cached build damaged since (a truncated graph) is built again, once, not refused
	// at every start.
	if err := os.Truncate(filepath.Join(builtDir, "step", "step.onnx"), 1000); err != nil {
		t.Fatal(err)
	}
	rebuilt := ""
	l2, err := load(ckpt, loadOptions{quantize: "int8", runner: ropts, built: func(_, d string, _ time.Duration) { rebuilt = d }})
	if err != nil {
		t.Fatalf("a damaged cached build: %v", err)
	}
	l2.model.Close()
	if rebuilt != builtDir {
		t.Errorf("the damaged cached build was not built again (built %q)", rebuilt)
	}

	if _, err := load(dir, loadOptions{quantize: "int3", runner: ropts}); err == nil || !strings.HasPrefix(err.Error(), "--quantize") {
		t.Errorf("--quantize int3: %v", err)
	}
	if _, err := load(dir, loadOptions{runner: models.RunnerOptions{Device: "gpu"}}); err == nil {
		t.Error("device gpu loaded")
	}
}

// TestCheckDevice: --device takes cpu, cuda, auto (and "", auto); anything else is one
// line naming the flag.
func TestCheckDevice(t *testing.T) {
	for _, d := range []string{"", "cpu", "cuda", "auto"} {
		if err := checkDevice(d); err != nil {
			t.Errorf("checkDevice(%q): %v", d, err)
		}
	}
	if err := checkDevice("gpu"); err == nil || strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), `--device "gpu"`) {
		t.Errorf("checkDevice(gpu): %v", err)
	}
}

// TestLoadOnAMissingGPUSaysSoFirst: with --device cuda and no usable GPU, loading says
// what is missing (the provider, the driver, the device), not what the model directory
// would need on a GPU.
func TestLoadOnAMissingGPUSaysSoFirst(t *testing.T) {
	opts := models.RunnerOptions{Device: models.DeviceCUDA}
	want := models.CUDAUnavailable(opts)
	if want == nil {
		t.Skip("a GPU is usable here")
	}
	_, err := load(t.TempDir(), loadOptions{runner: opts})
	if err == nil || err.Error() != want.Error() {
		t.Fatalf("load: %v; want %v", err, want)
	}
}
