package models

import (
	"errors"
	"fmt"

	"github.com/conveyor-llm/conveyor/models/modeldir"
	"github.com/conveyor-llm/conveyor/models/ort"
)

// AttentionDense runs model.onnx through the Hugging Face Optimum interface
// (RunnerOptions.Attention): the past is gathered into dense tensors every step
// (DenseRunner). Every decoder has it, Optimum exports included; AttentionGraph (step.go)
// is the other path.
const AttentionDense = "dense"

// Model is a loaded model, on any attention path.
type Model interface {
	// Spec describes the model's shape, context and eos ids.
	Spec() Spec
	// Forward runs one forward pass over the batch, reading each row's past from the
	// batch's cache and writing the new keys and values into it.
	Forward(b *Batch) (*Output, error)
	// Attention returns AttentionGraph or AttentionDense.
	Attention() string
	// Device names the device the model runs on: "cpu", or the GPU's name.
	Device() string
	Close() error
}

// Open loads the model in dir on the device opts.Device asks for and the attention path
// opts.Attention asks for.
//
//   - cpu: "graph", "dense", or "" for the step graph when the directory has one for the
//     CPU and dense otherwise. Asking for a path the directory lacks is an error
//     that says so.
//   - cuda: the step graph on the GPU ("graph" or ""): the directory's step graph must be
//     float16 or bfloat16 (`conveyor build-model --dtype float16`), and ONNX Runtime's
//     CUDA provider and a GPU must load; each failure is one line that names what is
//     missing.
//   - auto (or ""): cuda when the directory has a GPU step graph, the path allows it and
//     the provider and a GPU load; the CPU otherwise.
func Open(dir string, opts RunnerOptions) (Model, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	switch opts.Device {
	case DeviceCUDA:
		if opts.Attention != "" && opts.Attention != AttentionGraph {
			return nil, fmt.Errorf("%w: --attention %s runs on the CPU; the GPU runs the step graph (--attention graph)", ErrModelDir, opts.Attention)
		}
		man, err := modeldir.LoadStep(dir)
		if err != nil {
			return nil, fmt.Errorf("%w: %w; build it with `conveyor build-model --dtype float16`", ErrModelDir, err)
		}
		if man.AttentionDomain != modeldir.StepDomainMicrosoft {
			return nil, fmt.Errorf("%w: %s's step graph is %s for the CPU: rebuild it with `conveyor build-model --dtype float16` (or bfloat16) for the GPU",
				ErrModelDir, dir, man.DType)
		}
		if err := ort.InitWithPool(opts.ORTLib, opts.pool()); err != nil {
			return nil, err
		}
		dev, err := ort.OpenCUDA(opts.CUDAProvider, 0)
		if err != nil {
			return nil, err
		}
		return OpenStep(dir, opts, dev)
	case DeviceAuto, "":
		if opts.Attention == "" || opts.Attention == AttentionGraph {
			if man, err := modeldir.LoadStep(dir); err == nil && man.AttentionDomain == modeldir.StepDomainMicrosoft {
				if err := ort.InitWithPool(opts.ORTLib, opts.pool()); err != nil {
					return nil, err
				}
				if dev, err := ort.OpenCUDA(opts.CUDAProvider, 0); err == nil {
					return OpenStep(dir, opts, dev)
				}
			}
		}
	}
	return openCPU(dir, opts)
}

// CUDAUsable reports whether Open with --device auto would run a GPU step graph on the
// GPU: ONNX Runtime's CUDA provider and a GPU load. A checkpoint is built for the device
// it will run on, so its builder asks before building.
func CUDAUsable(opts RunnerOptions) bool {
	if opts.Attention != "" && opts.Attention != AttentionGraph {
		return false
	}
	if err := ort.InitWithPool(opts.ORTLib, opts.pool()); err != nil {
		return false
	}
	_, err := ort.OpenCUDA(opts.CUDAProvider, 0)
	return err == nil
}

// openCPU is Open on the CPU.
func openCPU(dir string, opts RunnerOptions) (Model, error) {
	switch opts.Attention {
	case AttentionDense:
		return OpenDense(dir, opts)
	case AttentionGraph:
		r, err := OpenStep(dir, opts, ort.CPU())
		if errors.Is(err, modeldir.ErrNoStep) {
			return nil, fmt.Errorf("%w; build it with `conveyor build-model`, or serve it with --attention dense", err)
		}
		return r, err
	}
	man, err := modeldir.LoadStep(dir)
	switch {
	case errors.Is(err, modeldir.ErrNoStep) || err == nil && man.AttentionDomain != modeldir.StepDomainConveyor:
		// No step graph, or one for the GPU: the Optimum interface serves any decoder.
		return OpenDense(dir, opts)
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrModelDir, err)
	}
	return OpenStep(dir, opts, ort.CPU())
}

// Device returns "cpu".
func (r *DenseRunner) Device() string { return DeviceCPU }

// Attention returns "dense".
func (r *DenseRunner) Attention() string { return AttentionDense }
