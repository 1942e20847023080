package models

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/modeldir"
	"github.com/conveyor-llm/conveyor/models/ort"
	onnx "github.com/yalue/onnxruntime_go"
)

// Sentinel errors of the runner. Every error returned by OpenRunner or Forward wraps
// one of these (or ErrORT).
var (
	// ErrModelDir means the model directory cannot be served: model.onnx or config.json
	// is missing or malformed, or the graph does not follow the decoder interface.
	ErrModelDir = errors.New("models: unusable model directory")
	// ErrBatch means a Forward call's batch is invalid (empty, a row without tokens, a
	// token id outside the vocabulary, a past beyond the context window...).
	ErrBatch = errors.New("models: invalid batch")
	// ErrRun means the forward pass itself failed: ONNX Runtime, the attention kernel, or
	// moving keys and values between the cache and the model.
	ErrRun = errors.New("models: forward pass failed")
)

// DType is the element type of key/value tensors: the KV cache's own (kvcache.DType),
// one enum for the model's spec and the cache.
type DType = kvcache.DType

// Supported key/value element types.
const (
	Float32 = kvcache.Float32
	Float16 = kvcache.Float16
)

// Spec is what the engine needs to know about a loaded model. It comes from the ONNX
// graph's inputs and outputs, config.json and generation_config.json.
type Spec struct {
	NumLayers, NumKVHeads, HeadDim, VocabSize int
	// MaxPositions is the context length in tokens.
	MaxPositions int
	KVDType      DType
	// BOSTokenID is -1 when the model has none.
	BOSTokenID int32
	// EOSTokenIDs lists config.json's and generation_config.json's eos ids, deduplicated.
	EOSTokenIDs []int32
	// LayerWindows, when known, is each layer's sliding window in tokens (0: the layer
	// attends to the whole past). The engine groups the layers by it so that sliding
	// layers give back the KV blocks their window has passed; nil treats every layer as
	// full.
	LayerWindows []int
	// KVTokenMajor says the model reads and writes the cache token-major
	// (kvcache.StorageConfig.TokenMajor: the step graph's PagedAttention layout).
	KVTokenMajor bool
	// KVOnDevice says the cache lives on the model's device (a GPU): the batch's storage
	// then only describes it (kvcache.StorageConfig.NoArenas), and the model copies blocks
	// itself (BlockCopier).
	KVOnDevice bool
	// MinBlockSize, when not 0, says the model's attention takes only KV blocks of a power
	// of two of at least this many tokens (PagedAttention's 16 on the CPU; on a GPU the
	// smallest with which ONNX Runtime runs FlashAttention for the head size).
	MinBlockSize int
}

// DefaultBlockSize is the KV block size in tokens when none is asked for and the model's
// attention takes any.
const DefaultBlockSize = 16

// BlockSize returns the KV block size to serve the model with: asked, or when asked is
// 0 the model's default (DefaultBlockSize, or MinBlockSize when larger). A size the
// model's attention cannot take is an error naming what it takes.
func (s Spec) BlockSize(asked int) (int, error) {
	if asked == 0 {
		return max(DefaultBlockSize, s.MinBlockSize), nil
	}
	if s.MinBlockSize > 0 && (asked < s.MinBlockSize || asked&(asked-1) != 0) {
		why := "the step graph's PagedAttention takes blocks of a power of two of at least %d tokens"
		if s.KVOnDevice {
			why = "on the GPU, blocks are a power of two of at least %d tokens, the smallest with which FlashAttention runs for heads of %d (the default)"
			return 0, fmt.Errorf("--block-size %d: "+why, asked, s.MinBlockSize, s.HeadDim)
		}
		return 0, fmt.Errorf("--block-size %d: "+why, asked, s.MinBlockSize)
	}
	return asked, nil
}

// BlockCopier is implemented by a model whose KV cache lives on its device
// (Spec.KVOnDevice): it copies whole blocks there, in order, as
// kvcache.Storage.ApplyCopies does on the host.
type BlockCopier interface {
	CopyBlocks(ops []kvcache.CopyOp) error
}

