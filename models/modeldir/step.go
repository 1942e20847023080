package modeldir

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
)

// StepDir is the subdirectory of a model directory that holds its step graph: the whole
// model as one ONNX graph that one run per step serves, described by StepManifest
// (step/step.json).
const StepDir = "step"

// StepManifestFile is the step manifest's file name inside StepDir.
const StepManifestFile = "step.json"

// StepFormat is the step manifest format this package reads and writes.
// (2: the graph takes StepAttentionMetadata; 3: a block table per layer group).
const StepFormat = 3

// Names of the step graph's inputs and outputs. The graph runs over the step's new
// tokens packed row after row (T tokens of B rows, no padding):
//
//	StepInputIDs     [T]            int64  the new tokens
//	StepCumLens      [B+1]          int32  row b's tokens are StepInputIDs[cu[b]:cu[b+1]]
//	StepPastLens     [B]            int32  tokens row b already has in the cache
//	StepBlockTable   [B, blocks]    int32  row b's position p is in block table[b][p/block_size]
//	StepGroupBlockTable(g) [B, blocks] int32  the same for the layers of group g >= 1 (LayerGroups)
//	StepLogitRows    [R]            int64  the tokens (indices into T) whose logits are wanted
//	StepAttentionMetadata [2]       int32  host: the longest new-token run and the longest past+new
//	StepKeyCache(i)  [num_blocks, block_size, kv_heads, head_dim]  layer i's keys (and StepValueCache)
//	->
//	StepLogits          [R, vocab]  float32
//	StepArgmax          [R]         int64  each logit row's argmax (ties to the lowest id)
//	StepKeyCacheOut(i)  the same tensor as StepKeyCache(i), written in place (and StepValueCacheOut)
//
// Each layer's attention is one PagedAttention node (ONNX Runtime's com.microsoft contract,
// or Conveyor's own implementation of it in domain com.conveyor on CPUs) that stores the new
// keys and values in their blocks and attends over the rows' pasts in place.
const (
	StepInputIDs   = "input_ids"
	StepCumLens    = "cumulative_sequence_length"
	StepPastLens   = "past_seqlens"
	StepBlockTable = "block_table"
	StepLogitRows  = "logit_rows"
	// StepAttentionMetadata is PagedAttention's input 16, attention_metadata: bounds that
	// let ONNX Runtime's CUDA kernel size its launches without copying the lengths back
	// and synchronising the stream in every layer.
	StepAttentionMetadata = "attention_metadata"
	StepLogits            = "logits"
	StepArgmax            = "argmax"
)

// StepGroupBlockTable names the block table of layer group g: StepBlockTable for group 0,
// "block_table.g" for the others.
func StepGroupBlockTable(g int) string {
	if g == 0 {
		return StepBlockTable
	}
	return fmt.Sprintf("%s.%d", StepBlockTable, g)
}

// StepKeyCache and the others name layer i's cache inputs and outputs.
func StepKeyCache(i int) string      { return fmt.Sprintf("key_cache.%d", i) }
func StepValueCache(i int) string    { return fmt.Sprintf("value_cache.%d", i) }
func StepKeyCacheOut(i int) string   { return fmt.Sprintf("key_cache_out.%d", i) }
func StepValueCacheOut(i int) string { return fmt.Sprintf("value_cache_out.%d", i) }

// The PagedAttention domains a step graph may use.
const (
	// StepDomainMicrosoft is ONNX Runtime's contrib PagedAttention (CUDA, float16/bfloat16).
	StepDomainMicrosoft = "com.microsoft"
	// StepDomainConveyor is Conveyor's own implementation of the same contract (CPU, float32).
	StepDomainConveyor = "com.conveyor"
)

// ErrNoStep means a model directory has no step graph.
var ErrNoStep = errors.New("modeldir: the model has no step graph")

// StepManifest describes a model's step graph.
type StepManifest struct {
	Format int `json:"format"`
	// Graph is the ONNX file inside StepDir (its weights may sit beside it in Graph+".data").
	Graph string `json:"graph"`
	// DType is the graph's float type, of its weights, activations and (unless KVDType
	// says otherwise) KV cache: "float32", "float16" or "bfloat16".
	DType string `json:"dtype"`
	// KVDType is the KV cache's element type when it is not DType: "float16" in a float32
	// graph for the CPU (Conveyor's PagedAttention stores its caches in half floats).
	KVDType string `json:"kv_dtype,omitempty"`
	// AttentionDomain is the domain of the graph's PagedAttention nodes.
	AttentionDomain string `json:"attention_domain"`
	NumLayers       int    `json:"num_layers"`
	NumHeads        int    `json:"num_heads"`
	NumKVHeads      int    `json:"num_kv_heads"`
	HeadDim         int    `json:"head_dim"`
	HiddenSize      int    `json:"hidden_size"`
	VocabSize       int    `json:"vocab_size"`
	MaxPositions    int    `json:"max_positions"`
	// Windows is each layer's sliding window in tokens (0: full attention); the graph
	// applies them itself.
	Windows []int `json:"windows,omitempty"`
	// LayerGroups, when set, is each layer's KV group (kvcache.Layout.LayerGroups): the
	// layers of group g read their blocks through StepGroupBlockTable(g), so a sliding
	// group's table may name blocks of its own, given back once the window has passed
	// them. nil: every layer reads StepBlockTable. The graph also runs over a cache of
	// one group, every table input then given the same table.
	LayerGroups []int `json:"layer_groups,omitempty"`
	// Quantization names how the linear weights are stored ("none", "int8", "int4").
	Quantization string `json:"quantization,omitempty"`
	// OwnOps says the graph uses Conveyor's own operators (com.conveyor), which only a
	// Conveyor session registers.
	OwnOps bool `json:"own_ops,omitempty"`
}

