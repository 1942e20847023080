package kvcache

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// The gather benchmarks use the shape of a ~50M-parameter Llama-style model.
const (
	benchLayers  = 8
	benchHeads   = 4
	benchHeadDim = 64
	benchBatch   = 32
	benchPast    = 512
	benchBS      = 16
)

// benchBytes is the size of the dense past tensors of one gather, K and V, all layers.
const benchBytes = 2 * benchLayers * benchBatch * benchHeads * benchPast * benchHeadDim * 4

// BenchmarkAllocateFree allocates a 64-block sequence and frees it; ns/block is per block.
func BenchmarkAllocateFree(b *testing.B) {
	for _, prefix := range []bool{false, true} {
		b.Run(fmt.Sprintf("prefixCaching=%v", prefix), func(b *testing.B) {
			p := newTestPool(b, 4096, benchBS, prefix)
			const blocks = 64
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, ok := p.Allocate(SeqID(i), blocks*benchBS); !ok {
					b.Fatal("does not fit")
				}
				p.Free(SeqID(i))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
		})
	}
}

// BenchmarkDecodeAppend grows 64 sequences one token at a time (a block every 16 steps) and
// frees them; ns/token is per Allocate(seq, 1) call.
func BenchmarkDecodeAppend(b *testing.B) {
	p := newTestPool(b, 4096, benchBS, true)
	const seqs, steps = 64, 256
	b.ReportAllocs()
	for b.Loop() {
		for range steps {
			for s := range seqs {
				if _, ok := p.Allocate(SeqID(s), 1); !ok {
					b.Fatal("does not fit")
				}
			}
		}
		for s := range seqs {
			p.Free(SeqID(s))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*seqs*steps), "ns/token")
}

// BenchmarkAllocateCommitFree prefills a 1,024-token prompt (64 blocks), commits it (hashing
// and registering every block) and frees it; the next iteration evicts those cached blocks.
func BenchmarkAllocateCommitFree(b *testing.B) {
	p := newTestPool(b, 64, benchBS, true)
	r := rand.New(rand.NewPCG(1, 1))
	prompts := make([][]int32, 16)
	for i := range prompts {
		prompts[i] = make([]int32, 64*benchBS)
		for j := range prompts[i] {
			prompts[i][j] = int32(r.IntN(32000))
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		seq := SeqID(i)
		prompt := prompts[i%len(prompts)]
		if _, ok := p.Allocate(seq, len(prompt)); !ok {
			b.Fatal("does not fit")
		}
		if err := p.Commit(seq, 0, prompt, 0); err != nil {
			b.Fatal(err)
		}
		p.Free(seq)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*64), "ns/block")
}

// BenchmarkLookupPrefix looks up a cached 2,048-token prompt (127 blocks hit), attaches
// the hit to a new sequence and frees it.
func BenchmarkLookupPrefix(b *testing.B) {
	p := newTestPool(b, 1024, benchBS, true)
	prompt := make([]int32, 2048)
	r := rand.New(rand.NewPCG(2, 2))
	for i := range prompt {
		prompt[i] = int32(r.IntN(32000))
	}
	startSeq(b, p, 0, prompt, 0)
	var hit PrefixHit
	b.ReportAllocs()
	for i := 1; b.Loop(); i++ {
		p.FindPrefix(&hit, prompt, 0)
		if _, _, ok := p.AllocateSlots(SeqID(i), &hit, 0); !ok || hit.NumTokens() != 2032 {
			b.Fatalf("hit %d tokens, attached %v", hit.NumTokens(), ok)
		}
		p.Free(SeqID(i))
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*127), "ns/block")
}

// gatherFixture builds a storage holding benchBatch sequences of benchPast tokens in randomly
// placed blocks, and the dense output buffers.
func gatherFixture(b *testing.B, par int) (*Storage, [][]BlockID, []int, [][]byte, [][]byte) {
	perSeq := benchPast / benchBS
	nblocks := benchBatch * perSeq
	s := newStorageFor(b, kvShape{benchLayers, benchHeads, benchHeadDim, benchBS, Float32}, nblocks, par)
	for l := range benchLayers {
		for i := range s.LayerK(l) {
			s.LayerK(l)[i], s.LayerV(l)[i] = byte(i), byte(i>>3)
		}
	}
	ids := rand.New(rand.NewPCG(3, 3)).Perm(nblocks)
	tables := make([][]BlockID, benchBatch)
	lens := make([]int, benchBatch)
	for row := range tables {
		for j := range perSeq {
			tables[row] = append(tables[row], BlockID(ids[row*perSeq+j]))
		}
		lens[row] = benchPast
	}
	k, v := denseBufs(kvShape{benchLayers, benchHeads, benchHeadDim, benchBS, Float32}, benchBatch, benchPast, 0)
	return s, tables, lens, k, v
}

// BenchmarkGather gathers batch 32 x past 512 (8 layers, 4 kv heads, head dim 64, float32:
// 256 MiB of K and V) from randomly placed blocks. Compare MB/s with BenchmarkPlainCopy.
func BenchmarkGather(b *testing.B) {
	for _, par := range []int{1, 0} {
		b.Run(fmt.Sprintf("parallelism=%d", par), func(b *testing.B) {
			s, tables, lens, k, v := gatherFixture(b, par)
			b.SetBytes(benchBytes)
			b.ReportAllocs()
			for b.Loop() {
				if err := s.Gather(tables, lens, benchPast, k, v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGatherPadded is BenchmarkGather with rows of varied length (half the rows at
// past 256), so a quarter of the output is zero padding.
func BenchmarkGatherPadded(b *testing.B) {
	s, tables, lens, k, v := gatherFixture(b, 0)
	for i := range lens {
		if i%2 == 1 {
			lens[i] = benchPast / 2
		}
	}
	b.SetBytes(benchBytes)
	for b.Loop() {
		if err := s.Gather(tables, lens, benchPast, k, v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScatterDecode stores one new token per row for batch 32.
func BenchmarkScatterDecode(b *testing.B) {
	s, tables, _, _, _ := gatherFixture(b, 0)
	sh := kvShape{benchLayers, benchHeads, benchHeadDim, benchBS, Float32}
	k, v := denseBufs(sh, benchBatch, benchPast+1, 1)
	start, counts := make([]int, benchBatch), make([]int, benchBatch)
	for i := range start {
		start[i], counts[i] = benchPast-1, 1
	}
	b.SetBytes(int64(2 * benchLayers * benchBatch * benchHeads * benchHeadDim * 4))
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Scatter(tables, start, counts, benchPast+1, benchPast, k, v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlainCopy copies the same number of bytes as BenchmarkGather with copy(), per layer
// K and V, on one goroutine and split over two: the bandwidth ceiling for the gather.
func BenchmarkPlainCopy(b *testing.B) {
	per := benchBytes / (2 * benchLayers)
	src := make([][]byte, 2*benchLayers)
	dst := make([][]byte, 2*benchLayers)
	for i := range src {
		src[i] = make([]byte, per)
		dst[i] = make([]byte, per)
		for j := range src[i] {
			src[i][j] = byte(j)
		}
	}
	for _, workers := range []int{1, 2} {
		b.Run(fmt.Sprintf("goroutines=%d", workers), func(b *testing.B) {
			b.SetBytes(benchBytes)
			for b.Loop() {
				var wg sync.WaitGroup
				for w := range workers {
					wg.Go(func() {
						for i := w; i < len(src); i += workers {
							copy(dst[i], src[i])
						}
					})
				}
				wg.Wait()
			}
		})
	}
}
