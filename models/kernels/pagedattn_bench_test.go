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
// caches: a decode step of 16 rows at past 512 and a 128-token prompt; and, as gqa-*, on
// the 50M benchmark model's (8 query heads over 4 KV heads), a decode step of 64 rows at
// past 128 and 512. PagedAttention uses GOMAXPROCS goroutines.
func BenchmarkPagedAttention(b *testing.B) {
	rows := func(n, past int) []row {
		rs := make([]row, n)
		for i := range rs {
			rs[i] = row{1, past}
		}
		return rs
	}
	for _, bc := range []struct {
		name string
		rows []row
		half bool
		gqa  bool // 8 query heads over 4 KV heads (the 50M benchmark model's shape)
	}{
		{"gqa-decode-64x128-f16", rows(64, 128), true, true},
		{"gqa-decode-64x512-f16", rows(64, 512), true, true},
		{"gqa-decode-64x128", rows(64, 128), false, true},
		{"gqa-decode-64x512", rows(64, 512), false, true},
		{"decode-16x512", rows(16, 512), false, false},
		{"decode-16x512-f16", rows(16, 512), true, false},
		{"prefill-128", []row{{128, 0}}, false, false},
		{"prefill-128-f16", []row{{128, 0}}, true, false},
	} {
		b.Run(fmt.Sprintf("%s/%s", bc.name, PagedAttentionISA()), func(b *testing.B) {
			spec := callSpec{a: PagedAttrs{NumHeads: 14, KVNumHeads: 2, DoRotary: true}, headDim: 64, blockSize: 16, rows: bc.rows, rotaryDim: 64}
			if bc.gqa {
				spec.a.NumHeads, spec.a.KVNumHeads = 8, 4
			}
			calls := make([]testCall, benchLayers)
			for i := range calls {
				spec.seed = uint64(i)
				calls[i] = newCall(spec)
				if bc.half {
					t := &calls[i].t
					t.KeyCacheHalf, t.ValueCacheHalf = halves(t.KeyCache), halves(t.ValueCache)
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
