package models

import (
	"errors"
	"fmt"

	"github.com/conveyor-llm/conveyor/models/modeldir"
	"github.com/conveyor-llm/conveyor/models/ort"
)

// Open loads the model in dir where Resolve places it: on the device and the attention
// path opts ask for, or, for auto and "", the ones the directory and the hardware allow.
// A device or path the directory cannot run is an error that says so.
func Open(dir string, opts RunnerOptions) (Model, error) {
	opts, err := Resolve(dir, opts)
	if err != nil {
		return nil, err
	}
	if opts.Device == DeviceCUDA {
		dev, err := ort.OpenCUDA(opts.CUDAProvider, 0)
		if err != nil {
			return nil, err
		}
		return OpenStep(dir, opts, dev)
	}
	if opts.Attention == AttentionDense {
		return OpenDense(dir, opts)
	}
	return OpenStep(dir, opts, ort.CPU())
}

// Resolve decides, once, where and how the model in dir runs: it returns opts with
// Device set to DeviceCPU or DeviceCUDA, Attention to AttentionGraph or AttentionDense,
// and, on the step graph, KVCacheDType to the type the graph was built for (the dense
// path's is its ONNX graph's own, read when it opens).
//
//   - cuda: the step graph on the GPU ("graph" or ""): the directory's step graph must be
//     float16 or bfloat16 (`conveyor build-model --dtype float16`), and ONNX Runtime's
//     CUDA provider and a GPU must load; each failure is one line that names what is
//     missing.
//   - cpu: "graph", "dense", or "" for the step graph when the directory has one for the
//     CPU and dense otherwise. Asking for a path the directory lacks is an error that
//     says so.
//   - auto (or ""): cuda when the directory has a GPU step graph, the path allows it and
//     the provider and a GPU load (CUDAUsable); the CPU otherwise.
//
// A KV cache type the graph was not built for is refused.
func Resolve(dir string, opts RunnerOptions) (RunnerOptions, error) {
	if err := opts.Validate(); err != nil {
		return opts, err
	}
	man, stepErr := modeldir.LoadStep(dir)
	gpuGraph := stepErr == nil && man.AttentionDomain == modeldir.StepDomainMicrosoft
	graphPath := opts.Attention == "" || opts.Attention == AttentionGraph
	switch opts.Device {
	case DeviceCUDA:
		if !graphPath {
			return opts, fmt.Errorf("%w: --attention %s runs on the CPU; the GPU runs the step graph (--attention graph)", ErrModelDir, opts.Attention)
		}
		if stepErr != nil {
			return opts, fmt.Errorf("%w: %w; build it with `conveyor build-model --dtype float16`", ErrModelDir, stepErr)
		}
		if !gpuGraph {
			return opts, fmt.Errorf("%w: %s's step graph is %s for the CPU: rebuild it with `conveyor build-model --dtype float16` (or bfloat16) for the GPU",
				ErrModelDir, dir, man.DType)
		}
		if err := ort.InitWithPool(opts.ORTLib, opts.pool()); err != nil {
			return opts, err
		}
	case DeviceAuto, "":
		opts.Device = DeviceCPU
		if gpuGraph && graphPath && CUDAUsable(opts) {
			opts.Device = DeviceCUDA
		}
	}
	switch {
	case opts.Device == DeviceCUDA:
		opts.Attention = AttentionGraph
	case opts.Attention == AttentionGraph:
		if errors.Is(stepErr, modeldir.ErrNoStep) {
			return opts, fmt.Errorf("%w: %w; build it with `conveyor build-model`, or serve it with --attention dense", ErrModelDir, stepErr)
		}
		if stepErr != nil {
			return opts, fmt.Errorf("%w: %w", ErrModelDir, stepErr)
		}
	case opts.Attention == "":
		switch {
		case errors.Is(stepErr, modeldir.ErrNoStep) || gpuGraph:
			// No step graph, or one for the GPU: the Optimum interface serves any decoder.
			opts.Attention = AttentionDense
		case stepErr != nil:
			return opts, fmt.Errorf("%w: %w", ErrModelDir, stepErr)
		default:
			opts.Attention = AttentionGraph
		}
	}
	if opts.Attention == AttentionGraph {
		if kv := opts.KVCacheDType; kv != "" && kv != KVCacheAuto && kv != man.CacheDType() {
			return opts, kvDTypeRefused(dir, man, kv)
		}
		opts.KVCacheDType = man.CacheDType()
	}
	return opts, nil
}

// CUDAUsable reports whether Open with --device auto would run a GPU step graph on the
// GPU: ONNX Runtime's CUDA provider and a GPU load. A checkpoint is built for the device
// it will run on, so its builder asks before building.
func CUDAUsable(opts RunnerOptions) bool {
	if opts.Attention != "" && opts.Attention != AttentionGraph {
		return false
	}
	return CUDAUnavailable(opts) == nil
}

// CUDAUnavailable says in one line why ONNX Runtime and its CUDA provider cannot open
// GPU 0 with opts (the library, the provider, the driver or the device missing); nil
// when they can.
func CUDAUnavailable(opts RunnerOptions) error {
	if err := ort.InitWithPool(opts.ORTLib, opts.pool()); err != nil {
		return err
	}
	_, err := ort.OpenCUDA(opts.CUDAProvider, 0)
	return err
}
