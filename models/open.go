package models

import (
	"errors"
	"fmt"

	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// The attention paths a model can run with (RunnerOptions.Attention).
const (
	// AttentionPaged runs the model's paged layout: attention reads and writes the
	// KV blocks in place (PagedRunner). Graphs Conveyor builds have it.
	AttentionPaged = "paged"
	// AttentionDense runs model.onnx through the Hugging Face Optimum interface: the
	// past is gathered into dense tensors every step (Runner). Every decoder has it.
	AttentionDense = "dense"
)

// Model is a loaded model, on either attention path.
type Model interface {
	// Spec describes the model's shape, context and eos ids.
	Spec() Spec
	// Forward runs one forward pass over the batch, reading each row's past from the
	// batch's cache and writing the new keys and values into it.
	Forward(b *Batch) (*Output, error)
	// Attention returns AttentionPaged or AttentionDense.
	Attention() string
	Close() error
}

// Open loads the model in dir on the attention path opts.Attention asks for: "paged",
// "dense", or "" for paged when the directory has a paged layout and dense otherwise.
// Asking for paged on a model without a paged layout is an error that says so.
func Open(dir string, opts RunnerOptions) (Model, error) {
	switch opts.Attention {
	case AttentionDense:
		return OpenRunner(dir, opts)
	case AttentionPaged:
		r, err := OpenPaged(dir, opts)
		if errors.Is(err, modeldir.ErrNoPaged) {
			return nil, fmt.Errorf("%w; build it with `conveyor build-model`, or serve it with --attention dense", err)
		}
		return r, err
	case "":
		r, err := OpenPaged(dir, opts)
		if errors.Is(err, modeldir.ErrNoPaged) {
			return OpenRunner(dir, opts)
		}
		return r, err
	}
	return nil, fmt.Errorf("%w: attention %q: want %s or %s", ErrModelDir, opts.Attention, AttentionPaged, AttentionDense)
}

// Attention returns "dense".
func (r *Runner) Attention() string { return AttentionDense }
