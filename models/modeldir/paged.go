package modeldir

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/conveyor-llm/conveyor/models/attention"
)

// PagedDir is the subdirectory of a model directory that holds its paged-attention
// layout, described by PagedManifest (paged/paged.json).
const PagedDir = "paged"

// PagedManifestFile is the manifest's file name inside PagedDir.
const PagedManifestFile = "paged.json"

// PagedFormat is the manifest format this package reads and writes.
const PagedFormat = 1

// Names of the paged segments' inputs and outputs. Every segment is an ONNX graph over
// the step's tokens packed row after row (T rows, no padding):
//
//	layer 0:        SegHidden [T, hidden]                       -> SegQKV [T, (heads+2*kv_heads)*head_dim]
//	layer i > 0:    SegHidden, SegAttention [T, heads*head_dim] -> SegHiddenOut [T, hidden], SegQKV
//	head:           SegHidden, SegAttention, SegLogitRows [R]   -> SegLogits [R, vocab]
//
// Layer i's segment finishes layer i-1 (output projection, residual, MLP) and starts
// layer i (norm, q|k|v projection); the attention between them is the native kernel's
// (package attention), reading and writing the paged KV blocks in place.
const (
	SegHidden    = "hidden"
	SegAttention = "attention"
	SegHiddenOut = "hidden_out"
	SegQKV       = "qkv"
	SegLogitRows = "logit_rows"
	SegLogits    = "logits"
)

// ErrNoPaged means a model directory has no paged layout (it serves only through the
// dense Optimum interface).
var ErrNoPaged = errors.New("modeldir: the model has no paged-attention layout")

// PagedManifest describes a model's paged layout.
type PagedManifest struct {
	Format       int `json:"format"`
	HiddenSize   int `json:"hidden_size"`
	VocabSize    int `json:"vocab_size"`
	MaxPositions int `json:"max_positions"`
	// Embedding is the token embedding table the runtime reads rows of (the first
	// segment starts from the embedded tokens).
	Embedding Embedding `json:"embedding"`
	// Layers are in order; layer i's segment file ends with layer i's q|k|v.
	Layers []PagedLayer `json:"layers"`
	// Head is the final segment's file: the last layer's output and MLP, the final
	// norm and the output projection, for the rows SegLogitRows selects.
	Head string `json:"head"`
	// Quantization names how the segments store the linear weights: "none", "int8"
	// (per output channel, times per-token int8 activations: com.conveyor.Int8Linear,
	// or com.microsoft.MatMulIntegerToFloat in builds of before it) or "int4" (block-quantized, com.microsoft.MatMulNBits);
	// empty means none.
	Quantization string `json:"quantization,omitempty"`
	// OwnThreads says every matrix product of the segments runs on Conveyor's own
	// kernel threads (com.conveyor.Int8Linear, package models/int8gemm): ONNX Runtime's
	// pool then has only the small operators between them and must not spin beside
	// those threads. False in builds of before it.
	OwnThreads bool `json:"own_threads,omitempty"`
}

// Embedding is a raw little-endian float32 [Rows][Cols] table.
type Embedding struct {
	File string `json:"file"`
	Rows int    `json:"rows"`
	Cols int    `json:"cols"`
	// Scale multiplies every embedded row (Gemma's sqrt(hidden)); 0 means 1.
	Scale float32 `json:"scale,omitempty"`
}

// PagedLayer is one transformer layer: its segment file and its attention.
type PagedLayer struct {
	Segment   string           `json:"segment"`
	Attention attention.Params `json:"attention"`
}

// LayerWindows returns each layer's sliding window in tokens (0: full attention).
func (m *PagedManifest) LayerWindows() []int {
	w := make([]int, len(m.Layers))
	for i, l := range m.Layers {
		w[i] = l.Attention.SlidingWindow
	}
	return w
}

// Validate checks the manifest's consistency (not the files it names).
func (m *PagedManifest) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadFile, fmt.Sprintf("paged manifest: "+format, args...))
	}
	switch {
	case m.Format != PagedFormat:
		return bad("format %d, this build reads %d", m.Format, PagedFormat)
	case m.HiddenSize <= 0 || m.VocabSize <= 0 || m.MaxPositions <= 0:
		return bad("hidden_size %d, vocab_size %d and max_positions %d must be positive", m.HiddenSize, m.VocabSize, m.MaxPositions)
	case len(m.Layers) == 0:
		return bad("no layers")
	case m.Head == "":
		return bad("no head segment")
	case m.Embedding.File == "" || m.Embedding.Rows != m.VocabSize || m.Embedding.Cols != m.HiddenSize:
		return bad("embedding %q is [%d, %d], want [%d, %d]", m.Embedding.File, m.Embedding.Rows, m.Embedding.Cols, m.VocabSize, m.HiddenSize)
	}
	for i, l := range m.Layers {
		if l.Segment == "" {
			return bad("layer %d has no segment", i)
		}
		if err := l.Attention.Validate(); err != nil {
			return bad("layer %d: %v", i, err)
		}
	}
	return nil
}

// LoadPaged reads dir/paged/paged.json. A directory without one is ErrNoPaged.
func LoadPaged(dir string) (*PagedManifest, error) {
	var m PagedManifest
	if err := readJSONFile(filepath.Join(dir, PagedDir, PagedManifestFile), &m); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w (%s has no %s/%s)", ErrNoPaged, dir, PagedDir, PagedManifestFile)
		}
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// WritePaged writes m as dir/paged/paged.json.
func WritePaged(dir string, m *PagedManifest) error {
	if err := m.Validate(); err != nil {
		return err
	}
	return writeJSONFile(dir, PagedDir, PagedManifestFile, m)
}