// CacheWindows returns the windows the engine groups the cache's layers by: LayerWindows,
// or nil (one group, every layer keeping its whole past) for a model that reads a
// token-major cache, whose graph applies the windows itself.
func (s Spec) CacheWindows() []int {
	if s.KVTokenMajor {
		return nil
	}
	return s.LayerWindows
}

// KVBytesPerToken returns the bytes one token's keys and values take over all layers.
func (s Spec) KVBytesPerToken() int {
	return 2 * s.NumLayers * s.NumKVHeads * s.HeadDim * s.KVDType.Size()
}

// table returns the row's block table of layer group g.
func (s *SeqInput) table(g int) []kvcache.BlockID {
	if g == 0 {
		return s.Blocks
	}
	return s.GroupBlocks[g-1]
}

// RunnerOptions configure OpenRunner.
type RunnerOptions struct {
	// ORTLib is the ONNX Runtime library path; "" = $CONVEYOR_ORT_LIB or DefaultORTLib.
	ORTLib string
	// IntraOpThreads is ONNX Runtime's thread count inside one operator; 0 = all cores.
	IntraOpThreads int
	// NoSpin keeps the shared intra-op pool's workers from spinning between runs
	// (they then sleep and are woken for each run). Spinning workers run at SCHED_IDLE,
	// so they yield to any other thread, but they keep a core busy while the engine
	// runs. The first runner opened in a process sets the pool; runners whose
	// IntraOpThreads differ from it, or that ask for NoSpin when it spins, get a pool
	// of their own, which never spins; asking to spin when it does not is an error.
	NoSpin bool
	// Attention selects the attention path for Open: AttentionPaged, AttentionDense,
	// AttentionGraph, or "" for the device's default (see Open).
	Attention string
	// KVCacheDType is the KV cache's element type: "float32", "float16", "" for the
	// model's own (float32 on the paged path; the graph's type on the dense path, where
	// it cannot be changed), or KVCacheAuto.
	KVCacheDType string
	// Device is where the model runs: DeviceCPU, DeviceCUDA, or DeviceAuto ("" too): the
	// GPU when one is usable, else the CPU.
	Device string
	// CUDAProvider is ONNX Runtime's CUDA provider library for DeviceCUDA and DeviceAuto;
	// "" = $CONVEYOR_ORT_CUDA_PROVIDER or onnx.DefaultCUDAProvider (where `make ort-gpu`
	// puts it).
	CUDAProvider string
}

// The devices a model can run on (RunnerOptions.Device).
const (
	DeviceCPU  = "cpu"
	DeviceCUDA = "cuda"
	DeviceAuto = "auto"
)

// KVCacheAuto is the KVCacheDType that serving defaults to: float16 on the paged path
// (half the bytes every decode step reads, twice the tokens in the same memory; the
// default model's perplexity is unchanged to four digits), the graph's own type on the
// dense path.
const KVCacheAuto = "auto"

// Validate reports whether the options are usable.
func (o RunnerOptions) Validate() error {
	if o.IntraOpThreads < 0 {
		return fmt.Errorf("%w: intra-op threads %d < 0", ErrModelDir, o.IntraOpThreads)
	}
	if o.KVCacheDType != "" && o.KVCacheDType != KVCacheAuto && o.KVCacheDType != Float32.String() && o.KVCacheDType != Float16.String() {
		return fmt.Errorf("%w: KV cache dtype %q: want float32, float16 or auto", ErrModelDir, o.KVCacheDType)
	}
	if o.Attention != "" && o.Attention != AttentionPaged && o.Attention != AttentionDense && o.Attention != AttentionGraph {
		return fmt.Errorf("%w: attention %q: want %s, %s or %s", ErrModelDir, o.Attention, AttentionPaged, AttentionDense, AttentionGraph)
	}
	if o.Device != "" && o.Device != DeviceCPU && o.Device != DeviceCUDA && o.Device != DeviceAuto {
		return fmt.Errorf("%w: device %q: want %s, %s or %s", ErrModelDir, o.Device, DeviceCPU, DeviceCUDA, DeviceAuto)
	}
	return nil
}

