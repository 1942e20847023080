package attention

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// testCase is one layer shape and one step of sequences over a paged cache.
type testCase struct {
	name      string
	p         Params
	blockSize int
	// Each sequence: past length and new tokens. Sequence i > 0 with share[i] = n
	// starts with sequence 0's first n blocks (a shared prefix).
	past, new []int
	share     []int
}

func llamaRotary(dims int, theta float64) Rotary {
	inv := make([]float32, dims/2)
	for i := range inv {
		inv[i] = float32(1 / math.Pow(theta, float64(2*i)/float64(dims)))
	}
	return Rotary{Dims: dims, InvFreq: inv}
}

func testCases() []testCase {
	gqa := Params{NumHeads: 12, NumKVHeads: 4, HeadDim: 64, Scale: 0.125, Rotary: llamaRotary(64, 10000)}
	mha := Params{NumHeads: 4, NumKVHeads: 4, HeadDim: 32, Scale: 1, Rotary: llamaRotary(32, 10000)}
	mqa := Params{NumHeads: 8, NumKVHeads: 1, HeadDim: 24, Scale: 0.2, Rotary: llamaRotary(24, 500000)}
	partial := Params{NumHeads: 4, NumKVHeads: 2, HeadDim: 40, Scale: 0.16, Rotary: llamaRotary(16, 10000)}
	partial.Rotary.AttentionFactor = 1.2
	norot := Params{NumHeads: 6, NumKVHeads: 2, HeadDim: 20, Scale: 0.3}
	window := gqa
	window.SlidingWindow = 7
	softcap := mha
	softcap.Softcap = 2
	// Qwen2.5-0.5B's attention: 14 query heads over 2 KV heads (groups of 7).
	qwen := Params{NumHeads: 14, NumKVHeads: 2, HeadDim: 64, Scale: 0.125, Rotary: llamaRotary(64, 1000000)}
	return []testCase{
		{name: "gqa-decode", p: gqa, blockSize: 16, past: []int{0, 1, 15, 16, 17, 100}, new: []int{1, 1, 1, 1, 1, 1}},
		{name: "gqa-prefill-and-decode", p: gqa, blockSize: 16, past: []int{0, 33, 5, 64}, new: []int{40, 1, 19, 3}},
		{name: "mha-block1", p: mha, blockSize: 1, past: []int{0, 9, 3}, new: []int{5, 1, 7}},
		{name: "mqa-odd-block", p: mqa, blockSize: 5, past: []int{12, 0, 7}, new: []int{1, 23, 2}},
		{name: "partial-rotary", p: partial, blockSize: 8, past: []int{3, 20}, new: []int{9, 1}},
		{name: "no-rotary", p: norot, blockSize: 4, past: []int{0, 11}, new: []int{6, 2}},
		{name: "sliding-window", p: window, blockSize: 4, past: []int{0, 30, 3, 9}, new: []int{20, 1, 2, 12}},
		{name: "softcap", p: softcap, blockSize: 16, past: []int{5, 40}, new: []int{3, 1}},
		{name: "group7-decode", p: qwen, blockSize: 16, past: []int{0, 2, 3, 16, 127, 300}, new: []int{1, 1, 1, 1, 1, 1}},
		{name: "group7-prefill", p: qwen, blockSize: 16, past: []int{0, 70}, new: []int{37, 20}},
		{name: "softcap-prefill", p: softcap, blockSize: 16, past: []int{0, 9}, new: []int{20, 17}},
		{name: "shared-prefix", p: gqa, blockSize: 8, past: []int{24, 24, 30}, new: []int{1, 5, 2}, share: []int{0, 16, 24}},
	}
}

