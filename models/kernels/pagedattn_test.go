package kernels

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// row is one sequence of a test call: n new tokens on top of past cached ones.
type row struct{ n, past int }

// testCall is a call's attributes, dimensions and tensors with random contents: the
// blocks of each row are spread over the cache out of order, the cache has blocks no
// row uses, and unused block_table columns are -1.
type testCall struct {
	a PagedAttrs
	d PagedDims
	t PagedTensors
}

type callSpec struct {
	a         PagedAttrs
	headDim   int
	blockSize int
	rows      []row
	rotaryDim int // 0: no cos and sin
	packed    bool
	seed      uint64
}

func newCall(s callSpec) testCall {
	rng := rand.New(rand.NewPCG(s.seed, 7))
	uni := func(n int) []float32 {
		xs := make([]float32, n)
		for i := range xs {
			xs[i] = 2*rng.Float32() - 1
		}
		return xs
	}
	a, D, bs := s.a, s.headDim, s.blockSize
	T, maxBlocks, used := 0, 0, 0
	for _, r := range s.rows {
		T += r.n
		need := (r.past + r.n + bs - 1) / bs
		maxBlocks = max(maxBlocks, need+1)
		used += need
	}
	numBlocks := used + 3
	perm := rng.Perm(numBlocks)
	c := testCall{a: a, d: PagedDims{Tokens: T, HeadDim: D, NumBlocks: numBlocks, BlockSize: bs, Batch: len(s.rows), MaxBlocks: maxBlocks}}
	t := &c.t
	t.CumSeqLens = []int32{0}
	for _, r := range s.rows {
		t.CumSeqLens = append(t.CumSeqLens, t.CumSeqLens[len(t.CumSeqLens)-1]+int32(r.n))
		t.PastSeqLens = append(t.PastSeqLens, int32(r.past))
		need := (r.past + r.n + bs - 1) / bs
		for i := range maxBlocks {
			id := int32(-1)
			if i < need {
				id, perm = int32(perm[0]), perm[1:]
			}
			t.BlockTable = append(t.BlockTable, id)
		}
	}
	kvw := a.KVNumHeads * D
	if s.packed {
		t.Query = uni(T * (a.NumHeads*D + 2*kvw))
	} else {
		t.Query, t.Key, t.Value = uni(T*a.NumHeads*D), uni(T*kvw), uni(T*kvw)
	}
	t.KeyCache, t.ValueCache = uni(numBlocks*bs*kvw), uni(numBlocks*bs*kvw)
	if s.rotaryDim > 0 {
		maxPos := 0
		for _, r := range s.rows {
			maxPos = max(maxPos, r.past+r.n)
		}
		maxPos += 2
		half := s.rotaryDim / 2
		c.d.RotaryDim, c.d.MaxPos = s.rotaryDim, maxPos
		for p := range maxPos {
			for i := range half {
				angle := float64(p) * math.Pow(10000, -float64(i)/float64(half))
				t.Cos = append(t.Cos, float32(math.Cos(angle)))
				t.Sin = append(t.Sin, float32(math.Sin(angle)))
			}
		}
	}
	t.Out = make([]float32, T*a.NumHeads*D)
	return c
}

// clone returns a deep copy of c's tensors.
func (c testCall) clone() testCall {
	t := c.t
	t.Query, t.Key, t.Value = slices.Clone(t.Query), slices.Clone(t.Key), slices.Clone(t.Value)
	t.KeyCache, t.ValueCache, t.Out = slices.Clone(t.KeyCache), slices.Clone(t.ValueCache), slices.Clone(t.Out)
	t.CumSeqLens, t.PastSeqLens, t.BlockTable = slices.Clone(t.CumSeqLens), slices.Clone(t.PastSeqLens), slices.Clone(t.BlockTable)
	t.Cos, t.Sin = slices.Clone(t.Cos), slices.Clone(t.Sin)
	c.t = t
	return c
}

