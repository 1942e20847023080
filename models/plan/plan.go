// Package plan decides, once, how a command serves a model. From the flags, the model
// (a built model directory, a Hugging Face checkpoint or a GGUF file) and the hardware,
// Resolve picks the device, the attention path, the weights' float type and
// quantization, and the KV cache's type; the commands read the Plan, build what it says
// (convert.Prepare with Plan.Build) and open what it says (models.Open with
// Plan.Runner), and decide none of these themselves.
//
// A flag the model or the device cannot honour is refused with one line, never dropped:
// --dtype float16 where no GPU serves the model, --kv-cache-dtype float32 for a GPU
// graph, a path the directory lacks.
package plan

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// Flags are what a command was asked: the flags that decide where and how a model runs.
type Flags struct {
	// Runner carries --device, --attention, --kv-cache-dtype, ONNX Runtime's library, its
	// threads and the CUDA provider.
	Runner models.RunnerOptions
	// Quantize is --quantize: how a checkpoint's linear weights are built ("" = float
	// for a checkpoint, the file's own types for a GGUF file; int8 or int4). A built
	// directory is served as it was built.
	Quantize string
	// DType is --dtype: a checkpoint's float type on the GPU ("" or auto: the
	// checkpoint's torch_dtype, as convert.GPUStepDType).
	DType string
}

// Source is what kind of model a directory or file holds.
type Source int

// The sources Resolve tells apart.
const (
	// Built is a model directory (one with model.onnx), served as it was built.
	Built Source = iota
	// Checkpoint is a Hugging Face checkpoint (config.json and *.safetensors), built
	// into the cache on first use.
	Checkpoint
	// GGUF is a GGUF file, built into the cache on first use.
	GGUF
)

// String names the source.
func (s Source) String() string {
	switch s {
	case Checkpoint:
		return "checkpoint"
	case GGUF:
		return "gguf"
	}
	return "model directory"
}

// Plan is how a model is served.
type Plan struct {
	Source Source
	// Device is models.DeviceCPU or models.DeviceCUDA.
	Device string
	// Attention is models.AttentionGraph or models.AttentionDense.
	Attention string
	// DType is the served graph's float type (weights and activations): float32,
	// float16 or bfloat16; "" on the dense path, where it is the ONNX graph's own.
	DType string
	// Quantization is how the linear weights are stored: none, int8 or int4.
	Quantization string
	// KVCacheDType is the KV cache's element type on the step graph (float32, float16 or
	// bfloat16); "" on the dense path, where it is the ONNX graph's own.
	KVCacheDType string
	// Build is how convert.Prepare builds a checkpoint or GGUF file (and checks a
	// built directory against --quantize).
	Build convert.Options
	// Runner is what models.Open takes: the flags' runner options with Device, Attention
	// and (on the step graph) KVCacheDType resolved.
	Runner models.RunnerOptions
}

// cudaUsable is models.CUDAUsable; tests stand in for the hardware.
var cudaUsable = models.CUDAUsable

