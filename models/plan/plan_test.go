package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
)

// checkpoint writes a config.json for model type typ with torch_dtype dtype into a new
// directory: all Resolve reads of a checkpoint (Prepare reads the rest).
func checkpoint(t *testing.T, typ, dtype string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "tiny-llama", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(raw), `"torch_dtype": "float32"`, `"torch_dtype": "`+dtype+`"`, 1)
	cfg = strings.Replace(cfg, `"model_type": "llama"`, `"model_type": "`+typ+`"`, 1)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// built builds the tiny Llama into a model directory with o.
func built(t *testing.T, o convert.Options) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := convert.BuildRandom(filepath.Join("..", "testdata", "tiny-llama", "config.json"), dir, 1, o); err != nil {
		t.Fatal(err)
	}
	return dir
}

// withGPU makes Resolve see a usable GPU (or none) for the test.
func withGPU(t *testing.T, usable bool) {
	t.Helper()
	saved := cudaUsable
	cudaUsable = func(models.RunnerOptions) bool { return usable }
	t.Cleanup(func() { cudaUsable = saved })
}

// TestResolveCheckpoint: a checkpoint is built for the device it will run on: the GPU
// with --device auto when one is usable, in the checkpoint's type (bfloat16 for Gemma 2
// whatever its torch_dtype), else the CPU in float32 with a float16 cache for
// --kv-cache-dtype auto and a float32 one when it is not given.
func TestResolveCheckpoint(t *testing.T) {
	type want struct{ device, attention, dtype, kv string }
	for _, c := range []struct {
		name   string
		gpu    bool
		typ    string
		torch  string
		flags  Flags
		expect want
	}{
		{"cpu auto", false, "llama", "bfloat16", Flags{Runner: models.RunnerOptions{KVCacheDType: models.KVCacheAuto}}, want{"cpu", "graph", "float32", "float16"}},
		{"cpu no kv flag", false, "llama", "float32", Flags{}, want{"cpu", "graph", "float32", "float32"}},
		{"cpu asked", true, "llama", "bfloat16", Flags{Runner: models.RunnerOptions{Device: models.DeviceCPU, KVCacheDType: "float32"}}, want{"cpu", "graph", "float32", "float32"}},
		{"cpu dense", false, "llama", "float32", Flags{Runner: models.RunnerOptions{Attention: models.AttentionDense}}, want{"cpu", "dense", "", ""}},
		{"gpu auto bfloat16", true, "llama", "bfloat16", Flags{Runner: models.RunnerOptions{KVCacheDType: models.KVCacheAuto}}, want{"cuda", "graph", "bfloat16", "bfloat16"}},
		{"gpu auto float32 checkpoint", true, "llama", "float32", Flags{}, want{"cuda", "graph", "float16", "float16"}},
		{"gpu gemma2", true, "gemma2", "float16", Flags{}, want{"cuda", "graph", "bfloat16", "bfloat16"}},
		{"gpu dtype asked", true, "gemma2", "bfloat16", Flags{DType: "float16"}, want{"cuda", "graph", "float16", "float16"}},
		{"gpu cuda asked", false, "llama", "bfloat16", Flags{Runner: models.RunnerOptions{Device: models.DeviceCUDA}}, want{"cuda", "graph", "bfloat16", "bfloat16"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			withGPU(t, c.gpu)
			p, err := Resolve(checkpoint(t, c.typ, c.torch), c.flags)
			if err != nil {
				t.Fatal(err)
			}
			got := want{p.Device, p.Attention, p.DType, p.KVCacheDType}
			if got != c.expect || p.Source != Checkpoint || p.Quantization != "none" {
				t.Fatalf("plan %+v, want %+v from a checkpoint, quantization none", p, c.expect)
			}
			if p.Runner.Device != p.Device || p.Runner.Attention != p.Attention || p.KVCacheDType != "" && p.Runner.KVCacheDType != p.KVCacheDType {
				t.Errorf("runner options %+v do not carry the plan %+v", p.Runner, got)
			}
			if p.Build.StepDType.String() != map[bool]string{true: p.DType, false: "float32"}[p.DType != ""] {
				t.Errorf("builds a %s step graph for a %s plan", p.Build.StepDType, p.DType)
			}
		})
	}
}