// setup builds the case's cache with randomly placed blocks holding random past keys
// and values, the block tables and random q|k|v rows for the new tokens.
func (tc testCase) setup(seed uint64) (Cache, []Seq, []float32) {
	rng := rand.New(rand.NewPCG(seed, 1))
	p, bs := tc.p, tc.blockSize
	numBlocks := 0
	for i := range tc.past {
		numBlocks += (tc.past[i]+tc.new[i])/bs + 1
	}
	numBlocks += 3 // unused blocks
	free := rng.Perm(numBlocks)
	size := numBlocks * p.NumKVHeads * bs * p.HeadDim
	k, v := make([]float32, size), make([]float32, size)
	for i := range k {
		k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	seqs := make([]Seq, len(tc.past))
	for i := range seqs {
		need := (tc.past[i] + tc.new[i] + bs - 1) / bs
		var table []int32
		if i > 0 && tc.share != nil && tc.share[i] > 0 {
			table = append(table, seqs[0].Table[:tc.share[i]/bs]...)
		}
		for len(table) < need {
			table = append(table, int32(free[0]))
			free = free[1:]
		}
		seqs[i] = Seq{Table: table, PastLen: tc.past[i], NumNew: tc.new[i]}
	}
	tokens := 0
	for _, n := range tc.new {
		tokens += n
	}
	qkv := make([]float32, tokens*p.QKVCols())
	for i := range qkv {
		qkv[i] = float32(rng.NormFloat64())
	}
	return Cache{K: bytesOf(k), V: bytesOf(v), NumBlocks: numBlocks, BlockSize: bs, DType: kvcache.Float32}, seqs, qkv
}

func bytesOf(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), len(f)*4)
}

func cloneCache(c Cache) Cache {
	c.K, c.V = slices.Clone(c.K), slices.Clone(c.V)
	return c
}

// isas lists the instruction sets this CPU can run, generic first.
func isas() []int {
	out := []int{isaGeneric}
	for _, isa := range []int{isaAVX2, isaAVX512} {
		if isa <= bestISA {
			out = append(out, isa)
		}
	}
	return out
}

// TestRunMatchesReference runs every case on every instruction set, on float32 arenas
// and on float16 arenas (whose reference reads the same float16 values and rounds the new
// keys and values as they are stored), and checks the output and the arenas.
func TestRunMatchesReference(t *testing.T) {
	for _, dt := range []kvcache.DType{kvcache.Float32, kvcache.Float16} {
		// float16: the output carries the rounding of the stored keys and values, and a
		// stored value may be one float16 step off (rotation in float32 here, float64 there).
		attTol, arenaTol := 2e-5, 1e-5
		if dt == kvcache.Float16 {
			attTol, arenaTol = 1e-4, 1e-3
		}
		for _, tc := range testCases() {
			for _, isa := range isas() {
				t.Run(fmt.Sprintf("%s/%s/%s", dt, tc.name, isaName(isa)), func(t *testing.T) {
					cache, seqs, qkv := tc.setup(7)
					refK, refV := slices.Clone(floats(cache.K)), slices.Clone(floats(cache.V))
					if dt == kvcache.Float16 {
						cache, refK, refV = toHalf(cache)
					}
					want := referenceRun(tc.p, cache, refK, refV, seqs, qkv, dt == kvcache.Float16)
					l, err := NewLayer(tc.p, 4096)
					if err != nil {
						t.Fatal(err)
					}
					l.isa = isa
					att := make([]float32, len(want))
					if err := l.Run(cache, seqs, slices.Clone(qkv), att); err != nil {
						t.Fatal(err)
					}
					for i := range want {
						if d := math.Abs(float64(att[i]) - want[i]); d > attTol*(1+math.Abs(want[i])) {
							t.Fatalf("att[%d] = %v, reference %v (diff %.2g)", i, att[i], want[i], d)
						}
					}
					gotK, gotV := arenaValues(cache)
					for i := range refK {
						for _, kv := range [][2]float32{{gotK[i], refK[i]}, {gotV[i], refV[i]}} {
							if d := math.Abs(float64(kv[0] - kv[1])); d > arenaTol*math.Max(1, math.Abs(float64(kv[1]))) {
								t.Fatalf("arena element %d: K %v V %v, reference K %v V %v", i, gotK[i], gotV[i], refK[i], refV[i])
							}
						}
					}
				})
			}
		}
	}
}

