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

func benchDecode(b *testing.B, dt kvcache.DType) {
	p := Params{NumHeads: 8, NumKVHeads: 4, HeadDim: 64, Scale: 0.125, Rotary: llamaRotary(64, 10000)}
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
					Layers: 1, KVHeads: p.NumKVHeads, HeadDim: p.HeadDim, DType: dt, Parallelism: 1})
				if err != nil {
					b.Fatal(err)
				}
				copy(st.LayerK(0), cache.K)
				copy(st.LayerV(0), cache.V)
				cache.K, cache.V = st.LayerK(0), st.LayerV(0)
				l, err := NewLayer(p, 4096)
				if err != nil {
					b.Fatal(err)
				}
				att := make([]float32, batch*p.OutCols())
				b.SetBytes(int64(batch * (past + 1) * p.NumKVHeads * p.HeadDim * 4 * 2))
				b.ResetTimer()
				for range b.N {
					if err := l.Run(cache, seqs, qkv, att); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
