package models

import (
	"fmt"
	"math/rand/v2"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// pagedTestKV is a paged KV cache for tests: per-layer arenas laid out
// [block][kvHead][blockSize][headDim] like kvcache.Storage, block tables filled from a
// shuffled free list (so blocks sit anywhere in the arena), and sequences that can share
// full prefix blocks. It serves both paths: the paged runner reads and writes the arenas
// in place (PagedKV), the dense runner gathers from and scatters into the same blocks
// (KV), so a cache written by one path can be read by the other.
type pagedTestKV struct {
	spec      Spec
	bs        int
	numBlocks int
	storage   *kvcache.Storage // owns k and v
	k, v      [][]byte
	free      []int32
	tables    [][]int32 // per sequence
	lens      []int     // per sequence: positions computed

	// The current batch.
	rows, past, counts []int
}

func newPagedTestKV(spec Spec, numSeqs, numBlocks, blockSize int, seed uint64) *pagedTestKV {
	p := &pagedTestKV{spec: spec, bs: blockSize, numBlocks: numBlocks,
		tables: make([][]int32, numSeqs), lens: make([]int, numSeqs)}
	// The arenas are the engine's own kind (kvcache.Storage), so tests and benchmarks
	// read memory laid out and mapped as in serving.
	dt := kvcache.Float32
	if spec.KVDType == Float16 {
		dt = kvcache.Float16
	}
	st, err := kvcache.NewStorage(kvcache.StorageConfig{NumBlocks: numBlocks, BlockSizeTokens: blockSize,
		Layers: spec.NumLayers, KVHeads: spec.NumKVHeads, HeadDim: spec.HeadDim, DType: dt, Parallelism: 1})
	if err != nil {
		panic(err)
	}
	p.storage = st
	for l := range spec.NumLayers {
		p.k = append(p.k, st.LayerK(l))
		p.v = append(p.v, st.LayerV(l))
	}
	for i := range numBlocks {
		p.free = append(p.free, int32(i))
	}
	rand.New(rand.NewPCG(seed, 7)).Shuffle(len(p.free), func(i, j int) { p.free[i], p.free[j] = p.free[j], p.free[i] })
	return p
}

// share makes sequence dst start with src's first n positions (n a multiple of the
// block size): the blocks are shared, not copied, as prefix caching does.
func (p *pagedTestKV) share(src, dst, n int) {
	if n%p.bs != 0 || n > p.lens[src] {
		panic(fmt.Sprintf("share %d positions of a %d-token sequence in %d-token blocks", n, p.lens[src], p.bs))
	}
	p.tables[dst] = append([]int32(nil), p.tables[src][:n/p.bs]...)
	p.lens[dst] = n
}

// batch feeds each listed sequence its tokens, allocating blocks as needed.
func (p *pagedTestKV) batch(seqs []int, tokens [][]int32, allLogits bool) *Batch {
	b := &Batch{}
	p.rows, p.past, p.counts = p.rows[:0], p.past[:0], p.counts[:0]
	for i, s := range seqs {
		n := len(tokens[i])
		b.Seqs = append(b.Seqs, SeqInput{Tokens: tokens[i], PastLen: p.lens[s], AllLogits: allLogits})
		p.rows = append(p.rows, s)
		p.past = append(p.past, p.lens[s])
		p.counts = append(p.counts, n)
		for len(p.tables[s])*p.bs < p.lens[s]+n {
			p.tables[s] = append(p.tables[s], p.free[0])
			p.free = p.free[1:]
		}
		p.lens[s] += n
	}
	return b
}

func (p *pagedTestKV) BlockTable(b int) []int32  { return p.tables[p.rows[b]] }
func (p *pagedTestKV) Arena(l int) (k, v []byte) { return p.k[l], p.v[l] }
func (p *pagedTestKV) Blocks() (int, int)        { return p.numBlocks, p.bs }

// slot returns the byte offset of (position, head) in an arena.
func (p *pagedTestKV) slot(table []int32, pos, head int) int {
	hb := p.spec.HeadDim * p.spec.KVDType.Size()
	return ((int(table[pos/p.bs])*p.spec.NumKVHeads+head)*p.bs + pos%p.bs) * hb
}

func (p *pagedTestKV) GatherPast(k, v []DenseKV) error {
	hb := p.spec.HeadDim * p.spec.KVDType.Size()
	for l := range k {
		for which, dst := range []DenseKV{k[l], v[l]} {
			src := [][]byte{p.k[l], p.v[l]}[which]
			clear(dst.Data)
			for b, s := range p.rows {
				for h := range dst.KVHeads {
					for pos := range p.past[b] {
						o := ((b*dst.KVHeads+h)*dst.Tokens + pos) * hb
						copy(dst.Data[o:o+hb], src[p.slot(p.tables[s], pos, h):])
					}
				}
			}
		}
	}
	return nil
}

func (p *pagedTestKV) ScatterNew(k, v []DenseKV, newOffset int) error {
	hb := p.spec.HeadDim * p.spec.KVDType.Size()
	for l := range k {
		for which, src := range []DenseKV{k[l], v[l]} {
			dst := [][]byte{p.k[l], p.v[l]}[which]
			for b, s := range p.rows {
				for h := range src.KVHeads {
					for j := range p.counts[b] {
						o := ((b*src.KVHeads+h)*src.Tokens + newOffset + j) * hb
						copy(dst[p.slot(p.tables[s], p.past[b]+j, h):][:hb], src.Data[o:o+hb])
					}
				}
			}
		}
	}
	return nil
}