// reference computes the operator from its definition in float64: the new keys
// (rotated) and values stored into copies of the caches, then for every new token and
// query head a dense softmax over the row's positions 0 ... p (within the window),
// gathered one by one through the block table. It returns the output and the caches.
func pagedReference(c testCall) (out []float64, kc, vc []float32) {
	a, d, t := c.a, c.d, c.t
	H, KV, D, bs := a.NumHeads, a.KVNumHeads, d.HeadDim, d.BlockSize
	kc, vc = slices.Clone(t.KeyCache), slices.Clone(t.ValueCache)
	packed := t.Key == nil
	qw := H * D
	if packed {
		qw += 2 * KV * D
	}
	rotate := func(x []float64, p int) {
		if !a.DoRotary {
			return
		}
		half := d.RotaryDim / 2
		for i := range half {
			cs, sn := float64(t.Cos[p*half+i]), float64(t.Sin[p*half+i])
			i0, i1 := i, i+half
			if a.RotaryInterleaved {
				i0, i1 = 2*i, 2*i+1
			}
			x0, x1 := x[i0], x[i1]
			x[i0], x[i1] = x0*cs-x1*sn, x1*cs+x0*sn
		}
	}
	vec := func(src []float32) []float64 {
		x := make([]float64, len(src))
		for i, v := range src {
			x[i] = float64(v)
		}
		return x
	}
	slot := func(b, p int) int { return int(t.BlockTable[b*d.MaxBlocks+p/bs])*bs + p%bs }
	for b := range d.Batch {
		for tok := int(t.CumSeqLens[b]); tok < int(t.CumSeqLens[b+1]); tok++ {
			p := int(t.PastSeqLens[b]) + tok - int(t.CumSeqLens[b])
			for g := range KV {
				var k, v []float32
				if packed {
					k = t.Query[tok*qw+(H+g)*D:][:D]
					v = t.Query[tok*qw+(H+KV+g)*D:][:D]
				} else {
					k, v = t.Key[(tok*KV+g)*D:][:D], t.Value[(tok*KV+g)*D:][:D]
				}
				kr := vec(k)
				rotate(kr, p)
				dst := (slot(b, p)*KV + g) * D
				for i := range D {
					kc[dst+i], vc[dst+i] = float32(kr[i]), v[i]
				}
			}
		}
	}
	scale := float64(a.Scale)
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(D))
	}
	out = make([]float64, d.Tokens*H*D)
	for b := range d.Batch {
		for tok := int(t.CumSeqLens[b]); tok < int(t.CumSeqLens[b+1]); tok++ {
			p := int(t.PastSeqLens[b]) + tok - int(t.CumSeqLens[b])
			first := 0
			if a.LocalWindowSize > 0 {
				first = max(0, p-a.LocalWindowSize+1)
			}
			for h := range H {
				g := h / (H / KV)
				q := vec(t.Query[tok*qw+h*D:][:D])
				rotate(q, p)
				scores := make([]float64, 0, p+1)
				top := math.Inf(-1)
				for j := first; j <= p; j++ {
					k := kc[(slot(b, j)*KV+g)*D:][:D]
					s := 0.0
					for i := range D {
						s += q[i] * float64(k[i])
					}
					s *= scale
					if a.Softcap > 0 {
						s = float64(a.Softcap) * math.Tanh(s/float64(a.Softcap))
					}
					scores = append(scores, s)
					top = max(top, s)
				}
				sum := 0.0
				for i := range scores {
					scores[i] = math.Exp(scores[i] - top)
					sum += scores[i]
				}
				o := out[(tok*H+h)*D:][:D]
				for j := first; j <= p; j++ {
					v := vc[(slot(b, j)*KV+g)*D:][:D]
					w := scores[j-first] / sum
					for i := range D {
						o[i] += w * float64(v[i])
					}
				}
			}
		}
	}
	return out, kc, vc
}

// mixedRows are a 4-token prompt at past 0, a 3-token chunk at past 16, decode rows at
// past 5 and 37, and a row without new tokens.
var mixedRows = []row{{4, 0}, {3, 16}, {1, 5}, {0, 9}, {1, 37}}

// manyRows is a decode batch: 20 rows of 1 to 3 new tokens over pasts of 0 to 133.
var manyRows = func() []row {
	rs := make([]row, 20)
	for i := range rs {
		rs[i] = row{1 + i%3, i * 7}
	}
	return rs
}()

