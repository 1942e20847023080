package attention

import (
	"fmt"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// BenchmarkDecode times one layer's decode attention (one new token per sequence) for
// the 50M benchmark model's shape: 8 query heads over 4 KV heads of 64 dims, 16-token
// blocks placed at random, every sequence in its own blocks, in a kvcache.Storage arena
// of float32 (BenchmarkDecode) or float16 (BenchmarkDecodeFloat16) elements. The bytes
// per second are the past's float32 equivalent, so the two compare directly.
func BenchmarkDecode(b *testing.B) { benchDecode(b, kvcache.Float32) }

// BenchmarkDecodeFloat16 is BenchmarkDecode over float16 arenas.
func BenchmarkDecodeFloat16(b *testing.B) { benchDecode(b, kvcache.Float16) }

// BenchmarkDecodeQwen05B times one decode step's attention over all 24 layers of
// Qwen2.5-0.5B's shape (14 query heads over 2 KV heads of 64, float16 arenas): as in
// a served step, each layer's past is read from memory, not from a cache the layer
// before warmed. ns/op is the whole step.
func BenchmarkDecodeQwen05B(b *testing.B) {
	benchDecodeP(b, kvcache.Float16, Params{NumHeads: 14, NumKVHeads: 2, HeadDim: 64, Scale: 0.125,
		Rotary: llamaRotary(64, 1000000)}, 24)
}

func benchDecode(b *testing.B, dt kvcache.DType) {
	benchDecodeP(b, dt, Params{NumHeads: 8, NumKVHeads: 4, HeadDim: 64, Scale: 0.125, Rotary: llamaRotary(64, 10000)}, 1)
}

func benchDecodeP(b *testing.B, dt kvcache.DType, p Params, layers int) {
	for _, past := range []int{128, 512, 2048} {
		for _, batch := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("past%d/batch%d", past, batch), func(b *testing.B) {
				tc := testCase{p: p, blockSize: 16}
				for range batch {
					tc.past = append(tc.past, past)
					tc.new = append(tc.new, 1)
				}
				cache, seqs, qkv := tc.setup(1)
				if dt == kvcache.Float16 {
					cache, _, _ = toHalf(cache)
				}
				// Serve from the engine's kind of arena (kvcache.Storage maps huge pages).
				st, err := kvcache.NewStorage(kvcache.StorageConfig{NumBlocks: cache.NumBlocks, BlockSizeTokens: 16,
					Layers: layers, KVHeads: p.NumKVHeads, HeadDim: p.HeadDim, DType: dt, Parallelism: 1})
				if err != nil {
					b.Fatal(err)
				}
				// The arenas are the storage's: keep them until the benchmark is done.
				defer st.Close()
				caches := make([]Cache, layers)
				for i := range caches {
					copy(st.LayerK(i), cache.K)
					copy(st.LayerV(i), cache.V)
					caches[i] = cache
					caches[i].K, caches[i].V = st.LayerK(i), st.LayerV(i)
				}
				l, err := NewLayer(p, 4096)
				if err != nil {
					b.Fatal(err)
				}
				att := make([]float32, batch*p.OutCols())
				b.SetBytes(int64(layers * batch * (past + 1) * p.NumKVHeads * p.HeadDim * 4 * 2))
				b.ResetTimer()
				for range b.N {
					for _, c := range caches {
						if err := l.Run(c, seqs, qkv, att); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}
