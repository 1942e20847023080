package models

import (
	"fmt"
	"math/rand/v2"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// testCache is a KV cache for tests: a kvcache.Storage (the engine's own kind, so tests
// and benchmarks read memory laid out and mapped as in serving), block tables filled
// from a shuffled free list (so blocks sit anywhere in the arena), and sequences that can
// share full prefix blocks or fork with a copied partial block. Its batches carry the
// storage and the rows' block tables; the paged runner reads and writes the blocks in
// place and the dense runner gathers from and scatters into the same blocks, so a cache
// written by one path can be read by the other.
type testCache struct {
	spec    Spec
	bs      int
	storage *kvcache.Storage
	free    []kvcache.BlockID
	tables  [][]kvcache.BlockID // per sequence
	lens    []int               // per sequence: positions computed

	// rows maps the current batch's rows to sequences.
	rows []int
}

// newTestCache makes a cache of numBlocks blocks of blockSize tokens, or of the model's
// smallest (Spec.MinBlockSize) when that is larger.
func newTestCache(spec Spec, numSeqs, numBlocks, blockSize int, seed uint64) *testCache {
	blockSize = max(blockSize, spec.MinBlockSize)
	c := &testCache{spec: spec, bs: blockSize,
		tables: make([][]kvcache.BlockID, numSeqs), lens: make([]int, numSeqs)}
	st, err := kvcache.NewStorage(kvcache.StorageConfig{NumBlocks: numBlocks, BlockSizeTokens: blockSize,
		Layers: spec.NumLayers, KVHeads: spec.NumKVHeads, HeadDim: spec.HeadDim, DType: spec.KVDType,
		Parallelism: 1, TokenMajor: spec.KVTokenMajor})
	if err != nil {
		panic(err)
	}
	c.storage = st
	for i := range numBlocks {
		c.free = append(c.free, kvcache.BlockID(i))
	}
	rand.New(rand.NewPCG(seed, 7)).Shuffle(len(c.free), func(i, j int) { c.free[i], c.free[j] = c.free[j], c.free[i] })
	return c
}

// newContextCache returns a cache of 16-token blocks with room for numSeqs sequences of
// the whole context, and one block more each (for tests that feed a token beyond it).
func newContextCache(spec Spec, numSeqs int) *testCache {
	const bs = 16
	perSeq := (spec.MaxPositions+bs-1)/bs + 1
	return newTestCache(spec, numSeqs, numSeqs*perSeq, bs, uint64(numSeqs))
}

// length returns how many positions sequence s holds.
func (c *testCache) length(s int) int { return c.lens[s] }

// share makes sequence dst start with src's first n positions (n a multiple of the
// block size): the blocks are shared, not copied, as prefix caching does.
func (c *testCache) share(src, dst, n int) {
	if n%c.bs != 0 || n > c.lens[src] {
		panic(fmt.Sprintf("share %d positions of a %d-token sequence in %d-token blocks", n, c.lens[src], c.bs))
	}
	c.tables[dst] = append([]kvcache.BlockID(nil), c.tables[src][:n/c.bs]...)
	c.lens[dst] = n
}

// fork makes dst a copy-on-write fork of src: src's full blocks are shared, its
// partial last block is copied into a fresh block.
func (c *testCache) fork(src, dst int) {
	full := c.lens[src] / c.bs
	c.tables[dst] = append([]kvcache.BlockID(nil), c.tables[src][:full]...)
	c.lens[dst] = c.lens[src]
	if c.lens[src]%c.bs == 0 {
		return
	}
	nb := c.free[0]
	c.free = c.free[1:]
	if err := c.storage.CopyBlock(c.tables[src][full], nb); err != nil {
		panic(err)
	}
	c.tables[dst] = append(c.tables[dst], nb)
}

// batch feeds each listed sequence its tokens, allocating blocks as needed: each row's
// PastLen is its sequence's length, and its Blocks the sequence's block table.
func (c *testCache) batch(seqs []int, tokens [][]int32, allLogits bool) *Batch {
	b := &Batch{Cache: c.storage}
	c.rows = append(c.rows[:0], seqs...)
	for i, s := range seqs {
		n := len(tokens[i])
		for len(c.tables[s])*c.bs < c.lens[s]+n {
			c.tables[s] = append(c.tables[s], c.free[0])
			c.free = c.free[1:]
		}
		b.Seqs = append(b.Seqs, SeqInput{Tokens: tokens[i], PastLen: c.lens[s], Blocks: c.tables[s], AllLogits: allLogits})
		c.lens[s] += n
	}
	return b
}

// keys returns sequence s's keys and values of every layer as float32, [kvHead][pos][headDim]
// per layer, gathered from its blocks.
func (c *testCache) keys(s int) (k, v [][]float32) {
	n := c.lens[s]
	size := c.spec.NumKVHeads * n * c.spec.HeadDim
	kb, vb := make([][]byte, c.spec.NumLayers), make([][]byte, c.spec.NumLayers)
	for l := range kb {
		kb[l] = make([]byte, size*c.spec.KVDType.Size())
		vb[l] = make([]byte, size*c.spec.KVDType.Size())
	}
	if err := c.storage.Gather([][]kvcache.BlockID{c.tables[s]}, []int{n}, n, kb, vb); err != nil {
		panic(err)
	}
	dt := c.spec.KVDType
	for l := range kb {
		k = append(k, make([]float32, size))
		v = append(v, make([]float32, size))
		kvcache.Decode(dt, k[l], kb[l])
		kvcache.Decode(dt, v[l], vb[l])
	}
	return k, v
}