var referenceCases = []struct {
	name string
	spec callSpec
}{
	{"qwen-shape/bs16/partial-rotary", callSpec{a: PagedAttrs{NumHeads: 14, KVNumHeads: 2, DoRotary: true}, headDim: 64, blockSize: 16, rows: mixedRows, rotaryDim: 32}},
	{"bs16/window/softcap/scale", callSpec{a: PagedAttrs{NumHeads: 6, KVNumHeads: 2, DoRotary: true, LocalWindowSize: 6, Softcap: 2, Scale: 0.3}, headDim: 32, blockSize: 16, rows: mixedRows, rotaryDim: 32}},
	{"packed/interleaved/bs32/partial", callSpec{a: PagedAttrs{NumHeads: 8, KVNumHeads: 2, DoRotary: true, RotaryInterleaved: true}, headDim: 48, blockSize: 32, rows: mixedRows, rotaryDim: 32, packed: true}},
	{"mha/head-24/no-rotary", callSpec{a: PagedAttrs{NumHeads: 3, KVNumHeads: 3}, headDim: 24, blockSize: 16, rows: mixedRows}},
	{"window-1/long-prefill", callSpec{a: PagedAttrs{NumHeads: 4, KVNumHeads: 1, LocalWindowSize: 1}, headDim: 16, blockSize: 16, rows: []row{{40, 3}, {1, 70}}}},
	{"window-20/chunk-over-blocks", callSpec{a: PagedAttrs{NumHeads: 4, KVNumHeads: 2, LocalWindowSize: 20, Softcap: 50}, headDim: 64, blockSize: 16, rows: []row{{35, 30}, {1, 100}, {2, 0}}}},
	{"many-rows/gqa-4-kv-heads", callSpec{a: PagedAttrs{NumHeads: 8, KVNumHeads: 4, DoRotary: true}, headDim: 64, blockSize: 16, rows: manyRows, rotaryDim: 64}},
	{"many-rows/window/softcap/head-40", callSpec{a: PagedAttrs{NumHeads: 6, KVNumHeads: 3, LocalWindowSize: 10, Softcap: 5}, headDim: 40, blockSize: 32, rows: manyRows}},
	{"long-block/past-over-tile", callSpec{a: PagedAttrs{NumHeads: 2, KVNumHeads: 1, DoRotary: true}, headDim: 128, blockSize: 128, rows: []row{{3, 250}, {1, 64}, {65, 0}}, rotaryDim: 128}},
}

// TestPagedAttentionMatchesReference: the output of every instruction set this CPU runs is within
// 1e-4 of the float64 reference, the new keys and values land in exactly their slots,
// and nothing else in the caches changes.
func TestPagedAttentionMatchesReference(t *testing.T) {
	defer setPagedISA(pagedISAByName(PagedAttentionISA()))
	for _, isa := range pagedISAs {
		if !setPagedISA(isa) {
			continue
		}
		for i, tc := range referenceCases {
			t.Run(pagedISAName(isa)+"/"+tc.name, func(t *testing.T) {
				tc.spec.seed = uint64(i + 1)
				c := newCall(tc.spec)
				if i%2 == 0 {
					c.t.Metadata = metadataOf(c) // checked and accepted; the result is the same
				}
				want, wantK, wantV := pagedReference(c)
				if err := PagedAttention(c.a, c.d, c.t); err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				for i, w := range want {
					worst = max(worst, math.Abs(float64(c.t.Out[i])-w))
				}
				if worst > 1e-4 {
					t.Errorf("max |out - reference| = %.3g, want <= 1e-4", worst)
				}
				for name, pair := range map[string][2][]float32{"key": {c.t.KeyCache, wantK}, "value": {c.t.ValueCache, wantV}} {
					for i := range pair[0] {
						if d := math.Abs(float64(pair[0][i] - pair[1][i])); d > 1e-5 {
							t.Fatalf("%s cache element %d = %g, want %g", name, i, pair[0][i], pair[1][i])
						}
					}
				}
			})
		}
	}
}