// Resolve decides how the model at dir is served with f. A built directory is resolved
// by models.Resolve (its step manifest says which device its graph is for); a checkpoint
// or GGUF file is built for the device it will run on: with --device auto, the GPU when
// ONNX Runtime's CUDA provider and a GPU load, in the checkpoint's 16-bit type (--dtype),
// else the CPU in float32 with a --kv-cache-dtype cache (auto: float16) and, for a GGUF
// file, linear weights as close to the file's own types as Conveyor's come.
func Resolve(dir string, f Flags) (Plan, error) {
	if err := f.Runner.Validate(); err != nil {
		return Plan{}, err
	}
	quant, err := convert.ParseQuantization(f.Quantize)
	if err != nil {
		return Plan{}, fmt.Errorf("--quantize: %w", err)
	}
	if _, err := convert.GPUStepDType(nil, f.DType); err != nil {
		return Plan{}, err
	}
	p := Plan{Source: sourceOf(dir), Build: convert.Options{Quantize: quant}}
	if p.Source == Built {
		return p.resolveBuilt(dir, f)
	}
	auto := f.Runner.Device == models.DeviceAuto || f.Runner.Device == ""
	switch {
	case f.Runner.Device == models.DeviceCUDA || auto && cudaUsable(f.Runner):
		if f.Runner.Attention == models.AttentionDense {
			return Plan{}, fmt.Errorf("--attention %s runs on the CPU; the GPU runs the step graph (--attention graph)", models.AttentionDense)
		}
		cfg, _ := convert.LoadConfig(dir) // nil for a GGUF file (and a broken checkpoint, which Prepare reports)
		if p.Build.StepDType, err = convert.GPUStepDType(cfg, f.DType); err != nil {
			return Plan{}, err
		}
		if kv := f.Runner.KVCacheDType; kv != "" && kv != models.KVCacheAuto && kv != p.Build.StepDType.String() {
			return Plan{}, fmt.Errorf("--kv-cache-dtype %s: a %s step graph's cache is its own type on the GPU (leave it auto)", kv, p.Build.StepDType)
		}
		p.Device, p.Attention, p.KVCacheDType = models.DeviceCUDA, models.AttentionGraph, p.Build.StepDType.String()
	default:
		if f.DType != "" && f.DType != "auto" {
			why := "on the CPU"
			if auto {
				why = "no GPU is usable here (--device auto chose the CPU)"
			}
			return Plan{}, fmt.Errorf("--dtype %s is the GPU step graph's type, and %s a checkpoint is served in float32 (or --quantize)", f.DType, why)
		}
		p.Build.StepDType, p.Device = convert.Float32, models.DeviceCPU
		p.Build.StepKVDType = CPUKVDType(f.Runner.KVCacheDType)
		p.Attention = f.Runner.Attention
		if p.Attention == "" {
			p.Attention = models.AttentionGraph
		}
		if p.Attention == models.AttentionGraph {
			p.KVCacheDType = p.Build.StepKVDType.String()
		}
	}
	p.DType = p.Build.StepDType.String()
	if p.Attention == models.AttentionDense {
		p.DType = ""
	}
	if p.Source == GGUF && f.Quantize == "" {
		// A GGUF file keeps its linear weights as close to its own types as Conveyor's
		// quantized linears come (int4 for 4-bit files, int8 for 5- to 8-bit ones).
		if p.Build.Quantize, _, err = convert.GGUFQuantization(dir, p.Device == models.DeviceCUDA); err != nil {
			return Plan{}, err
		}
	}
	p.Quantization = p.Build.Quantize.String()
	p.Runner = f.Runner
	p.Runner.Device, p.Runner.Attention = p.Device, p.Attention
	if p.KVCacheDType != "" {
		p.Runner.KVCacheDType = p.KVCacheDType
	}
	return p, nil
}

// resolveBuilt is Resolve for a built model directory.
func (p Plan) resolveBuilt(dir string, f Flags) (Plan, error) {
	if f.DType != "" && f.DType != "auto" {
		// A built directory is served as it was built: a type asked for would be ignored.
		return Plan{}, fmt.Errorf("--dtype %s applies to Hugging Face checkpoints and GGUF files; %s is a built model directory (rebuild it with `conveyor build-model --dtype %s`)", f.DType, dir, f.DType)
	}
	r, err := models.Resolve(dir, f.Runner)
	if err != nil {
		return Plan{}, err
	}
	p.Device, p.Attention, p.Runner = r.Device, r.Attention, r
	p.Quantization = convert.BuiltQuantization(dir)
	if r.Attention == models.AttentionGraph {
		man, err := modeldir.LoadStep(dir)
		if err != nil {
			return Plan{}, err
		}
		p.DType, p.KVCacheDType = man.DType, r.KVCacheDType
	}
	return p, nil
}

// sourceOf tells what dir holds: a GGUF file, a built model directory (with a
// model.onnx), or else a checkpoint (convert.Prepare says what is missing).
func sourceOf(dir string) Source {
	if convert.IsGGUF(dir) {
		return GGUF
	}
	if st, err := os.Stat(filepath.Join(dir, "model.onnx")); err == nil && !st.IsDir() {
		return Built
	}
	return Checkpoint
}

// CPUKVDType is the KV cache type a CPU step graph is built with (build-model's and
// Resolve's rule) for a --kv-cache-dtype
// value: float16 for float16 and auto, float32 for float32 and "".
func CPUKVDType(kv string) convert.DType {
	if kv == models.KVCacheAuto || kv == convert.Float16.String() {
		return convert.Float16
	}
	return convert.Float32
}
