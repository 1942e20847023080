package kernels

import (
	"fmt"
	"testing"
)

// benchLayers is how many layers' caches a benchmark cycles through (Qwen2.5-0.5B has
// 24): each call reads its layer's past from memory, not from the last level cache, as
// in a served step.
const benchLayers = 24

// BenchmarkPagedAttention times one call on Qwen2.5-0.5B's attention shape (14 query heads over 2
// KV heads of 64, rotary over the whole head, blocks of 16 tokens), float32 and float16
// caches: a decode step of 16 rows at past 512 and a 128-token prompt. PagedAttention uses GOMAXPROCS
// goroutines.
func BenchmarkPagedAttention(b *testing.B) {
	decode := make([]row, 16)
	for i := range decode {
		decode[i] = row{1, 512}
	}
	for _, bc := range []struct {
		name string
		rows []row
		half bool
	}{
		{"decode-16x512", decode, false},
		{"decode-16x512-f16", decode, true},
		{"prefill-128", []row{{128, 0}}, false},
		{"prefill-128-f16", []row{{128, 0}}, true},
	} {
		b.Run(fmt.Sprintf("%s/%s", bc.name, PagedAttentionISA()), func(b *testing.B) {
			spec := callSpec{a: PagedAttrs{NumHeads: 14, KVNumHeads: 2, DoRotary: true}, headDim: 64, blockSize: 16, rows: bc.rows, rotaryDim: 64}
			calls := make([]testCall, benchLayers)
			for i := range calls {
				spec.seed = uint64(i)
				calls[i] = newCall(spec)
				if bc.half {
					t := &calls[i].t
					t.KeyCacheHalf, t.ValueCacheHalf = make([]uint16, len(t.KeyCache)), make([]uint16, len(t.ValueCache))
					t.KeyCache, t.ValueCache = nil, nil
				}
			}
			tokens := calls[0].d.Tokens
			for i := 0; b.Loop(); i++ {
				c := calls[i%len(calls)]
				if err := PagedAttention(c.a, c.d, c.t); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/call")
			b.ReportMetric(float64(tokens*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