// TestPagedAttentionWritesOnlyNewSlots: the slots of the new tokens are the only cache elements
// that change, values are stored bit for bit, and keys without rotary too.
func TestPagedAttentionWritesOnlyNewSlots(t *testing.T) {
	c := newCall(callSpec{a: PagedAttrs{NumHeads: 4, KVNumHeads: 2}, headDim: 16, blockSize: 16, rows: mixedRows, seed: 3})
	before := c.clone()
	if err := PagedAttention(c.a, c.d, c.t); err != nil {
		t.Fatal(err)
	}
	kvw := c.a.KVNumHeads * c.d.HeadDim
	written := map[int]int{} // cache slot -> query row
	for b := range c.d.Batch {
		for tok := int(c.t.CumSeqLens[b]); tok < int(c.t.CumSeqLens[b+1]); tok++ {
			p := int(c.t.PastSeqLens[b]) + tok - int(c.t.CumSeqLens[b])
			written[int(c.t.BlockTable[b*c.d.MaxBlocks+p/c.d.BlockSize])*c.d.BlockSize+p%c.d.BlockSize] = tok
		}
	}
	for s := range c.d.NumBlocks * c.d.BlockSize {
		wantK, wantV := before.t.KeyCache[s*kvw:][:kvw], before.t.ValueCache[s*kvw:][:kvw]
		if tok, ok := written[s]; ok {
			wantK, wantV = c.t.Key[tok*kvw:][:kvw], c.t.Value[tok*kvw:][:kvw]
		}
		if !slices.Equal(c.t.KeyCache[s*kvw:][:kvw], wantK) || !slices.Equal(c.t.ValueCache[s*kvw:][:kvw], wantV) {
			t.Fatalf("slot %d (written: %v) holds the wrong keys or values", s, written[s])
		}
	}
}

// metadataOf returns the call's attention_metadata: its longest new-token run and its
// longest KV length (past + new).
func metadataOf(c testCall) []int32 {
	var maxQ, maxKV int32
	for b := range c.d.Batch {
		n := c.t.CumSeqLens[b+1] - c.t.CumSeqLens[b]
		maxQ, maxKV = max(maxQ, n), max(maxKV, c.t.PastSeqLens[b]+n)
	}
	return []int32{maxQ, maxKV}
}

// withHead and withBlock return s with another head size (and rotary size) or block size.
func withHead(s callSpec, head, rotary int) callSpec {
	s.headDim, s.rotaryDim = head, rotary
	s.a.DoRotary = rotary > 0
	return s
}

func withBlock(s callSpec, bs int) callSpec {
	s.blockSize = bs
	return s
}

