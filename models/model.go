package models

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"unsafe"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// Sentinel errors of the runners. Every error returned by Open or Forward wraps
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
	// DeviceMemory returns the free and total memory of the model's GPU in bytes; a
	// model on the CPU has none and returns an error.
	DeviceMemory() (free, total int64, err error)
	Close() error
}

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
	// LayerGroups, when set, is each layer's KV group as the model's step graph was built
	// (modeldir.StepManifest.LayerGroups): the groups its cache takes (CacheLayout).
	LayerGroups []int
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

// CacheLayout returns how the engine groups the cache's layers for a context of maxLen
// tokens (kvcache.PlanLayout over LayerWindows). A model with LayerGroups takes either
// those groups or, when no window of its is shorter than maxLen, one group; a token-major
// model without them (a GPU step graph) takes one group, its windows applied inside the
// attention over every layer's whole past.
func (s Spec) CacheLayout(maxLen int) kvcache.Layout {
	lay := kvcache.PlanLayout(s.LayerWindows, s.NumLayers, maxLen)
	switch {
	case lay.LayerGroups == nil || !s.KVTokenMajor:
		return lay
	case s.LayerGroups == nil:
		return kvcache.PlanLayout(nil, s.NumLayers, maxLen)
	}
	return kvcache.LayoutOf(s.LayerGroups, s.LayerWindows)
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

// RunnerOptions configure OpenDense.
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
	// Attention selects the attention path for Open: AttentionGraph, AttentionDense, or
	// "" for the device's default (see Open).
	Attention string
	// KVCacheDType is the KV cache's element type: "float32", "float16", "" or
	// KVCacheAuto for the model's own (the type a step graph was built for; the graph's
	// type on the dense path, where it cannot be changed). A type the model was not built
	// for is refused.
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

// KVCacheAuto is the KVCacheDType that serving defaults to: the model's own. A checkpoint
// is built for the CPU with a float16 cache (half the bytes every decode step reads,
// twice the tokens in the same memory; the default model's perplexity is unchanged to
// four digits).
const KVCacheAuto = "auto"

// Validate reports whether the options are usable.
func (o RunnerOptions) Validate() error {
	if o.IntraOpThreads < 0 || o.IntraOpThreads > MaxIntraOpThreads() {
		return fmt.Errorf("%w: intra-op threads %d: want 0 (all cores) to %d", ErrModelDir, o.IntraOpThreads, MaxIntraOpThreads())
	}
	if o.KVCacheDType != "" && o.KVCacheDType != KVCacheAuto && o.KVCacheDType != Float32.String() && o.KVCacheDType != Float16.String() {
		return fmt.Errorf("%w: KV cache dtype %q: want float32, float16 or auto", ErrModelDir, o.KVCacheDType)
	}
	if o.Attention == "paged" {
		// The per-layer segments of earlier releases: the step graph runs every model they did.
		return fmt.Errorf("%w: attention %q is retired: the step graph (%s, the default) runs every model Conveyor builds", ErrModelDir, o.Attention, AttentionGraph)
	}
	if o.Attention != "" && o.Attention != AttentionDense && o.Attention != AttentionGraph {
		return fmt.Errorf("%w: attention %q: want %s or %s", ErrModelDir, o.Attention, AttentionGraph, AttentionDense)
	}
	if o.Device != "" && o.Device != DeviceCPU && o.Device != DeviceCUDA && o.Device != DeviceAuto {
		return fmt.Errorf("%w: device %q: want %s, %s or %s", ErrModelDir, o.Device, DeviceCPU, DeviceCUDA, DeviceAuto)
	}
	return nil
}

// MaxIntraOpThreads is the most intra-op threads a runner takes: eight per core. More
// only oversubscribe the cores, and a mistyped count (100000) would start that many
// threads and exhaust the machine's memory.
func MaxIntraOpThreads() int { return 8 * runtime.NumCPU() }

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

// growBytes is grow for tensor memory: 8-byte aligned, so that a tensor of any element
// type over it is aligned.
func growBytes(buf []byte, n int) []byte {
	if cap(buf) >= n {
		return buf[:n]
	}
	words := make([]uint64, (n+n/4+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)[:n]
}

// checkBatch validates the batch for a model of spec and returns the longest past and
// new-token counts.
func checkBatch(b *Batch, spec Spec) (maxPast, maxNew int, err error) {
	if b == nil || len(b.Seqs) == 0 {
		return 0, 0, fmt.Errorf("%w: empty batch", ErrBatch)
	}
	blockSize := 0
	if b.Cache != nil {
		c := b.Cache.Config()
		if c.Layers != spec.NumLayers || c.KVHeads != spec.NumKVHeads || c.HeadDim != spec.HeadDim || c.DType != spec.KVDType {
			return 0, 0, fmt.Errorf("%w: the cache holds %d layers of %d KV heads x %d %s values, the model has %d of %d x %d %s",
				ErrBatch, c.Layers, c.KVHeads, c.HeadDim, c.DType, spec.NumLayers, spec.NumKVHeads, spec.HeadDim, spec.KVDType)
		}
		blockSize = c.BlockSizeTokens
	}
	vocab := int32(spec.VocabSize)
	for i, s := range b.Seqs {
		n := len(s.Tokens)
		switch {
		case n == 0:
			return 0, 0, fmt.Errorf("%w: row %d has no tokens", ErrBatch, i)
		case s.PastLen < 0:
			return 0, 0, fmt.Errorf("%w: row %d has negative past length %d", ErrBatch, i, s.PastLen)
		case s.PastLen > spec.MaxPositions-n:
			return 0, 0, fmt.Errorf("%w: row %d: %d past + %d new tokens exceed the context of %d tokens",
				ErrBatch, i, s.PastLen, n, spec.MaxPositions)
		case s.PastLen > 0 && b.Cache == nil:
			return 0, 0, fmt.Errorf("%w: row %d has %d past tokens but the batch has no cache", ErrBatch, i, s.PastLen)
		case b.Cache != nil && len(s.GroupBlocks) != b.Cache.NumGroups()-1:
			return 0, 0, fmt.Errorf("%w: row %d has %d block tables for a cache of %d layer groups",
				ErrBatch, i, 1+len(s.GroupBlocks), b.Cache.NumGroups())
		}
		if b.Cache != nil {
			for g := range 1 + len(s.GroupBlocks) {
				if t := s.table(g); len(t)*blockSize < s.PastLen+n {
					return 0, 0, fmt.Errorf("%w: row %d: a block table of %d blocks of %d tokens cannot hold %d positions",
						ErrBatch, i, len(t), blockSize, s.PastLen+n)
				}
			}
		}
		for j, t := range s.Tokens {
			if t < 0 || t >= vocab {
				return 0, 0, fmt.Errorf("%w: row %d token %d: id %d outside the vocabulary [0, %d)", ErrBatch, i, j, t, vocab)
			}
		}
		maxPast = max(maxPast, s.PastLen)
		maxNew = max(maxNew, n)
	}
	return maxPast, maxNew, nil
}