// arenaValues returns a cache's keys and values as float32.
func arenaValues(c Cache) (k, v []float32) {
	if c.DType != kvcache.Float16 {
		return floats(c.K), floats(c.V)
	}
	widen := func(h []uint16) []float32 {
		f := make([]float32, len(h))
		for i, x := range h {
			f[i] = kvcache.Float16ToFloat32(x)
		}
		return f
	}
	return widen(halves(c.K)), widen(halves(c.V))
}

// toHalf returns a float16 copy of a float32 cache and the float32 values it holds.
func toHalf(c Cache) (Cache, []float32, []float32) {
	k, v := floats(c.K), floats(c.V)
	hk, hv := make([]uint16, len(k)), make([]uint16, len(v))
	rk, rv := make([]float32, len(k)), make([]float32, len(v))
	for i := range k {
		hk[i], hv[i] = kvcache.Float32ToFloat16(k[i]), kvcache.Float32ToFloat16(v[i])
		rk[i], rv[i] = kvcache.Float16ToFloat32(hk[i]), kvcache.Float16ToFloat32(hv[i])
	}
	hb := func(h []uint16) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(h))), len(h)*2) }
	c.K, c.V, c.DType = hb(hk), hb(hv), kvcache.Float16
	return c, rk, rv
}

// TestChunkedEqualsWhole checks that a prompt computed in chunks, each attending to
// the blocks the earlier chunks wrote, gives the output of one pass over the prompt.
func TestChunkedEqualsWhole(t *testing.T) {
	tc := testCase{p: testCases()[0].p, blockSize: 16, past: []int{0}, new: []int{50}}
	cache, seqs, qkv := tc.setup(3)
	chunked := cloneCache(cache)
	l, err := NewLayer(tc.p, 4096)
	if err != nil {
		t.Fatal(err)
	}
	whole := make([]float32, 50*tc.p.OutCols())
	if err := l.Run(cache, seqs, slices.Clone(qkv), whole); err != nil {
		t.Fatal(err)
	}
	cols, out := tc.p.QKVCols(), tc.p.OutCols()
	for _, ch := range [][2]int{{0, 13}, {13, 14}, {14, 50}} {
		part := make([]float32, (ch[1]-ch[0])*out)
		s := []Seq{{Table: seqs[0].Table, PastLen: ch[0], NumNew: ch[1] - ch[0]}}
		if err := l.Run(chunked, s, slices.Clone(qkv[ch[0]*cols:ch[1]*cols]), part); err != nil {
			t.Fatal(err)
		}
		for i := range part {
			w := whole[ch[0]*out+i]
			if math.Abs(float64(part[i]-w)) > 1e-5 {
				t.Fatalf("chunk %v: att[%d] = %v, one pass %v", ch, i, part[i], w)
			}
		}
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	tc := testCases()[1]
	for _, bad := range []struct {
		name   string
		modify func(c *Cache, seqs []Seq, qkv, att *[]float32)
	}{
		{"negative block", func(c *Cache, s []Seq, _, _ *[]float32) { s[1].Table[2] = -1 }},
		{"block past the arena", func(c *Cache, s []Seq, _, _ *[]float32) { s[2].Table[0] = int32(c.NumBlocks) }},
		{"short table", func(c *Cache, s []Seq, _, _ *[]float32) { s[0].Table = s[0].Table[:2] }},
		{"past beyond context", func(c *Cache, s []Seq, _, _ *[]float32) { s[3].PastLen = 5000 }},
		{"negative past", func(c *Cache, s []Seq, _, _ *[]float32) { s[3].PastLen = -1 }},
		{"no new tokens", func(c *Cache, s []Seq, _, _ *[]float32) { s[0].NumNew = 0 }},
		{"short qkv", func(_ *Cache, _ []Seq, q, _ *[]float32) { *q = (*q)[:len(*q)-1] }},
		{"short att", func(_ *Cache, _ []Seq, _, a *[]float32) { *a = (*a)[:len(*a)-1] }},
		{"short arena", func(c *Cache, _ []Seq, _, _ *[]float32) { c.V = c.V[:len(c.V)-4] }},
		{"more blocks than the arena", func(c *Cache, _ []Seq, _, _ *[]float32) { c.NumBlocks++ }},
		{"unknown arena type", func(c *Cache, _ []Seq, _, _ *[]float32) { c.DType = 7 }},
		{"float16 arenas too short", func(c *Cache, _ []Seq, _, _ *[]float32) {
			c.DType, c.K, c.V = kvcache.Float16, c.K[:len(c.K)/2], c.V[:len(c.V)/2-2]
		}},
		{"zero block size", func(c *Cache, _ []Seq, _, _ *[]float32) { c.BlockSize = 0 }},
	} {
		t.Run(bad.name, func(t *testing.T) {
			cache, seqs, qkv := tc.setup(1)
			att := make([]float32, 63*tc.p.OutCols())
			bad.modify(&cache, seqs, &qkv, &att)
			before := cloneCache(cache)
			l, err := NewLayer(tc.p, 4096)
			if err != nil {
				t.Fatal(err)
			}
			err = l.Run(cache, seqs, qkv, att)
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("Run = %v, want ErrBadInput", err)
			}
			if !slices.Equal(cache.K, before.K) || !slices.Equal(cache.V, before.V) {
				t.Fatal("a refused Run wrote to the cache")
			}
		})
	}
}