// TestPagedAttentionRefusesBadInput: calls that break the contract fail with ErrPagedInput, naming what
// is wrong, and leave the caches and the output untouched.
func TestPagedAttentionRefusesBadInput(t *testing.T) {
	spec := callSpec{a: PagedAttrs{NumHeads: 4, KVNumHeads: 2, DoRotary: true}, headDim: 16, blockSize: 16, rows: mixedRows, rotaryDim: 16, seed: 5}
	cases := []struct {
		name, want string
		edit       func(c *testCall)
	}{
		{"block id past the cache", "block_table[1][1]", func(c *testCall) { c.t.BlockTable[1*c.d.MaxBlocks+1] = int32(c.d.NumBlocks) }},
		{"negative block id", "block_table[0][0]", func(c *testCall) { c.t.BlockTable[0] = -1 }},
		{"position past block_table", "block_table's", func(c *testCall) { c.t.PastSeqLens[4] = int32(c.d.MaxBlocks * c.d.BlockSize) }},
		{"position past cos_cache", "cos_cache", func(c *testCall) { c.d.MaxPos, c.t.Cos, c.t.Sin = 37, c.t.Cos[:37*8], c.t.Sin[:37*8] }},
		{"cumulative lengths start past 0", "cumulative_sequence_length[0]", func(c *testCall) { c.t.CumSeqLens[0] = 1 }},
		{"cumulative lengths decrease", "decreases", func(c *testCall) { c.t.CumSeqLens[2] = 2 }},
		{"cumulative lengths miss tokens", "ends at", func(c *testCall) { c.t.CumSeqLens[5]-- }},
		{"negative past", "negative", func(c *testCall) { c.t.PastSeqLens[0] = -1 }},
		{"short query", "len(Query)", func(c *testCall) { c.t.Query = c.t.Query[1:] }},
		{"short block table", "len(BlockTable)", func(c *testCall) { c.t.BlockTable = c.t.BlockTable[1:] }},
		{"short value cache", "len(ValueCache)", func(c *testCall) { c.t.ValueCache = c.t.ValueCache[1:] }},
		{"short output", "len(Out)", func(c *testCall) { c.t.Out = c.t.Out[1:] }},
		{"key without value", "both", func(c *testCall) { c.t.Value = nil }},
		{"cos without sin", "both", func(c *testCall) { c.t.Sin = nil }},
		{"rotary without cos", "cos_cache and sin_cache must be passed", func(c *testCall) { c.t.Cos, c.t.Sin, c.d.RotaryDim, c.d.MaxPos = nil, nil, 0, 0 }},
		{"rotary wider than the head", "cos_cache dimension 1 must be <= head_size / 2", func(c *testCall) {
			c.d.RotaryDim, c.t.Cos, c.t.Sin = 32, make([]float32, c.d.MaxPos*16), make([]float32, c.d.MaxPos*16)
		}},
		// CUDA's own limits (pagedattn_doc.go), each refused as ONNX Runtime's CUDA kernel words it.
		{"rotary width not a multiple of 8 (Phi-3.5's 0.75 of a 16 head)", "cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8", func(c *testCall) {
			c.d.RotaryDim, c.t.Cos, c.t.Sin = 12, make([]float32, c.d.MaxPos*6), make([]float32, c.d.MaxPos*6)
		}},
		{"cos and sin given without do_rotary still checked", "multiple of 8", func(c *testCall) {
			c.a.DoRotary, c.d.RotaryDim, c.t.Cos, c.t.Sin = false, 12, make([]float32, c.d.MaxPos*6), make([]float32, c.d.MaxPos*6)
		}},
		{"head size not a multiple of 8", "head_size must be a multiple of 8", func(c *testCall) { *c = newCall(withHead(spec, 12, 0)) }},
		{"rotary on a head not a multiple of 16", "head_size shall be a multiple of 16", func(c *testCall) { *c = newCall(withHead(spec, 24, 8)) }},
		{"head size past CUDA's largest", "above 1024", func(c *testCall) { *c = newCall(withHead(spec, 1032, 0)) }},
		{"block of 8 tokens", "block_size must be a power of two and at least 16", func(c *testCall) { *c = newCall(withBlock(spec, 8)) }},
		{"block of 24 tokens", "block_size must be a power of two and at least 16", func(c *testCall) { *c = newCall(withBlock(spec, 24)) }},
		{"too many heads", "num_heads should be no larger than 1024", func(c *testCall) { c.a.NumHeads, c.a.KVNumHeads = 2048, 2048 }},
		{"metadata of 3 values (later ONNX Runtimes' lower bound)", "must have shape (2), got (3)", func(c *testCall) { c.t.Metadata = []int32{4, 38, 1} }},
		{"empty metadata", "must have shape (2), got (0)", func(c *testCall) { c.t.Metadata = []int32{} }},
		{"negative metadata", "must be non-negative, got [4, -1]", func(c *testCall) { c.t.Metadata = []int32{4, -1} }},
		{"odd rotary dim", "RotaryDim", func(c *testCall) { c.d.RotaryDim = 7 }},
		{"heads not a multiple", "multiple of kv_num_heads", func(c *testCall) { c.a.KVNumHeads = 3 }},
		{"no kv heads", "must be positive", func(c *testCall) { c.a.KVNumHeads = 0 }},
		{"negative softcap", "softcap", func(c *testCall) { c.a.Softcap = -1 }},
		{"NaN scale", "scale", func(c *testCall) { c.a.Scale = float32(math.NaN()) }},
		{"negative dimension", "PagedDims.Batch", func(c *testCall) { c.d.Batch = -1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCall(spec)
			tc.edit(&c)
			before := c.clone()
			err := PagedAttention(c.a, c.d, c.t)
			if !errors.Is(err, ErrPagedInput) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrPagedInput naming %q", err, tc.want)
			}
			if !slices.Equal(c.t.KeyCache, before.t.KeyCache) || !slices.Equal(c.t.ValueCache, before.t.ValueCache) || !slices.Equal(c.t.Out, before.t.Out) {
				t.Fatal("a refused call changed the caches or the output")
			}
		})
	}
}

// TestPagedAttentionIdleRows: rows without new tokens are allowed, whatever their block table
// holds, and a call without tokens changes nothing.
func TestPagedAttentionIdleRows(t *testing.T) {
	c := newCall(callSpec{a: PagedAttrs{NumHeads: 2, KVNumHeads: 1}, headDim: 8, blockSize: 16, rows: []row{{0, 3}, {0, 0}}, seed: 9})
	for i := range c.t.BlockTable {
		c.t.BlockTable[i] = -7
	}
	before := c.clone()
	if err := PagedAttention(c.a, c.d, c.t); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.t.KeyCache, before.t.KeyCache) || !slices.Equal(c.t.ValueCache, before.t.ValueCache) {
		t.Fatal("a call without tokens changed the caches")
	}
	if err := PagedAttention(c.a, PagedDims{HeadDim: 8, BlockSize: 16}, PagedTensors{CumSeqLens: []int32{0}}); err != nil {
		t.Fatalf("empty batch: %v", err)
	}
}