// Batch is the input of one forward pass: one row per sequence, and the KV cache the
// rows' block tables point into. It is plain data, like vLLM's attention metadata: each
// runner uses the cache its own way (the paged runner attends over the blocks in place,
// the dense runner gathers each row's past out of them and scatters the new keys and
// values back), and no runner asks what kind of cache it was given.
type Batch struct {
	Seqs []SeqInput
	// Cache holds every layer's keys and values in the blocks the rows' block tables
	// name; its layers, KV heads, head size and element type are the model's (Spec).
	// The pass reads each row's past from it and writes the new tokens' keys and values
	// into it. nil means no cache: nothing is read or kept, and every row must have
	// PastLen 0.
	Cache *kvcache.Storage
}

// SeqInput is one row of a Batch.
type SeqInput struct {
	// Tokens are the new tokens fed this pass (at least one).
	Tokens []int32
	// PastLen is the number of tokens already in the KV cache; the new tokens take
	// positions PastLen .. PastLen+len(Tokens)-1.
	PastLen int
	// Blocks is the row's block table in the batch's Cache: entry i holds positions
	// [i*BlockSizeTokens, (i+1)*BlockSizeTokens). It covers at least PastLen+len(Tokens)
	// positions, and no other row of the batch reads or writes the blocks the new tokens
	// go to (the pool's copy-on-write sees to that). It is not read when Cache is nil.
	// With layer groups (kvcache.StorageConfig.LayerGroups) it is group 0's table.
	Blocks []kvcache.BlockID
	// GroupBlocks are the tables of groups 1, 2, ... of a Cache with layer groups, each
	// like Blocks; a sliding group's entries its window has passed are kvcache.NoBlock.
	GroupBlocks [][]kvcache.BlockID
	// AllLogits asks for the logits of every new position (prompt logprobs, echo);
	// otherwise only the last position's are returned.
	AllLogits bool
	// ArgmaxOnly says the caller needs only the last position's argmax (greedy decoding
	// that nothing else reads the logits of): a runner may then leave Logits[b] nil and
	// set Argmax[b], so that a GPU step copies back one id, not a vocabulary of floats.
	// Runners that do not may ignore it. Not with AllLogits.
	ArgmaxOnly bool
}

// Output is the result of Forward.
type Output struct {
	// Logits[b] is row b's logits: VocabSize floats (last new position) or
	// len(Tokens)*VocabSize when AllLogits. Valid until the next Forward. It is nil for a
	// row that asked for ArgmaxOnly when the runner returned its Argmax instead.
	Logits [][]float32
	// Argmax, when set, holds each row's last-position argmax (ties go to the lowest id);
	// it is set whenever a Logits row is nil.
	Argmax []int32
}

