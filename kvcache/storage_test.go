package kvcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// kvShape is a storage shape for tests.
type kvShape struct {
	layers, heads, dim, bs int
	dt                     DType
}

func (sh kvShape) tokBytes() int { return sh.dim * sh.dt.Size() }

// denseBufs returns per-layer K and V buffers of rows*heads*tokens*dim elements, filled with fill.
func denseBufs(sh kvShape, rows, tokens int, fill byte) (k, v [][]byte) {
	for range sh.layers {
		kb := bytes.Repeat([]byte{fill}, rows*sh.heads*tokens*sh.tokBytes())
		vb := bytes.Repeat([]byte{fill}, rows*sh.heads*tokens*sh.tokBytes())
		k, v = append(k, kb), append(v, vb)
	}
	return k, v
}

// kvRef is the reference model of a batch's K/V: ref[kv][layer][row][head] holds the bytes of
// positions 0..len-1, one token (dim elements) after another.
type kvRef struct {
	sh   kvShape
	data [2][][][][]byte
}

func newKVRef(sh kvShape, rows int) *kvRef {
	r := &kvRef{sh: sh}
	for kv := range 2 {
		r.data[kv] = make([][][][]byte, sh.layers)
		for l := range sh.layers {
			r.data[kv][l] = make([][][]byte, rows)
			for b := range rows {
				r.data[kv][l][b] = make([][]byte, sh.heads)
			}
		}
	}
	return r
}

// randomElems returns n elements of dt as bytes, from random values in [-4, 4).
func randomElems(r *rand.Rand, dt DType, n int) []byte {
	f := make([]float32, n)
	for i := range f {
		f[i] = float32(r.Float64()*8 - 4)
	}
	out := make([]byte, n*dt.Size())
	Encode(dt, out, f)
	return out
}

// presentFor builds dense present buffers [rows, heads, srcTokens, dim] holding random new
// tokens at columns [off, off+counts[b]), garbage elsewhere, and appends them to the reference.
func (ref *kvRef) presentFor(r *rand.Rand, counts []int, srcTokens, off int) (k, v [][]byte) {
	sh := ref.sh
	tb := sh.tokBytes()
	k, v = denseBufs(sh, len(counts), srcTokens, 0x5a)
	for kv, bufs := range [2][][]byte{k, v} {
		for l := range sh.layers {
			for b, n := range counts {
				for h := range sh.heads {
					vals := randomElems(r, sh.dt, n*sh.dim)
					at := ((b*sh.heads+h)*srcTokens + off) * tb
					copy(bufs[l][at:at+len(vals)], vals)
					ref.data[kv][l][b][h] = append(ref.data[kv][l][b][h], vals...)
				}
			}
		}
	}
	return k, v
}

// checkGathered compares dense past buffers with the reference: row b's first pastLens[b]
// tokens equal the reference, everything after is zero.
func (ref *kvRef) checkGathered(t *testing.T, k, v [][]byte, pastLens []int, maxPast int) {
	t.Helper()
	sh := ref.sh
	tb := sh.tokBytes()
	zero := make([]byte, tb)
	for kv, bufs := range [2][][]byte{k, v} {
		for l := range sh.layers {
			for b, past := range pastLens {
				for h := range sh.heads {
					for pos := range maxPast {
						at := ((b*sh.heads+h)*maxPast + pos) * tb
						got := bufs[l][at : at+tb]
						want := zero
						if pos < past {
							want = ref.data[kv][l][b][h][pos*tb : (pos+1)*tb]
						}
						if !bytes.Equal(got, want) {
							t.Fatalf("kv %d layer %d row %d head %d pos %d (past %d): got % x, want % x",
								kv, l, b, h, pos, past, got, want)
						}
					}
				}
			}
		}
	}
}