// CacheDType is the KV cache's element type: KVDType, or DType when it is empty.
func (m *StepManifest) CacheDType() string {
	if m.KVDType != "" {
		return m.KVDType
	}
	return m.DType
}

// Validate checks the manifest's consistency (not the files it names).
func (m *StepManifest) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadFile, fmt.Sprintf("step manifest: "+format, args...))
	}
	switch {
	case m.Format != StepFormat:
		return bad("format %d, this build reads %d: rebuild the model with `conveyor build-model`", m.Format, StepFormat)
	case m.Graph == "":
		return bad("no graph")
	case m.DType != "float32" && m.DType != "float16" && m.DType != "bfloat16":
		return bad("dtype %q: want float32, float16 or bfloat16", m.DType)
	case m.KVDType != "" && m.KVDType != m.DType && (m.DType != "float32" || m.KVDType != "float16"):
		return bad("kv_dtype %q in a %s graph: only a float32 graph takes another cache type, float16", m.KVDType, m.DType)
	case m.AttentionDomain != StepDomainMicrosoft && m.AttentionDomain != StepDomainConveyor:
		return bad("attention_domain %q: want %s or %s", m.AttentionDomain, StepDomainMicrosoft, StepDomainConveyor)
	case m.NumLayers <= 0 || m.NumHeads <= 0 || m.NumKVHeads <= 0 || m.HeadDim <= 0:
		return bad("num_layers %d, num_heads %d, num_kv_heads %d and head_dim %d must be positive", m.NumLayers, m.NumHeads, m.NumKVHeads, m.HeadDim)
	case m.HiddenSize <= 0 || m.VocabSize <= 0 || m.MaxPositions <= 0:
		return bad("hidden_size %d, vocab_size %d and max_positions %d must be positive", m.HiddenSize, m.VocabSize, m.MaxPositions)
	case m.Windows != nil && len(m.Windows) != m.NumLayers:
		return bad("%d windows for %d layers", len(m.Windows), m.NumLayers)
	case m.LayerGroups != nil && len(m.LayerGroups) != m.NumLayers:
		return bad("%d layer groups for %d layers", len(m.LayerGroups), m.NumLayers)
	}
	if m.LayerGroups == nil {
		return nil
	}
	// Every group holds as many layers, all of one window (a block holds one group's layers).
	size := map[int]int{}
	window := map[int]int{}
	for l, g := range m.LayerGroups {
		if g < 0 || g >= m.NumLayers {
			return bad("layer %d in group %d", l, g)
		}
		w := 0
		if m.Windows != nil {
			w = m.Windows[l]
		}
		if prev, ok := window[g]; ok && prev != w {
			return bad("group %d holds layers of windows %d and %d", g, prev, w)
		}
		window[g] = w
		size[g]++
	}
	for g := range len(size) {
		if size[g] != size[0] {
			return bad("layer groups %v: want groups 0..%d of as many layers each", m.LayerGroups, len(size)-1)
		}
	}
	return nil
}

// NumGroups returns the number of layer groups, and so of block tables (1 without
// LayerGroups).
func (m *StepManifest) NumGroups() int {
	n := 1
	for _, g := range m.LayerGroups {
		n = max(n, g+1)
	}
	return n
}

// LoadStep reads dir/step/step.json. A directory without one is ErrNoStep.
func LoadStep(dir string) (*StepManifest, error) {
	var m StepManifest
	if err := readJSONFile(filepath.Join(dir, StepDir, StepManifestFile), &m); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w (%s has no %s/%s)", ErrNoStep, dir, StepDir, StepManifestFile)
		}
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// WriteStep writes m as dir/step/step.json.
func WriteStep(dir string, m *StepManifest) error {
	if err := m.Validate(); err != nil {
		return err
	}
	return writeJSONFile(dir, StepDir, StepManifestFile, m)
}