// Runner runs forward passes of one decoder model through ONNX Runtime. Forward calls
// are serialised; the runner reuses its buffers from call to call.
type Runner struct {
	mu      sync.Mutex
	session *onnx.DynamicAdvancedSession
	spec    Spec
	io      decoderIO

	inputs, outputs []onnx.Value // per-call tensors, destroyed after each Forward

	ids, pos, mask []int64
	// kvMem holds past K, past V, present K and present V, each as NumLayers
	// consecutive [B, kvh, tokens, hd] tensors (tokens = maxPast, or maxPast+maxNew
	// for present); kvViews[kind][l] is layer l's tensor.
	kvMem     [4][]byte
	kvViews   [4][][]byte
	empty     []byte    // backing for zero-sized tensors
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

// OpenRunner loads dir/model.onnx (plus config.json and generation_config.json) into an
// ONNX Runtime session. Any graph with the Hugging Face Optimum decoder interface
// (input_ids, attention_mask, position_ids, past_key_values.{i}.key/value -> logits,
// present.{i}.key/value) loads; layers, KV heads, head size and KV type come from
// the graph. InitORT(opts.ORTLib) is called first.
func OpenRunner(dir string, opts RunnerOptions) (*Runner, error) {
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
	ins, outs, err := graphInfo(modelPath)
	if err != nil {
		return nil, err
	}
	io, spec, err := parseDecoderIO(ins, outs, meta)
	if err != nil {
		return nil, err
	}
	if opts.KVCacheDType != "" && opts.KVCacheDType != KVCacheAuto && opts.KVCacheDType != spec.KVDType.String() {
		return nil, fmt.Errorf("%w: %s keeps its KV cache in %s on the dense path; a %s cache needs the paged path",
			ErrModelDir, modelPath, spec.KVDType, opts.KVCacheDType)
	}

	so, err := newSessionOptions(opts)
	if err != nil {
		return nil, err
	}
	defer so.Destroy()
	unlock := ort.CreatingSession()
	sess, err := onnx.NewDynamicAdvancedSession(modelPath, io.inNames, io.outNames, so)
	unlock()
	if err != nil {
		return nil, fmt.Errorf("%w: cannot load %s: %s", ErrModelDir, modelPath, oneLine(err.Error()))
	}
	if man, err := modeldir.LoadPaged(dir); err == nil && len(man.Layers) == spec.NumLayers {
		spec.LayerWindows = man.LayerWindows() // the same model's paged layout knows its windows
	}
	r := &Runner{
		session:  sess,
		spec:     spec,
		io:       io,
		inputs:   make([]onnx.Value, len(io.inNames)),
		outputs:  make([]onnx.Value, len(io.outNames)),
		useCache: make([]bool, 1),
		cost:     newCostModel(spec, modelWeightBytes(dir)),
	}
	for i := range r.kvViews {
		r.kvViews[i] = make([][]byte, spec.NumLayers)
	}
	r.empty = growBytes(nil, 8)
	return r, nil
}

// pool returns the shared pool's settings these options ask for.
func (o RunnerOptions) pool() ort.PoolOptions {
	return ort.PoolOptions{Threads: o.IntraOpThreads, Spin: !o.NoSpin}
}

// newSessionOptions returns ONNX Runtime session options for opts; the caller destroys them.
func newSessionOptions(opts RunnerOptions) (*onnx.SessionOptions, error) {
	so, err := onnx.NewSessionOptions()
	if err != nil {
		return nil, fmt.Errorf("%w: session options: %s", ErrORT, oneLine(err.Error()))
	}
	threads := opts.IntraOpThreads
	if threads == 0 {
		threads = runtime.NumCPU()
	}
	for _, set := range []func() error{
		func() error { return so.SetIntraOpNumThreads(threads) },
		func() error { return so.SetInterOpNumThreads(1) },
		func() error { return so.SetExecutionMode(onnx.ExecutionModeSequential) },
		func() error { return so.SetGraphOptimizationLevel(onnx.GraphOptimizationLevelEnableAll) },
		// A pool of the session's own would be one more thread spinning per session.
		func() error { return so.AddSessionConfigEntry("session.intra_op.allow_spinning", "0") },
		func() error { return so.AddSessionConfigEntry("session.inter_op.allow_spinning", "0") },
	} {
		if err := set(); err != nil {
			so.Destroy()
			return nil, fmt.Errorf("%w: session options: %s", ErrORT, oneLine(err.Error()))
		}
	}
	if err := ort.RegisterOps(so); err != nil {
		so.Destroy()
		return nil, fmt.Errorf("%w: session options: %s", ErrORT, oneLine(err.Error()))
	}
	share, err := ort.SharesPool(threads, !opts.NoSpin)
	if err != nil {
		so.Destroy()
		return nil, err
	}
	if share {
		if err := ort.UseSharedPool(so); err != nil {
			so.Destroy()
			return nil, fmt.Errorf("%w: session options: %s", ErrORT, oneLine(err.Error()))
		}
	}
	return so, nil
}

// Spec returns what the engine needs to know about the model.
func (r *Runner) Spec() Spec {
	s := r.spec
	s.EOSTokenIDs = append([]int32(nil), s.EOSTokenIDs...)
	return s
}

// Close releases the ONNX Runtime session. It is idempotent; Forward after Close fails.
func (r *Runner) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.session == nil {
		return nil
	}
	err := r.session.Destroy()
	r.session = nil
	if err != nil {
		return fmt.Errorf("%w: close session: %s", ErrRun, oneLine(err.Error()))
	}
	return nil
}

