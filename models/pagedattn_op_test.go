package models

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/kernels"
	"github.com/conveyor-llm/conveyor/models/ort"
)

// pagedAttentionCase is one call of the PagedAttention operator: its attributes,
// dimensions and tensors (random contents, each row's blocks spread out of order).
type pagedAttentionCase struct {
	a kernels.PagedAttrs
	d kernels.PagedDims
	t kernels.PagedTensors
	// slotMapping, when set, is given as input 10, which the CPU operator refuses.
	slotMapping []int32
}

// newPagedAttentionCase makes a call with rows of (new tokens, past tokens): packed
// q|k|v when packed, cos and sin of rotaryDim when it is not 0.
func newPagedAttentionCase(a kernels.PagedAttrs, headDim, blockSize, rotaryDim int, packed bool, rows [][2]int) pagedAttentionCase {
	rng := rand.New(rand.NewPCG(uint64(headDim), uint64(blockSize)))
	uni := func(n int) []float32 {
		xs := make([]float32, n)
		for i := range xs {
			xs[i] = 2*rng.Float32() - 1
		}
		return xs
	}
	c := pagedAttentionCase{a: a, d: kernels.PagedDims{HeadDim: headDim, BlockSize: blockSize, Batch: len(rows)}}
	used, maxPos := 0, 0
	for _, r := range rows {
		c.d.Tokens += r[0]
		need := (r[0] + r[1] + blockSize - 1) / blockSize
		c.d.MaxBlocks = max(c.d.MaxBlocks, need+1)
		used += need
		maxPos = max(maxPos, r[0]+r[1])
	}
	c.d.NumBlocks = used + 2
	perm := rng.Perm(c.d.NumBlocks)
	t := &c.t
	t.CumSeqLens = []int32{0}
	for _, r := range rows {
		t.CumSeqLens = append(t.CumSeqLens, t.CumSeqLens[len(t.CumSeqLens)-1]+int32(r[0]))
		t.PastSeqLens = append(t.PastSeqLens, int32(r[1]))
		need := (r[0] + r[1] + blockSize - 1) / blockSize
		for i := range c.d.MaxBlocks {
			id := int32(-1)
			if i < need {
				id, perm = int32(perm[0]), perm[1:]
			}
			t.BlockTable = append(t.BlockTable, id)
		}
	}
	kvw := a.KVNumHeads * headDim
	if packed {
		t.Query = uni(c.d.Tokens * (a.NumHeads*headDim + 2*kvw))
	} else {
		t.Query, t.Key, t.Value = uni(c.d.Tokens*a.NumHeads*headDim), uni(c.d.Tokens*kvw), uni(c.d.Tokens*kvw)
	}
	t.KeyCache, t.ValueCache = uni(c.d.NumBlocks*blockSize*kvw), uni(c.d.NumBlocks*blockSize*kvw)
	if rotaryDim > 0 {
		c.d.RotaryDim, c.d.MaxPos = rotaryDim, maxPos+1
		for p := range c.d.MaxPos {
			for i := range rotaryDim / 2 {
				angle := float64(p) * math.Pow(10000, -2*float64(i)/float64(rotaryDim))
				t.Cos = append(t.Cos, float32(math.Cos(angle)))
				t.Sin = append(t.Sin, float32(math.Sin(angle)))
			}
		}
	}
	t.Out = make([]float32, c.d.Tokens*a.NumHeads*headDim)
	return c
}

// clone returns a copy of c whose tensors share nothing with c's.
func (c pagedAttentionCase) clone() pagedAttentionCase {
	t := c.t
	for _, s := range []*[]float32{&t.Query, &t.Key, &t.Value, &t.KeyCache, &t.ValueCache, &t.Cos, &t.Sin, &t.Out} {
		*s = slices.Clone(*s)
	}
	for _, s := range []*[]int32{&t.CumSeqLens, &t.PastSeqLens, &t.BlockTable, &t.Metadata} {
		*s = slices.Clone(*s)
	}
	t.KeyCacheHalf, t.ValueCacheHalf = slices.Clone(t.KeyCacheHalf), slices.Clone(t.ValueCacheHalf)
	c.t = t
	return c
}

