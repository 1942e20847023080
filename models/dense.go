package models

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/modeldir"
	"github.com/conveyor-llm/conveyor/models/ort"
)

// AttentionDense runs model.onnx through the Hugging Face Optimum interface
// (RunnerOptions.Attention): the past is gathered into dense tensors every step
// (DenseRunner). Every decoder has it, Optimum exports included; AttentionGraph (step.go)
// is the other path.
const AttentionDense = "dense"

// DenseRunner runs forward passes of one decoder model through ONNX Runtime. Forward calls
// are serialised; the runner reuses its buffers from call to call.
type DenseRunner struct {
	mu      sync.Mutex
	session *ort.Session
	spec    Spec
	io      decoderIO

	inputs, outputs []*ort.Value // per-call tensors, released after each Forward

	ids, pos, mask []int64
	// kvMem holds past K, past V, present K and present V, each as NumLayers
	// consecutive [B, kvh, tokens, hd] tensors (tokens = maxPast, or maxPast+maxNew
	// for present); kvViews[kind][l] is layer l's tensor.
	kvMem     [4][]byte
	kvViews   [4][][]byte
	logits    []float32 // [B, S, V] written by ONNX Runtime (float32 logits)
	logits16  []byte    // [B, S, V] written by ONNX Runtime (float16 logits)
	logitsOut []float32 // logits converted from float16
	rows      [][]float32
	useCache  []bool
	// The rows' block tables, past lengths and new-token counts for Storage.Gather
	// and Scatter.
	tables           [][][]kvcache.BlockID // [layer group][row]
	pastLens, counts []int

	cost        costModel   // estimates passes for planPasses
	groupLogits []float32   // every row's logits of a grouped Forward
	groupRows   [][]float32 // views into groupLogits, one per row
	groupSeqs   []SeqInput  // the rows of one group's pass
}

// decoderIO records where each decoder input and output sits in the session's name lists.
type decoderIO struct {
	inNames, outNames []string
	ids, mask, pos    int // input indexes; -1 when absent
	useCache          int // input index of use_cache_branch; -1 when absent
	pastK, pastV      []int
	logits            int // output index
	presK, presV      []int
	logitsF16         bool
	logitsLastOnly    bool // the graph returns only the last position's logits ([B, 1, V])
}

// OpenDense loads dir/model.onnx (plus config.json and generation_config.json) into an
// ONNX Runtime session. Any graph with the Hugging Face Optimum decoder interface
// (input_ids, attention_mask, position_ids, past_key_values.{i}.key/value -> logits,
// present.{i}.key/value) loads; layers, KV heads, head size and KV type come from
// the graph. InitORT(opts.ORTLib) is called first.
func OpenDense(dir string, opts RunnerOptions) (*DenseRunner, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := ort.InitWithPool(opts.ORTLib, opts.pool()); err != nil {
		return nil, err
	}
	modelPath := filepath.Join(dir, "model.onnx")
	if st, err := os.Stat(modelPath); err != nil || st.IsDir() {
		return nil, fmt.Errorf("%w: no model.onnx in %s", ErrModelDir, dir)
	}
	meta, err := readModelMeta(dir)
	if err != nil {
		return nil, err
	}
	// The graph is checked before the session that optimises it is opened.
	ins, outs, err := ort.ModelIO(modelPath)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrModelDir, err)
	}
	io, spec, err := parseDecoderIO(ins, outs, meta)
	if err != nil {
		return nil, err
	}
	if opts.KVCacheDType != "" && opts.KVCacheDType != KVCacheAuto && opts.KVCacheDType != spec.KVDType.String() {
		return nil, fmt.Errorf("%w: %s keeps its KV cache in %s on the dense path; a %s cache needs the step graph (--attention graph)",
			ErrModelDir, modelPath, spec.KVDType, opts.KVCacheDType)
	}

	sess, err := openSession(modelPath, opts)
	if err != nil {
		return nil, err
	}
	if man, err := modeldir.LoadStep(dir); err == nil && len(man.Windows) == spec.NumLayers {
		spec.LayerWindows = man.Windows // the same model's step graph knows its windows
	}
	r := &DenseRunner{
		session:  sess,
		spec:     spec,
		io:       io,
		inputs:   make([]*ort.Value, len(io.inNames)),
		outputs:  make([]*ort.Value, len(io.outNames)),
		useCache: make([]bool, 1),
		cost:     newCostModel(spec, modelWeightBytes(dir)),
	}
	for i := range r.kvViews {
		r.kvViews[i] = make([][]byte, spec.NumLayers)
	}
	return r, nil
}