// graphInfo reads the graph's input and output names, shapes and types. It loads the
// model once without graph optimisation, which is cheap next to the real session.
func graphInfo(modelPath string) (ins, outs []onnx.InputOutputInfo, err error) {
	so, err := onnx.NewSessionOptions()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: session options: %s", ErrORT, oneLine(err.Error()))
	}
	defer so.Destroy()
	_ = so.SetGraphOptimizationLevel(onnx.GraphOptimizationLevelDisableAll)
	_ = so.SetIntraOpNumThreads(1)
	ins, outs, err = onnx.GetInputOutputInfoWithOptions(modelPath, so)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: cannot load %s: %s", ErrModelDir, modelPath, oneLine(err.Error()))
	}
	return ins, outs, nil
}

// parseDecoderIO checks that the graph follows the decoder interface and derives the Spec.
func parseDecoderIO(ins, outs []onnx.InputOutputInfo, meta modelMeta) (decoderIO, Spec, error) {
	io := decoderIO{ids: -1, mask: -1, pos: -1, useCache: -1, logits: -1}
	bad := func(format string, args ...any) (decoderIO, Spec, error) {
		return decoderIO{}, Spec{}, fmt.Errorf("%w: %s", ErrModelDir, fmt.Sprintf(format, args...))
	}
	pastK := map[int]onnx.InputOutputInfo{}
	pastV := map[int]onnx.InputOutputInfo{}
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
			if in.DataType != onnx.TensorElementDataTypeBool {
				return bad("input use_cache_branch has type %s, want bool", in.DataType)
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
			if in.DataType != onnx.TensorElementDataTypeInt64 {
				return bad("input %s has type %s, want int64", in.Name, in.DataType)
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
	if len(first.Dimensions) != 4 {
		return bad("past_key_values.0.key has shape %v, want [batch, kv_heads, past, head_dim]", first.Dimensions)
	}
	kvHeads, headDim := int(first.Dimensions[1]), int(first.Dimensions[3])
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
	switch first.DataType {
	case onnx.TensorElementDataTypeFloat:
		kvType = Float32
	case onnx.TensorElementDataTypeFloat16:
		kvType = Float16
	default:
		return bad("past_key_values have type %s, want float32 or float16", first.DataType)
	}
	for l := 0; l < layers; l++ {
		for _, in := range []onnx.InputOutputInfo{pastK[l], pastV[l]} {
			if in.DataType != first.DataType || !sameKVShape(in.Dimensions, first.Dimensions) {
				return bad("%s has %s %v, unlike past_key_values.0.key (%s %v)", in.Name, in.DataType, in.Dimensions, first.DataType, first.Dimensions)
			}
		}
	}
	for l := 0; l < layers; l++ {
		io.pastK = append(io.pastK, slices.Index(io.inNames, pastK[l].Name))
		io.pastV = append(io.pastV, slices.Index(io.inNames, pastV[l].Name))
	}

	// Outputs: only logits and present.* are requested from the session.
	byName := map[string]onnx.InputOutputInfo{}
	for _, o := range outs {
		byName[o.Name] = o
	}
	lg, ok := byName["logits"]
	if !ok {
		return bad("graph has no logits output")
	}
	if len(lg.Dimensions) != 3 {
		return bad("logits have shape %v, want [batch, seq, vocab]", lg.Dimensions)
	}
	switch lg.DataType {
	case onnx.TensorElementDataTypeFloat:
	case onnx.TensorElementDataTypeFloat16:
		io.logitsF16 = true
	default:
		return bad("logits have type %s, want float32 or float16", lg.DataType)
	}
	vocab := int(lg.Dimensions[2])
	if vocab <= 0 {
		vocab = meta.vocabSize
	}
	if vocab <= 0 {
		return bad("cannot tell the vocabulary size from the graph or config.json")
	}
	io.logitsLastOnly = lg.Dimensions[1] == 1
	io.logits = 0
	io.outNames = append(io.outNames, "logits")
	for l := 0; l < layers; l++ {
		for _, kind := range []string{"key", "value"} {
			name := fmt.Sprintf("present.%d.%s", l, kind)
			o, ok := byName[name]
			if !ok {
				return bad("graph lacks output %s", name)
			}
			if o.DataType != first.DataType {
				return bad("%s has type %s, want %s like the past", name, o.DataType, first.DataType)
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

func sameKVShape(a, b onnx.Shape) bool {
	return len(a) == 4 && len(b) == 4 && a[1] == b[1] && a[3] == b[3]
}

// modelMeta is what the runner reads from config.json and generation_config.json. It
// is deliberately lenient (any decoder family's config), unlike Config.
type modelMeta struct {
	vocabSize, maxPositions, numKVHeads, headDim int
	bos                                          int32
	eos                                          []int32
}

func readModelMeta(dir string) (modelMeta, error) {
	m := modelMeta{bos: -1}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return m, fmt.Errorf("%w: no config.json in %s", ErrModelDir, dir)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return m, fmt.Errorf("%w: config.json: %s", ErrModelDir, oneLine(err.Error()))
	}
	num := func(keys ...string) int {
		for _, k := range keys {
			var v float64
			if json.Unmarshal(cfg[k], &v) == nil && v > 0 && v < math.MaxInt32 {
				return int(v)
			}
		}
		return 0
	}
	m.vocabSize = num("vocab_size")
	m.maxPositions = num("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
	heads := num("num_attention_heads", "n_head")
	m.numKVHeads = num("num_key_value_heads")
	if m.numKVHeads == 0 {
		m.numKVHeads = heads
	}
	m.headDim = num("head_dim")
	if hidden := num("hidden_size", "n_embd"); m.headDim == 0 && heads > 0 {
		m.headDim = hidden / heads
	}
	var bos, eos modeldir.TokenIDs
	if json.Unmarshal(cfg["bos_token_id"], &bos) == nil && len(bos) > 0 && bos[0] >= 0 {
		m.bos = bos[0]
	}
	_ = json.Unmarshal(cfg["eos_token_id"], &eos)
	gen, err := modeldir.LoadGenerationConfig(dir)
	if err != nil {
		return m, fmt.Errorf("%w: %w", ErrModelDir, err)
	}
	if m.bos < 0 && gen.BOSTokenID != nil && *gen.BOSTokenID >= 0 {
		m.bos = *gen.BOSTokenID
	}
	m.eos = modeldir.MergeEOS(eos, gen)
	return m, nil
}

// grow returns buf resized to n elements, reallocating only when it is too small.
func grow[T any](buf []T, n int) []T {
	if cap(buf) >= n {
		return buf[:n]
	}
	return make([]T, n, n+n/4)
}

// growBytes is grow for tensor memory: 8-byte aligned and never empty (ONNX Runtime
// refuses a zero-length data pointer even for tensors with a zero dimension).
func growBytes(buf []byte, n int) []byte {
	if n < 8 {
		n = 8
	}
	if cap(buf) >= n {
		return buf[:n]
	}
	words := make([]uint64, (n+n/4+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)[:n]
}