// halfCaches returns c with its caches in float16 (KeyCacheHalf, ValueCacheHalf).
func (c pagedAttentionCase) halfCaches() pagedAttentionCase {
	c = c.clone()
	toHalf := func(xs []float32) []uint16 {
		h := make([]uint16, len(xs))
		for i, x := range xs {
			h[i] = kvcache.Float32ToFloat16(x)
		}
		return h
	}
	c.t.KeyCacheHalf, c.t.ValueCacheHalf = toHalf(c.t.KeyCache), toHalf(c.t.ValueCache)
	c.t.KeyCache, c.t.ValueCache = nil, nil
	return c
}

// pagedAttentionNode is a one-node graph of the com.conveyor PagedAttention operator
// with c's attributes and its 17 inputs (key and value, cos and sin, slot_mapping and
// attention_metadata absent where c has none; 11-15 absent), every dimension symbolic.
func pagedAttentionNode(c pagedAttentionCase) convert.OpNode {
	f32, i32, cache := convert.OpFloat32, convert.OpInt32, convert.OpFloat32
	if c.t.KeyCacheHalf != nil {
		cache = convert.OpFloat16
	}
	name := func(present bool, n string) string {
		if present {
			return n
		}
		return ""
	}
	return convert.OpNode{
		Domain: kernels.PagedDomain,
		OpType: kernels.PagedOpName,
		Inputs: []convert.OpValue{
			{Name: "query", Elem: f32, Dims: []int64{-1, -1}},
			{Name: name(c.t.Key != nil, "key"), Elem: f32, Dims: []int64{-1, -1}},
			{Name: name(c.t.Value != nil, "value"), Elem: f32, Dims: []int64{-1, -1}},
			{Name: "key_cache", Elem: cache, Dims: []int64{-1, -1, -1, -1}},
			{Name: "value_cache", Elem: cache, Dims: []int64{-1, -1, -1, -1}},
			{Name: "cumulative_sequence_length", Elem: i32, Dims: []int64{-1}},
			{Name: "past_seqlens", Elem: i32, Dims: []int64{-1}},
			{Name: "block_table", Elem: i32, Dims: []int64{-1, -1}},
			{Name: name(c.t.Cos != nil, "cos_cache"), Elem: f32, Dims: []int64{-1, -1}},
			{Name: name(c.t.Sin != nil, "sin_cache"), Elem: f32, Dims: []int64{-1, -1}},
			{Name: name(c.slotMapping != nil, "slot_mapping"), Elem: i32, Dims: []int64{-1}},
			{Elem: f32}, {Elem: f32}, {Elem: f32}, {Elem: f32}, {Elem: f32}, // head_sink, q/k norms, k/v scales
			{Name: name(c.t.Metadata != nil, "attention_metadata"), Elem: i32, Dims: []int64{-1}},
		},
		Outputs: []convert.OpValue{
			{Name: "output", Elem: f32, Dims: []int64{-1, -1}},
			{Name: "key_cache_out", Elem: cache, Dims: []int64{-1, -1, -1, -1}},
			{Name: "value_cache_out", Elem: cache, Dims: []int64{-1, -1, -1, -1}},
		},
		Ints: map[string]int64{
			"num_heads": int64(c.a.NumHeads), "kv_num_heads": int64(c.a.KVNumHeads),
			"local_window_size": int64(c.a.LocalWindowSize), "do_rotary": b2i64(c.a.DoRotary),
			"rotary_interleaved": b2i64(c.a.RotaryInterleaved),
		},
		Floats: map[string]float32{"scale": c.a.Scale, "softcap": c.a.Softcap},
	}
}

// openOpSession opens a session of node's one-node graph as the runners open theirs
// (Conveyor's operators registered, the shared pool). Its inputs are node's named ones,
// in order.
func openOpSession(t *testing.T, node convert.OpNode) (*ort.Session, error) {
	t.Helper()
	if err := InitORT(testORTLib(t)); err != nil {
		t.Fatal(err)
	}
	model, err := convert.OpModel(node)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "op.onnx")
	if err := os.WriteFile(path, model, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := openSession(path, RunnerOptions{})
	if err == nil {
		t.Cleanup(func() { _ = s.Close() })
	}
	return s, err
}