// FuzzPagedAttention: whatever the dimensions, sequence lengths and block table, PagedAttention either
// refuses the call with ErrPagedInput or matches the reference; it never reads or writes out
// of bounds (which would crash the test binary).
func FuzzPagedAttention(f *testing.F) {
	f.Add(uint8(2), uint8(1), uint8(8), uint8(4), uint8(3), []byte{2, 1, 1, 3, 0, 5}, []byte{2, 3, 4}, int8(-1), false, true)
	f.Add(uint8(4), uint8(2), uint8(5), uint8(3), uint8(4), []byte{1, 9, 4, 1}, []byte{3, 2, 4, 5, 3, 2}, int8(3), true, false)
	f.Fuzz(func(t *testing.T, heads, kvHeads, headDim, blockSize, numBlocks uint8, rowBytes, table []byte, window int8, packed, rotary bool) {
		a := PagedAttrs{NumHeads: int(heads % 9), KVNumHeads: int(kvHeads % 5), LocalWindowSize: int(window), DoRotary: rotary}
		// Mostly shapes CUDA takes (heads of 8 to 40, blocks of 16 or 32), some it does not.
		hd, bs := int(headDim%5+1)*8, []int{16, 32, 16, 0, 24, 3}[blockSize%6]
		if headDim >= 0xf0 {
			hd = int(headDim % 20)
		}
		d := PagedDims{HeadDim: hd, BlockSize: bs, NumBlocks: int(numBlocks % 12), Batch: len(rowBytes) / 2}
		rng := rand.New(rand.NewPCG(uint64(len(table)), uint64(headDim)))
		tt := PagedTensors{CumSeqLens: []int32{0}}
		for b := range d.Batch {
			tt.CumSeqLens = append(tt.CumSeqLens, tt.CumSeqLens[b]+int32(rowBytes[2*b]%5))
			tt.PastSeqLens = append(tt.PastSeqLens, int32(rowBytes[2*b+1]%40)-1)
		}
		d.Tokens = int(tt.CumSeqLens[d.Batch])
		if d.Batch > 0 {
			d.MaxBlocks = len(table) / d.Batch
		}
		for _, v := range table[:d.Batch*d.MaxBlocks] {
			tt.BlockTable = append(tt.BlockTable, int32(v%16)-2)
		}
		fill := func(n int) []float32 {
			if n < 0 {
				n = 0
			}
			xs := make([]float32, n)
			for i := range xs {
				xs[i] = rng.Float32()
			}
			return xs
		}
		kvw := a.KVNumHeads * d.HeadDim
		if packed {
			tt.Query = fill(d.Tokens * (a.NumHeads*d.HeadDim + 2*kvw))
		} else {
			tt.Query, tt.Key, tt.Value = fill(d.Tokens*a.NumHeads*d.HeadDim), fill(d.Tokens*kvw), fill(d.Tokens*kvw)
		}
		tt.KeyCache, tt.ValueCache = fill(d.NumBlocks*d.BlockSize*kvw), fill(d.NumBlocks*d.BlockSize*kvw)
		if rotary {
			d.RotaryDim, d.MaxPos = 2*(d.HeadDim/2), 30
			tt.Cos, tt.Sin = fill(d.MaxPos*d.HeadDim/2), fill(d.MaxPos*d.HeadDim/2)
			if d.RotaryDim == 0 {
				tt.Cos, tt.Sin = nil, nil
			}
		}
		tt.Out = fill(d.Tokens * a.NumHeads * d.HeadDim)
		c := testCall{a: a, d: d, t: tt}
		before := c.clone()
		err := PagedAttention(a, d, tt)
		if err != nil {
			if !errors.Is(err, ErrPagedInput) {
				t.Fatalf("err = %v, want ErrPagedInput", err)
			}
			return
		}
		want, _, _ := pagedReference(before)
		for i, w := range want {
			if math.Abs(float64(tt.Out[i])-w) > 1e-4 {
				t.Fatalf("out[%d] = %g, reference %g", i, tt.Out[i], w)
			}
		}
	})
}