// TestResolveRefuses: flags the model or the device cannot honour are refused with one
// line naming the flag, never dropped.
func TestResolveRefuses(t *testing.T) {
	cpuDir := built(t, convert.Options{StepKVDType: convert.Float16})
	for _, c := range []struct {
		name  string
		gpu   bool
		dir   string
		flags Flags
		want  string
	}{
		{"dtype with no GPU", false, "", Flags{DType: "float16"}, "--dtype float16"},
		{"dtype on the CPU", true, "", Flags{DType: "bfloat16", Runner: models.RunnerOptions{Device: models.DeviceCPU}}, "--dtype bfloat16"},
		{"bad dtype", true, "", Flags{DType: "half"}, `--dtype "half"`},
		{"kv on the GPU", true, "", Flags{Runner: models.RunnerOptions{KVCacheDType: "float32"}}, "--kv-cache-dtype float32"},
		{"dense on the GPU", false, "", Flags{Runner: models.RunnerOptions{Device: models.DeviceCUDA, Attention: models.AttentionDense}}, "--attention dense"},
		{"bad quantize", false, "", Flags{Quantize: "int3"}, "--quantize"},
		{"retired path", false, "", Flags{Runner: models.RunnerOptions{Attention: "paged"}}, "retired"},
		{"dtype for a built directory", false, cpuDir, Flags{DType: "bfloat16"}, "--dtype bfloat16 applies to Hugging Face checkpoints"},
		{"kv unlike the built graph's", false, cpuDir, Flags{Runner: models.RunnerOptions{KVCacheDType: "float32"}}, "--kv-cache-dtype float32"},
		{"cpu graph on the GPU", false, cpuDir, Flags{Runner: models.RunnerOptions{Device: models.DeviceCUDA}}, "for the CPU"},
	} {
		t.Run(c.name, func(t *testing.T) {
			withGPU(t, c.gpu)
			dir := c.dir
			if dir == "" {
				dir = checkpoint(t, "llama", "bfloat16")
			}
			_, err := Resolve(dir, c.flags)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Resolve: %v, want one line containing %q", err, c.want)
			}
		})
	}
}

// TestResolveBuilt: a built directory is served as it was built: its CPU step graph with
// the cache type it was built for, dense when asked; a GPU step graph on the CPU (no GPU
// here) falls back to the dense path, which every directory has.
func TestResolveBuilt(t *testing.T) {
	cpuDir := built(t, convert.Options{StepKVDType: convert.Float16})
	p, err := Resolve(cpuDir, Flags{Runner: models.RunnerOptions{KVCacheDType: models.KVCacheAuto}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Source != Built || p.Device != models.DeviceCPU || p.Attention != models.AttentionGraph || p.DType != "float32" || p.KVCacheDType != "float16" || p.Runner.KVCacheDType != "float16" {
		t.Errorf("CPU directory: %+v", p)
	}
	if p, err = Resolve(cpuDir, Flags{Runner: models.RunnerOptions{Attention: models.AttentionDense}}); err != nil || p.Attention != models.AttentionDense || p.DType != "" {
		t.Errorf("CPU directory, dense: %+v, %v", p, err)
	}
	gpuDir := built(t, convert.Options{StepDType: convert.Float16})
	p, err = Resolve(gpuDir, Flags{Runner: models.RunnerOptions{ORTLib: filepath.Join(t.TempDir(), "missing.so")}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Device != models.DeviceCPU || p.Attention != models.AttentionDense {
		t.Errorf("GPU directory with no GPU: %+v, want the CPU's dense path", p)
	}
}