func newStorageFor(t testing.TB, sh kvShape, blocks, par int) *Storage {
	t.Helper()
	s, err := NewStorage(StorageConfig{NumBlocks: blocks, BlockSizeTokens: sh.bs, Layers: sh.layers,
		KVHeads: sh.heads, HeadDim: sh.dim, DType: sh.dt, Parallelism: par})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestScatterGatherRoundTrip prefills a batch, decodes a few steps (each scattered from a
// different column offset), and gathers the past after every step, comparing with the
// reference: exact bytes for float32 and float16, zero padding, block boundaries crossed.
func TestScatterGatherRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		sh      kvShape
		prompts []int
		par     int
	}{
		{"float32", kvShape{3, 2, 5, 4, Float32}, []int{1, 4, 5, 9, 16, 3}, 1},
		{"float16", kvShape{2, 3, 8, 4, Float16}, []int{7, 1, 12, 4}, 1},
		{"block size 1", kvShape{2, 1, 3, 1, Float32}, []int{3, 1, 2}, 1},
		{"one row", kvShape{1, 1, 4, 16, Float16}, []int{33}, 1},
		{"float32 parallel", kvShape{4, 4, 64, 16, Float32}, []int{300, 17, 129, 64, 1, 250, 90, 33}, 2},
		{"float16 parallel", kvShape{4, 4, 64, 16, Float16}, []int{300, 17, 129, 64, 1, 250, 90, 33}, 3},
	}
	for ti, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(ti), 9))
			sh := tc.sh
			blocks := 0
			for _, n := range tc.prompts {
				blocks += (n+8+sh.bs-1)/sh.bs + 1
			}
			p := newTestPool(t, blocks, sh.bs, false)
			s := newStorageFor(t, sh, blocks, tc.par)
			rows := len(tc.prompts)
			ref := newKVRef(sh, rows)
			tables := make([][]BlockID, rows)
			lens := make([]int, rows)
			// Prefill: new tokens at column offset 0 of a buffer as long as the longest prompt.
			maxPrompt := slices.Max(tc.prompts)
			for b, n := range tc.prompts {
				mustAlloc(t, p, SeqID(b), n)
			}
			for b := range rows {
				tables[b] = p.BlockTable(SeqID(b))
			}
			k, v := ref.presentFor(r, tc.prompts, maxPrompt, 0)
			zeros := make([]int, rows)
			if err := s.Scatter(tables, zeros, tc.prompts, maxPrompt, 0, k, v); err != nil {
				t.Fatal(err)
			}
			copy(lens, tc.prompts)
			for step := range 4 {
				maxPast := slices.Max(lens) + step // extra padding on later steps
				gk, gv := denseBufs(sh, rows, maxPast, 0xee)
				if err := s.Gather(tables, lens, maxPast, gk, gv); err != nil {
					t.Fatal(err)
				}
				ref.checkGathered(t, gk, gv, lens, maxPast)
				// Decode: 0..2 new tokens per row, stored at columns [maxPast, ...) of a present
				// buffer [rows, heads, maxPast+2, dim], as the model returns them.
				counts := make([]int, rows)
				for b := range rows {
					counts[b] = r.IntN(3)
					mustAlloc(t, p, SeqID(b), counts[b])
					tables[b] = p.BlockTable(SeqID(b))
				}
				k, v := ref.presentFor(r, counts, maxPast+2, maxPast)
				if err := s.Scatter(tables, lens, counts, maxPast+2, maxPast, k, v); err != nil {
					t.Fatal(err)
				}
				for b := range rows {
					lens[b] += counts[b]
				}
			}
		})
	}
}

// TestForkCopyOnWriteData forks a sequence with a partial last block, appends different
// tokens to parent and child, and checks both read back their own data.
func TestForkCopyOnWriteData(t *testing.T) {
	sh := kvShape{2, 2, 4, 4, Float32}
	r := rand.New(rand.NewPCG(5, 5))
	p := newTestPool(t, 16, sh.bs, true)
	s := newStorageFor(t, sh, 16, 1)
	ref := newKVRef(sh, 2) // row 0: parent, row 1: child
	mustAlloc(t, p, 1, 6)
	k, v := ref.presentFor(r, []int{6, 0}, 6, 0)
	table := [][]BlockID{p.BlockTable(1), nil}
	if err := s.Scatter(table, []int{0, 0}, []int{6, 0}, 6, 0, k, v); err != nil {
		t.Fatal(err)
	}
	if err := p.Fork(1, 2); err != nil {
		t.Fatal(err)
	}
	for kv := range 2 {
		for l := range sh.layers {
			for h := range sh.heads {
				ref.data[kv][l][1][h] = slices.Clone(ref.data[kv][l][0][h])
			}
		}
	}
	// The child appends first (gets a copy), then the parent (now sole owner, no copy).
	for i, seq := range []SeqID{2, 1} {
		cow := mustAlloc(t, p, seq, 1)
		if (len(cow) == 1) != (i == 0) {
			t.Fatalf("append %d: cow %v", i, cow)
		}
		if err := s.ApplyCopies(cow); err != nil {
			t.Fatal(err)
		}
		counts := []int{0, 0}
		counts[seq-1] = 1
		k, v := ref.presentFor(r, counts, 7, 6)
		tables := [][]BlockID{p.BlockTable(1), p.BlockTable(2)}
		if err := s.Scatter(tables, []int{6, 6}, counts, 7, 6, k, v); err != nil {
			t.Fatal(err)
		}
		gk, gv := denseBufs(sh, 2, 8, 0xff)
		if err := s.Gather(tables, []int{p.NumTokens(1), p.NumTokens(2)}, 8, gk, gv); err != nil {
			t.Fatal(err)
		}
		ref.checkGathered(t, gk, gv, []int{p.NumTokens(1), p.NumTokens(2)}, 8)
	}
}