// pagedISAByName returns the instruction set named name.
func pagedISAByName(name string) int {
	for _, isa := range pagedISAs {
		if pagedISAName(isa) == name {
			return isa
		}
	}
	return pagedISAs[0]
}

// TestPagedAttentionHalfCache: with float16 caches, every instruction set stores each new key
// (rotated in float32) and value rounded to nearest even, bit for bit as
// kvcache.Float32ToFloat16 rounds them (large, tiny and subnormal values included),
// changes nothing else, and attends over the half values within 5e-3 of the float64
// reference (whose new keys and values are not rounded).
func TestPagedAttentionHalfCache(t *testing.T) {
	defer setPagedISA(pagedISAByName(PagedAttentionISA()))
	for _, isa := range pagedISAs {
		if !setPagedISA(isa) {
			continue
		}
		for i, tc := range referenceCases {
			t.Run(pagedISAName(isa)+"/"+tc.name, func(t *testing.T) {
				tc.spec.seed = uint64(i + 1)
				c := newCall(tc.spec)
				// The past in the cache is what a half cache holds: rounded.
				for _, cache := range [][]float32{c.t.KeyCache, c.t.ValueCache} {
					for j, x := range cache {
						cache[j] = kvcache.Float16ToFloat32(kvcache.Float32ToFloat16(x))
					}
				}
				// New values at the edges of float16's range (values are stored unrotated).
				vals := c.t.Value
				if vals == nil {
					vals = c.t.Query // packed: some of these are values, the rest scale queries harmlessly
				}
				for j, x := range []float32{65504, 65519, 65520, -1e5, 6.1e-5, 3e-6, 2.98e-8, 1e-9, -0.0} {
					if j < len(vals) {
						vals[len(vals)-1-j] = x
					}
				}
				_, wantK, wantV := pagedReference(c)
				// The outputs' reference attends over the new values as the half cache holds
				// them: 65520 and -1e5 become infinities.
				rounded := c
				if c.t.Value != nil {
					rounded.t.Value = slices.Clone(c.t.Value)
					vals = rounded.t.Value
				} else {
					rounded.t.Query = slices.Clone(c.t.Query)
					vals = rounded.t.Query
				}
				for j := range min(9, len(vals)) {
					vals[len(vals)-1-j] = kvcache.Float16ToFloat32(kvcache.Float32ToFloat16(vals[len(vals)-1-j]))
				}
				want, _, _ := pagedReference(rounded)
				kh, vh := halves(c.t.KeyCache), halves(c.t.ValueCache)
				c.t.KeyCache, c.t.ValueCache, c.t.KeyCacheHalf, c.t.ValueCacheHalf = nil, nil, kh, vh
				if err := PagedAttention(c.a, c.d, c.t); err != nil {
					t.Fatal(err)
				}
				for name, pair := range map[string]struct {
					got  []uint16
					want []float32
				}{"key": {kh, wantK}, "value": {vh, wantV}} {
					for j, w := range pair.want {
						wh := kvcache.Float32ToFloat16(w)
						if g := pair.got[j]; g != wh && (name == "value" || absDiff16(g, wh) > 1) {
							t.Fatalf("%s cache element %d = %#04x, want %#04x (%g rounded)", name, j, g, wh, w)
						}
					}
				}
				worst := 0.0
				for j, w := range want {
					// Rows that attend over the infinities are left out; rows that give the
					// huge edge values some weight are as large as that weight makes them.
					if math.Abs(w) < 1e3 {
						worst = max(worst, math.Abs(float64(c.t.Out[j])-w)/max(1, math.Abs(w)))
					}
				}
				if worst > 5e-3 {
					t.Errorf("max |out - reference| / max(1, |reference|) = %.3g, want <= 5e-3", worst)
				}
			})
		}
	}
}

// absDiff16 is the distance between two half floats' bit patterns of the same sign.
func absDiff16(a, b uint16) int {
	if a > b {
		return int(a - b)
	}
	return int(b - a)
}

// halves rounds xs to IEEE half floats.
func halves(xs []float32) []uint16 {
	h := make([]uint16, len(xs))
	for i, x := range xs {
		h[i] = kvcache.Float32ToFloat16(x)
	}
	return h
}