// pagedAttentionOp is a session of pagedAttentionNode(c).
func pagedAttentionOp(t *testing.T, c pagedAttentionCase) *ort.Session {
	t.Helper()
	s, err := openOpSession(t, pagedAttentionNode(c))
	if err != nil {
		t.Fatalf("session of the one-node PagedAttention graph: %v", err)
	}
	return s
}

func b2i64(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// runPagedAttentionOp runs s on c's tensors in place: the caches are bound as inputs 3
// and 4 and, as the very same tensors, as outputs 1 and 2, unless otherCaches, which
// binds fresh tensors of the caches' shape as outputs 1 and 2.
func runPagedAttentionOp(t *testing.T, s *ort.Session, c pagedAttentionCase, otherCaches bool) error {
	t.Helper()
	var values []*ort.Value
	tensor := func(shape []int64, data any) *ort.Value {
		var v *ort.Value
		var err error
		switch data := data.(type) {
		case []float32:
			v, err = hostTensor(ort.Float32, shape, data)
		case []int32:
			v, err = hostTensor(ort.Int32, shape, data)
		case []uint16: // float16 bits
			v, err = hostTensor(ort.Float16, shape, data)
		}
		if err != nil {
			t.Fatal(err)
		}
		values = append(values, v)
		return v
	}
	defer func() {
		for _, v := range values {
			v.Release()
		}
	}()
	d, a := c.d, c.a
	T, D := int64(d.Tokens), int64(d.HeadDim)
	kvw := int64(a.KVNumHeads) * D
	cacheShape := []int64{int64(d.NumBlocks), int64(d.BlockSize), int64(a.KVNumHeads), D}
	var kc, vc *ort.Value
	if c.t.KeyCacheHalf != nil {
		kc, vc = tensor(cacheShape, c.t.KeyCacheHalf), tensor(cacheShape, c.t.ValueCacheHalf)
	} else {
		kc, vc = tensor(cacheShape, c.t.KeyCache), tensor(cacheShape, c.t.ValueCache)
	}
	ins := []*ort.Value{tensor([]int64{T, int64(len(c.t.Query)) / max(T, 1)}, c.t.Query)}
	if c.t.Key != nil {
		ins = append(ins, tensor([]int64{T, kvw}, c.t.Key), tensor([]int64{T, kvw}, c.t.Value))
	}
	ins = append(ins, kc, vc,
		tensor([]int64{int64(d.Batch + 1)}, c.t.CumSeqLens),
		tensor([]int64{int64(d.Batch)}, c.t.PastSeqLens),
		tensor([]int64{int64(d.Batch), int64(d.MaxBlocks)}, c.t.BlockTable))
	if c.t.Cos != nil {
		rs := []int64{int64(d.MaxPos), int64(d.RotaryDim / 2)}
		ins = append(ins, tensor(rs, c.t.Cos), tensor(rs, c.t.Sin))
	}
	if c.slotMapping != nil {
		ins = append(ins, tensor([]int64{int64(len(c.slotMapping))}, c.slotMapping))
	}
	if c.t.Metadata != nil {
		ins = append(ins, tensor([]int64{int64(len(c.t.Metadata))}, c.t.Metadata))
	}
	outs := []*ort.Value{tensor([]int64{T, int64(a.NumHeads) * D}, c.t.Out), kc, vc}
	if otherCaches {
		outs[1] = tensor(cacheShape, slices.Clone(c.t.KeyCache))
		outs[2] = tensor(cacheShape, slices.Clone(c.t.ValueCache))
	}
	return s.Run(s.InputNames(), ins, s.OutputNames(), outs)
}

// pagedAttentionOpCases are mixed steps: a 4-token prompt at past 0, a 3-token chunk at
// past 16, decode rows at past 5 and 37, and a row without new tokens.
var pagedAttentionOpCases = []struct {
	name string
	c    func() pagedAttentionCase
}{
	{"qwen-shape/bs16/partial-rotary", func() pagedAttentionCase {
		return newPagedAttentionCase(kernels.PagedAttrs{NumHeads: 14, KVNumHeads: 2, DoRotary: true}, 64, 16, 32, false,
			[][2]int{{4, 0}, {3, 16}, {1, 5}, {0, 9}, {1, 37}})
	}},
	{"packed/bs16/window/softcap/interleaved/metadata", func() pagedAttentionCase {
		c := newPagedAttentionCase(kernels.PagedAttrs{NumHeads: 6, KVNumHeads: 3, DoRotary: true, RotaryInterleaved: true,
			LocalWindowSize: 6, Softcap: 30, Scale: 0.2}, 32, 16, 32, true, [][2]int{{4, 0}, {3, 16}, {1, 5}, {1, 37}})
		c.t.Metadata = []int32{4, 38}
		return c
	}},
	{"no-rotary/bs32/unknown-metadata", func() pagedAttentionCase {
		c := newPagedAttentionCase(kernels.PagedAttrs{NumHeads: 4, KVNumHeads: 4}, 16, 32, 0, false, [][2]int{{20, 3}, {1, 30}})
		c.t.Metadata = []int32{0, 0}
		return c
	}},
}

// TestPagedAttentionOp: the operator run through an ONNX Runtime session, its caches
// bound as inputs and outputs alike, gives exactly what kernels.PagedAttention gives on the same
// inputs: the same output and the same caches, with float32 caches and with float16 ones
// (the kernel ONNX Runtime picks by the caches' type).
func TestPagedAttentionOp(t *testing.T) {
	for _, tc := range pagedAttentionOpCases {
		for _, half := range []bool{false, true} {
			name := tc.name
			if half {
				name += "/float16-cache"
			}
			t.Run(name, func(t *testing.T) {
				c := tc.c()
				if half {
					c = c.halfCaches()
				}
				before := c.clone()
				want := c.clone()
				if err := kernels.PagedAttention(want.a, want.d, want.t); err != nil {
					t.Fatal(err)
				}
				s := pagedAttentionOp(t, c)
				if err := runPagedAttentionOp(t, s, c, false); err != nil {
					t.Fatalf("Run: %v", err)
				}
				if !slices.Equal(c.t.Out, want.t.Out) {
					t.Error("the operator's output differs from kernels.PagedAttention's")
				}
				if !slices.Equal(c.t.KeyCache, want.t.KeyCache) || !slices.Equal(c.t.ValueCache, want.t.ValueCache) ||
					!slices.Equal(c.t.KeyCacheHalf, want.t.KeyCacheHalf) || !slices.Equal(c.t.ValueCacheHalf, want.t.ValueCacheHalf) {
					t.Error("the operator's caches differ from kernels.PagedAttention's")
				}
				if slices.Equal(c.t.KeyCache, before.t.KeyCache) && slices.Equal(c.t.KeyCacheHalf, before.t.KeyCacheHalf) {
					t.Error("the operator did not update the key cache in place")
				}
			})
		}
	}
}

// TestPagedAttentionOpNeedsSameCacheBuffers: a run whose cache outputs are not the cache
// inputs fails as com.microsoft.PagedAttention does, and changes nothing.
func TestPagedAttentionOpNeedsSameCacheBuffers(t *testing.T) {
	c := pagedAttentionOpCases[0].c()
	before := c.clone()
	s := pagedAttentionOp(t, c)
	err := runPagedAttentionOp(t, s, c, true)
	if err == nil || !strings.Contains(err.Error(), "PagedAttention: key_cache and key_cache_out must be the same buffer") {
		t.Fatalf("err = %v, want the same-buffer error", err)
	}
	if !slices.Equal(c.t.KeyCache, before.t.KeyCache) || !slices.Equal(c.t.ValueCache, before.t.ValueCache) {
		t.Fatal("a refused run changed the caches")
	}
}

// TestPagedAttentionOpRefusesBadInput: bad inputs fail the run with a status that says
// what is wrong (never a crash), and the caches stay as they were.
func TestPagedAttentionOpRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		edit       func(c *pagedAttentionCase)
	}{
		{"block id past the cache", "block_table[1][0]", func(c *pagedAttentionCase) { c.t.BlockTable[c.d.MaxBlocks] = int32(c.d.NumBlocks) }},
		{"position past the block table", "reaches position", func(c *pagedAttentionCase) { c.t.PastSeqLens[4] = int32(c.d.MaxBlocks * c.d.BlockSize) }},
		{"cumulative lengths short of the tokens", "cumulative_sequence_length ends at", func(c *pagedAttentionCase) { c.t.CumSeqLens[c.d.Batch]-- }},
		{"cache of another head count", "key_cache and value_cache must both be", func(c *pagedAttentionCase) {
			*c = newPagedAttentionCase(kernels.PagedAttrs{NumHeads: 14, KVNumHeads: 1, DoRotary: true}, 64, 16, 32, false, [][2]int{{2, 3}})
		}},
		// What ONNX Runtime's CUDA kernel refuses, refused here in its words.
		{"rotary CUDA cannot take (Phi-3.5's 12 of a 16 head)", "cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8", func(c *pagedAttentionCase) {
			*c = newPagedAttentionCase(kernels.PagedAttrs{NumHeads: 4, KVNumHeads: 2, DoRotary: true}, 16, 16, 12, false, [][2]int{{3, 2}})
		}},
		{"blocks of 8 tokens", "block_size must be a power of two and at least 16", func(c *pagedAttentionCase) {
			*c = newPagedAttentionCase(kernels.PagedAttrs{NumHeads: 14, KVNumHeads: 2, DoRotary: true}, 64, 8, 32, false, [][2]int{{3, 2}})
		}},
		{"head size not a multiple of 8", "head_size must be a multiple of 8", func(c *pagedAttentionCase) {
			*c = newPagedAttentionCase(kernels.PagedAttrs{NumHeads: 14, KVNumHeads: 2}, 20, 16, 0, false, [][2]int{{3, 2}})
		}},
		{"attention_metadata of 3 values", "Input 'attention_metadata' must have shape (2), got (3)", func(c *pagedAttentionCase) { c.t.Metadata = []int32{4, 38, 1} }},
		{"negative attention_metadata", "'attention_metadata' entries must be non-negative, got [-1, 38]. Use 0 for 'unknown'.",
			func(c *pagedAttentionCase) { c.t.Metadata = []int32{-1, 38} }},
		{"slot_mapping", "input 10 (slot_mapping) is not supported", func(c *pagedAttentionCase) { c.slotMapping = make([]int32, c.d.Tokens) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := pagedAttentionOpCases[0].c()
			// The session is the edited call's, but for "cache of another head count",
			// whose point is a call of other head counts than its node's.
			s := pagedAttentionOp(t, c)
			tc.edit(&c)
			if tc.name != "cache of another head count" {
				s = pagedAttentionOp(t, c)
			}
			before := c.clone()
			err := runPagedAttentionOp(t, s, c, false)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %q", err, tc.want)
			}
			if !slices.Equal(c.t.KeyCache, before.t.KeyCache) || !slices.Equal(c.t.ValueCache, before.t.ValueCache) {
				t.Fatal("a refused run changed the caches")
			}
		})
	}
}

// TestPagedAttentionOpRefusesUnsupportedAttributes: com.microsoft.PagedAttention
// attributes whose other values the kernel does not implement fail the session's
// creation, as do missing head counts.
func TestPagedAttentionOpRefusesUnsupportedAttributes(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		edit       func(n *convert.OpNode)
	}{
		{"not causal", "is_causal = 0 is not supported", func(n *convert.OpNode) { n.Ints["is_causal"] = 0 }},
		{"smooth softmax", "smooth_softmax = 1 is not supported", func(n *convert.OpNode) { n.Ints["smooth_softmax"] = 1 }},
		{"no kv_num_heads", "kv_num_heads is required", func(n *convert.OpNode) { delete(n.Ints, "kv_num_heads") }},
		{"heads not a multiple", "multiple of kv_num_heads", func(n *convert.OpNode) { n.Ints["num_heads"] = 13 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := pagedAttentionNode(pagedAttentionOpCases[0].c())
			tc.edit(&node)
			if _, err := openOpSession(t, node); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}
