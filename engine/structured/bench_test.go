package structured

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/tokenizer"
)

// benchVocabs are the default tokenizer (4k tokens) and, when CONVEYOR_TOKENIZER_FILES
// holds them, Qwen3's byte-level BPE (151k tokens).
func benchVocabs(b *testing.B) map[string]*Vocabulary {
	vs := map[string]*Vocabulary{"default": defaultVocab(b)}
	if dir := os.Getenv("CONVEYOR_TOKENIZER_FILES"); dir != "" {
		tok, err := tokenizer.Load(filepath.Join(dir, "qwen3"))
		if err == nil {
			vs["qwen3"] = NewVocabulary(tok.VocabSize(), tok.TokenBytes, tok.IsSpecial, tok.EOS())
		}
	}
	return vs
}

// BenchmarkMask times Mask + Accept per generated token of random walks through the
// first test schema: "cold" starts every walk on a fresh Constraint (a schema's first
// request: every state's mask computed on first visit), "warm" reuses one (later
// requests with the same schema). It reports the mean and p99 per token.
func BenchmarkMask(b *testing.B) {
	g, err := CompileSchema([]byte(testSchemas[0]), true)
	if err != nil {
		b.Fatal(err)
	}
	for name, vocab := range benchVocabs(b) {
		for _, mode := range []string{"cold", "warm"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				rng := rand.New(rand.NewPCG(5, 6))
				shared := NewConstraint(g, vocab)
				var times []time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					c := shared
					if mode == "cold" {
						c = NewConstraint(g, vocab)
					}
					m := c.NewMatcher()
					for n := 0; n < 200; n++ {
						start := time.Now()
						mask := m.Mask()
						id := pick(mask, rng, vocab)
						if id < 0 || !m.Accept(id) || vocab.isEOS(id) {
							break
						}
						times = append(times, time.Since(start))
					}
				}
				b.StopTimer()
				if len(times) == 0 {
					b.Fatal("no tokens")
				}
				var sum time.Duration
				for _, d := range times {
					sum += d
				}
				slices.Sort(times)
				b.ReportMetric(float64(sum.Microseconds())/float64(len(times)), "µs/token")
				b.ReportMetric(float64(times[len(times)*99/100].Microseconds()), "p99-µs/token")
			})
		}
	}
}

// pick returns a random allowed token, preferring end of sequence when allowed.
func pick(mask []uint64, rng *rand.Rand, v *Vocabulary) int32 {
	for _, e := range v.eos {
		if Allowed(mask, e) {
			return e
		}
	}
	n := Count(mask)
	if n == 0 {
		return -1
	}
	k := rng.IntN(n)
	for w, word := range mask {
		for word != 0 {
			bit := word & -word
			if k == 0 {
				return int32(w*64 + bitIndex(bit))
			}
			k--
			word &^= bit
		}
	}
	return -1
}

func bitIndex(bit uint64) int {
	i := 0
	for bit > 1 {
		bit >>= 1
		i++
	}
	return i
}