func TestParamsValidate(t *testing.T) {
	good := testCases()[0].p
	for _, bad := range []func(p *Params){
		func(p *Params) { p.NumKVHeads = 5 },
		func(p *Params) { p.NumHeads = 0 },
		func(p *Params) { p.Scale = 0 },
		func(p *Params) { p.Rotary.Dims = 66 },
		func(p *Params) { p.Rotary.Dims = 31 },
		func(p *Params) { p.Rotary.InvFreq = p.Rotary.InvFreq[:3] },
		func(p *Params) { p.SlidingWindow = -1 },
		func(p *Params) { p.Softcap = -1 },
	} {
		p := good
		p.Rotary.InvFreq = slices.Clone(p.Rotary.InvFreq)
		bad(&p)
		if err := p.Validate(); !errors.Is(err, ErrBadInput) {
			t.Errorf("Validate(%+v) = %v, want ErrBadInput", p, err)
		}
		if _, err := NewLayer(p, 10); err == nil {
			t.Errorf("NewLayer(%+v) accepted", p)
		}
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestRopeBeyondTable checks positions past the shared rotary table.
func TestRopeBeyondTable(t *testing.T) {
	p := Params{NumHeads: 2, NumKVHeads: 1, HeadDim: 16, Scale: 0.25, Rotary: llamaRotary(16, 10000), SlidingWindow: 4}
	tc := testCase{p: p, blockSize: 4096, past: []int{ropeTablePositions + 5}, new: []int{2}}
	cache, seqs, qkv := tc.setup(9)
	ref := cloneCache(cache)
	want := referenceRun(p, ref, floats(ref.K), floats(ref.V), seqs, qkv)
	l, err := NewLayer(p, ropeTablePositions+100)
	if err != nil {
		t.Fatal(err)
	}
	att := make([]float32, len(want))
	if err := l.Run(cache, seqs, qkv, att); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Abs(float64(att[i])-want[i]) > 1e-4 {
			t.Fatalf("att[%d] = %v, reference %v", i, att[i], want[i])
		}
	}
}