// Spec returns what the engine needs to know about the model.
func (r *DenseRunner) Spec() Spec {
	s := r.spec
	s.EOSTokenIDs = append([]int32(nil), s.EOSTokenIDs...)
	return s
}

// Device returns "cpu".
func (r *DenseRunner) Device() string { return DeviceCPU }

// Attention returns "dense".
func (r *DenseRunner) Attention() string { return AttentionDense }

// DeviceMemory returns the host's error: the dense runner runs on the CPU.
func (r *DenseRunner) DeviceMemory() (free, total int64, err error) { return ort.CPU().Memory() }

// Close releases the ONNX Runtime session. It is idempotent; Forward after Close fails.
func (r *DenseRunner) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.session == nil {
		return nil
	}
	err := r.session.Close()
	r.session = nil
	if err != nil {
		return fmt.Errorf("%w: close session: %s", ErrRun, oneLine(err.Error()))
	}
	return nil
}

// parseDecoderIO checks that the graph follows the decoder interface and derives the Spec.
func parseDecoderIO(ins, outs []ort.TensorInfo, meta modelMeta) (decoderIO, Spec, error) {
	io := decoderIO{ids: -1, mask: -1, pos: -1, useCache: -1, logits: -1}
	bad := func(format string, args ...any) (decoderIO, Spec, error) {
		return decoderIO{}, Spec{}, fmt.Errorf("%w: %s", ErrModelDir, fmt.Sprintf(format, args...))
	}
	pastK := map[int]ort.TensorInfo{}
	pastV := map[int]ort.TensorInfo{}
	for _, in := range ins {
		idx := len(io.inNames)
		switch name := in.Name; {
		case name == "input_ids":
			io.ids = idx
		case name == "attention_mask":
			io.mask = idx
		case name == "position_ids":
			io.pos = idx
		case name == "use_cache_branch":
			if in.Type != ort.Bool {
				return bad("input use_cache_branch has type %s, want bool", in.Type)
			}
			io.useCache = idx
		default:
			layer, kind, ok := parseKVName(name, "past_key_values.")
			if !ok {
				return bad("unsupported graph input %q", name)
			}
			if kind == "key" {
				pastK[layer] = in
			} else {
				pastV[layer] = in
			}
		}
		if in.Name == "input_ids" || in.Name == "attention_mask" || in.Name == "position_ids" {
			if in.Type != ort.Int64 {
				return bad("input %s has type %s, want int64", in.Name, in.Type)
			}
		}
		io.inNames = append(io.inNames, in.Name)
	}
	if io.ids < 0 {
		return bad("graph has no input_ids input")
	}
	layers := len(pastK)
	if layers == 0 {
		return bad("graph has no past_key_values.{i}.key inputs (export it with past key values)")
	}
	for l := 0; l < layers; l++ {
		if _, ok := pastK[l]; !ok {
			return bad("graph lacks past_key_values.%d.key", l)
		}
		if _, ok := pastV[l]; !ok {
			return bad("graph lacks past_key_values.%d.value", l)
		}
	}
	if len(pastV) != layers {
		return bad("graph has %d past keys but %d past values", layers, len(pastV))
	}

	first := pastK[0]
	if len(first.Shape) != 4 {
		return bad("past_key_values.0.key has shape %v, want [batch, kv_heads, past, head_dim]", first.Shape)
	}
	kvHeads, headDim := int(first.Shape[1]), int(first.Shape[3])
	if kvHeads <= 0 {
		kvHeads = meta.numKVHeads
	}
	if headDim <= 0 {
		headDim = meta.headDim
	}
	if kvHeads <= 0 || headDim <= 0 {
		return bad("cannot tell KV heads and head size from the graph or config.json")
	}
	var kvType DType
	switch first.Type {
	case ort.Float32:
		kvType = Float32
	case ort.Float16:
		kvType = Float16
	default:
		return bad("past_key_values have type %s, want float32 or float16", first.Type)
	}
	for l := 0; l < layers; l++ {
		for _, in := range []ort.TensorInfo{pastK[l], pastV[l]} {
			if in.Type != first.Type || !sameKVShape(in.Shape, first.Shape) {
				return bad("%s has %s %v, unlike past_key_values.0.key (%s %v)", in.Name, in.Type, in.Shape, first.Type, first.Shape)
			}
		}
	}
	for l := 0; l < layers; l++ {
		io.pastK = append(io.pastK, slices.Index(io.inNames, pastK[l].Name))
		io.pastV = append(io.pastV, slices.Index(io.inNames, pastV[l].Name))
	}

	// Outputs: only logits and present.* are requested from the session.
	byName := map[string]ort.TensorInfo{}
	for _, o := range outs {
		byName[o.Name] = o
	}
	lg, ok := byName["logits"]
	if !ok {
		return bad("graph has no logits output")
	}
	if len(lg.Shape) != 3 {
		return bad("logits have shape %v, want [batch, seq, vocab]", lg.Shape)
	}
	switch lg.Type {
	case ort.Float32:
	case ort.Float16:
		io.logitsF16 = true
	default:
		return bad("logits have type %s, want float32 or float16", lg.Type)
	}
	vocab := int(lg.Shape[2])
	if vocab <= 0 {
		vocab = meta.vocabSize
	}
	if vocab <= 0 {
		return bad("cannot tell the vocabulary size from the graph or config.json")
	}
	io.logitsLastOnly = lg.Shape[1] == 1
	io.logits = 0
	io.outNames = append(io.outNames, "logits")
	for l := 0; l < layers; l++ {
		for _, kind := range []string{"key", "value"} {
			name := fmt.Sprintf("present.%d.%s", l, kind)
			o, ok := byName[name]
			if !ok {
				return bad("graph lacks output %s", name)
			}
			if o.Type != first.Type {
				return bad("%s has type %s, want %s like the past", name, o.Type, first.Type)
			}
			if kind == "key" {
				io.presK = append(io.presK, len(io.outNames))
			} else {
				io.presV = append(io.presV, len(io.outNames))
			}
			io.outNames = append(io.outNames, name)
		}
	}

	if meta.maxPositions <= 0 {
		return bad("config.json has no context length (max_position_embeddings)")
	}
	spec := Spec{
		NumLayers:    layers,
		NumKVHeads:   kvHeads,
		HeadDim:      headDim,
		VocabSize:    vocab,
		MaxPositions: meta.maxPositions,
		KVDType:      kvType,
		BOSTokenID:   meta.bos,
		EOSTokenIDs:  meta.eos,
	}
	return io, spec, nil
}

// parseKVName splits "past_key_values.3.key" into (3, "key").
func parseKVName(name, prefix string) (layer int, kind string, ok bool) {
	rest, found := strings.CutPrefix(name, prefix)
	if !found {
		return 0, "", false
	}
	num, kind, found := strings.Cut(rest, ".")
	if !found || (kind != "key" && kind != "value") {
		return 0, "", false
	}
	layer, err := strconv.Atoi(num)
	if err != nil || layer < 0 {
		return 0, "", false
	}
	return layer, kind, true
}

func sameKVShape(a, b []int64) bool {
	return len(a) == 4 && len(b) == 4 && a[1] == b[1] && a[3] == b[3]
}