func TestCopyBlock(t *testing.T) {
	sh := kvShape{2, 2, 3, 2, Float16}
	s := newStorageFor(t, sh, 4, 1)
	r := rand.New(rand.NewPCG(1, 1))
	for l := range sh.layers {
		copy(s.LayerK(l), randomElems(r, sh.dt, len(s.LayerK(l))/2))
		copy(s.LayerV(l), randomElems(r, sh.dt, len(s.LayerV(l))/2))
	}
	before := [][]byte{}
	for l := range sh.layers {
		before = append(before, slices.Clone(s.LayerK(l)), slices.Clone(s.LayerV(l)))
	}
	if err := s.CopyBlock(1, 3); err != nil {
		t.Fatal(err)
	}
	bb := sh.heads * sh.bs * sh.tokBytes()
	for l := range sh.layers {
		for i, arena := range [][]byte{s.LayerK(l), s.LayerV(l)} {
			old := before[2*l+i]
			if !bytes.Equal(arena[3*bb:4*bb], old[1*bb:2*bb]) || !bytes.Equal(arena[:3*bb], old[:3*bb]) {
				t.Fatalf("layer %d arena %d: copy wrong", l, i)
			}
		}
	}
	for _, ids := range [][2]BlockID{{-1, 0}, {0, 4}, {4, 0}} {
		if err := s.CopyBlock(ids[0], ids[1]); !errors.Is(err, ErrInvalid) {
			t.Errorf("CopyBlock(%d, %d) = %v", ids[0], ids[1], err)
		}
	}
	if err := s.ApplyCopies([]CopyOp{{0, 1}, {0, 9}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("ApplyCopies with a bad op = %v", err)
	}
}

func TestStorageConfigValidate(t *testing.T) {
	good := StorageConfig{NumBlocks: 4, BlockSizeTokens: 16, Layers: 2, KVHeads: 2, HeadDim: 8, DType: Float32}
	tests := []struct {
		name   string
		mutate func(*StorageConfig)
		ok     bool
	}{
		{"good", func(*StorageConfig) {}, true},
		{"float16", func(c *StorageConfig) { c.DType = Float16 }, true},
		{"no blocks", func(c *StorageConfig) { c.NumBlocks = 0 }, false},
		{"no layers", func(c *StorageConfig) { c.Layers = 0 }, false},
		{"no heads", func(c *StorageConfig) { c.KVHeads = -1 }, false},
		{"no dim", func(c *StorageConfig) { c.HeadDim = 0 }, false},
		{"no block size", func(c *StorageConfig) { c.BlockSizeTokens = 0 }, false},
		{"bad dtype", func(c *StorageConfig) { c.DType = 5 }, false},
		{"negative parallelism", func(c *StorageConfig) { c.Parallelism = -1 }, false},
		{"huge", func(c *StorageConfig) { c.NumBlocks, c.HeadDim, c.KVHeads = 1<<30, 1<<20, 1<<12 }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mutate(&c)
			err := c.Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestGatherScatterBadInput(t *testing.T) {
	sh := kvShape{2, 2, 4, 4, Float32}
	s := newStorageFor(t, sh, 8, 1)
	tables := [][]BlockID{{0, 1}, {2}}
	gk, gv := denseBufs(sh, 2, 8, 0)
	sk, sv := denseBufs(sh, 2, 3, 0)
	tests := []struct {
		name string
		call func() error
	}{
		{"gather: lens mismatch", func() error { return s.Gather(tables, []int{1}, 8, gk, gv) }},
		{"gather: past beyond maxPast", func() error { return s.Gather(tables, []int{9, 1}, 8, gk, gv) }},
		{"gather: past beyond table", func() error { return s.Gather(tables, []int{8, 5}, 8, gk, gv) }},
		{"gather: negative past", func() error { return s.Gather(tables, []int{-1, 0}, 8, gk, gv) }},
		{"gather: buffer size", func() error { return s.Gather(tables, []int{1, 1}, 7, gk, gv) }},
		{"gather: layer count", func() error { return s.Gather(tables, []int{1, 1}, 8, gk[:1], gv) }},
		{"gather: block outside pool", func() error { return s.Gather([][]BlockID{{0, 8}, {2}}, []int{5, 1}, 8, gk, gv) }},
		{"scatter: counts mismatch", func() error { return s.Scatter(tables, []int{0, 0}, []int{1}, 3, 0, sk, sv) }},
		{"scatter: columns beyond source", func() error { return s.Scatter(tables, []int{0, 0}, []int{2, 1}, 3, 2, sk, sv) }},
		{"scatter: positions beyond table", func() error { return s.Scatter(tables, []int{7, 0}, []int{2, 1}, 3, 0, sk, sv) }},
		{"scatter: negative start", func() error { return s.Scatter(tables, []int{-1, 0}, []int{2, 1}, 3, 0, sk, sv) }},
		{"scatter: negative count", func() error { return s.Scatter(tables, []int{0, 0}, []int{-1, 1}, 3, 0, sk, sv) }},
		{"scatter: buffer size", func() error { return s.Scatter(tables, []int{0, 0}, []int{1, 1}, 4, 0, sk, sv) }},
		{"scatter: block outside pool", func() error { return s.Scatter([][]BlockID{{-2}, {2}}, []int{0, 0}, []int{1, 1}, 3, 0, sk, sv) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
		})
	}
	// Valid edge cases: empty batch, zero past, zero counts.
	if err := s.Gather(nil, nil, 0, [][]byte{nil, nil}, [][]byte{nil, nil}); err != nil {
		t.Errorf("empty gather: %v", err)
	}
	if err := s.Scatter(tables, []int{0, 0}, []int{0, 0}, 3, 3, sk, sv); err != nil {
		t.Errorf("empty scatter: %v", err)
	}
}

func TestGatherDoesNotAllocate(t *testing.T) {
	sh := kvShape{2, 2, 8, 4, Float32}
	s := newStorageFor(t, sh, 16, 1)
	tables := [][]BlockID{{0, 1, 2}, {3, 4}}
	k, v := denseBufs(sh, 2, 12, 0)
	pastLens, startPos, counts := []int{10, 5}, []int{10, 5}, []int{1, 1}
	allocs := testing.AllocsPerRun(50, func() {
		if err := s.Gather(tables, pastLens, 12, k, v); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Gather allocates %v times per call", allocs)
	}
	sk, sv := denseBufs(sh, 2, 1, 0)
	allocs = testing.AllocsPerRun(50, func() {
		if err := s.Scatter(tables, startPos, counts, 1, 0, sk, sv); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Scatter allocates %v times per call", allocs)
	}
}

// TestLayerGroups: layers 0 and 2 form a full group, 1 and 3 a window group of 3 tokens,
// sharing two arenas. A sequence written token by token reads back its whole past in the
// full layers and, in the window layers, the blocks its window still reads (zeros before).
func TestLayerGroups(t *testing.T) {
	p, err := NewPool(PoolConfig{NumBlocks: 64, BlockSizeTokens: 2, Windows: []int{0, 3}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewStorage(StorageConfig{NumBlocks: 64, BlockSizeTokens: 2, Layers: 4, KVHeads: 1, HeadDim: 1,
		DType: Float32, LayerGroups: []int{0, 1, 0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.k) != 2 {
		t.Fatalf("%d arenas for two groups of two layers", len(s.k))
	}
	val := func(l, pos int) float32 { return float32(l*1000 + pos + 1) }
	one := func(x float32) []byte { return binary.LittleEndian.AppendUint32(nil, math.Float32bits(x)) }
	const n = 10
	for pos := range n {
		if _, ok := p.Allocate(1, 1); !ok {
			t.Fatal("allocate")
		}
		k, v := make([][]byte, 4), make([][]byte, 4)
		for l := range 4 {
			k[l], v[l] = one(val(l, pos)), one(-val(l, pos))
		}
		tables := [][][]BlockID{{p.GroupTable(1, 0)}, {p.GroupTable(1, 1)}}
		if err := s.ScatterGroups(tables, []int{pos}, []int{1}, 1, 0, k, v); err != nil {
			t.Fatal(err)
		}
		if err := p.Commit(1, pos, []int32{int32(pos)}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if used := p.Stats().UsedBlocks; used != 5+1 {
		t.Fatalf("%d blocks in use, want 5 full + 1 window (positions 8, 9)", used)
	}
	k, v := make([][]byte, 4), make([][]byte, 4)
	for l := range 4 {
		k[l], v[l] = make([]byte, 4*n), make([]byte, 4*n)
	}
	tables := [][][]BlockID{{p.GroupTable(1, 0)}, {p.GroupTable(1, 1)}}
	if err := s.GatherGroups(tables, []int{n}, n, k, v); err != nil {
		t.Fatal(err)
	}
	for l := range 4 {
		for pos := range n {
			want := val(l, pos)
			if l%2 == 1 && pos < 8 {
				want = 0 // given back: the window of the next query (position 10) starts at 8
			}
			gk := math.Float32frombits(binary.LittleEndian.Uint32(k[l][4*pos:]))
			gv := math.Float32frombits(binary.LittleEndian.Uint32(v[l][4*pos:]))
			if gk != want || gv != -want {
				t.Fatalf("layer %d position %d: K %v V %v, want %v", l, pos, gk, gv, want)
			}
		}
	}
	if err := s.GatherGroups(tables[:1], []int{n}, n, k, v); err == nil {
		t.Fatal("gather with one group of tables for two groups accepted")
	}
	if _, err := NewStorage(StorageConfig{NumBlocks: 4, BlockSizeTokens: 2, Layers: 3, KVHeads: 1, HeadDim: 1,
		DType: Float32, LayerGroups: []int{0, 1, 1}}); err == nil {
		t.Fatal("unequal groups accepted")
	}
}

// TestStorageClose: Close gives the arenas back at once; the storage then refuses work
// instead of touching unmapped memory, and a second Close (or the cleanup) does nothing.
func TestStorageClose(t *testing.T) {
	s, err := NewStorage(StorageConfig{NumBlocks: 4, BlockSizeTokens: 2, Layers: 2, KVHeads: 1, HeadDim: 2, DType: Float32})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close()
	if s.LayerK(0) != nil || s.LayerV(1) != nil {
		t.Fatal("arenas handed out after Close")
	}
	if err := s.CopyBlock(0, 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("CopyBlock after Close: %v", err)
	}
	k, v := [][]byte{make([]byte, 16), make([]byte, 16)}, [][]byte{make([]byte, 16), make([]byte, 16)}
	if err := s.Gather([][]BlockID{{0, 1}}, []int{2}, 2, k, v); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Gather after Close: %v", err)
	}
}

func TestTokenMajorStorageRefusesGatherAndScatter(t *testing.T) {
	s, err := NewStorage(StorageConfig{NumBlocks: 4, BlockSizeTokens: 4, Layers: 1, KVHeads: 2, HeadDim: 2, DType: Float32, TokenMajor: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	buf := [][]byte{make([]byte, 2*4*2*4)}
	if err := s.Gather([][]BlockID{{0}}, []int{4}, 4, buf, buf); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Gather on a token-major storage: %v, want ErrInvalid", err)
	}
	if err := s.Scatter([][]BlockID{{0}}, []int{0}, []int{4}, 4, 0, buf, buf); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Scatter on a token-major storage: %v, want ErrInvalid", err)
	}
	if err := s.CopyBlock(0, 1); err != nil {
		t.Fatalf("CopyBlock: %v", err)
	}
}

func TestNoArenasStorageDescribesOnly(t *testing.T) {
	s, err := NewStorage(StorageConfig{NumBlocks: 1 << 20, BlockSizeTokens: 16, Layers: 24, KVHeads: 8, HeadDim: 128, DType: Float16, NoArenas: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.LayerK(0) != nil || s.LayerV(23) != nil {
		t.Fatal("a storage without arenas handed out an arena")
	}
	if err := s.CopyBlock(0, 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("CopyBlock without arenas: %v, want ErrInvalid", err)
	}
}
