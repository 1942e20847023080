package engine

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
)

// TestPerplexity checks Perplexity against the definition computed here from plain
// forward passes (each window alone, all its tokens in one pass, no KV cache reads),
// on both attention paths: feeding the windows in chunks through the KV cache must
// give the same mean negative log-likelihood.
func TestPerplexity(t *testing.T) {
	for _, attention := range attentionPaths {
		t.Run(attention, func(t *testing.T) {
			m, _ := openTiny(t, attention)
			spec := m.Spec()
			rng := rand.New(rand.NewPCG(3, 4))
			stream := make([]int32, 3*40+7)
			for i := range stream {
				stream[i] = int32(rng.IntN(spec.VocabSize))
			}
			const ctx = 40
			want, n := 0.0, 0
			for w := 0; w+ctx < len(stream); w += ctx {
				win := stream[w : w+ctx+1]
				out, err := m.Forward(&models.Batch{Seqs: []models.SeqInput{{Tokens: win[:ctx], AllLogits: true}}})
				if err != nil {
					t.Fatal(err)
				}
				v := spec.VocabSize
				for j := 0; j < ctx; j++ {
					row := out.Logits[0][j*v : (j+1)*v]
					lse := 0.0
					for _, x := range row {
						lse += math.Exp(float64(x))
					}
					want += math.Log(lse) - float64(row[win[j+1]])
					n++
				}
			}
			want /= float64(n)
			for _, chunk := range []int{0, 7} {
				res, err := Perplexity(m, stream, PerplexityOptions{Context: ctx, ChunkTokens: chunk, BlockSizeTokens: max(4, m.Spec().MinBlockSize)})
				if err != nil {
					t.Fatal(err)
				}
				if res.Windows != 3 || res.Tokens != 3*ctx {
					t.Errorf("chunk %d: %d windows, %d tokens; want 3 and %d", chunk, res.Windows, res.Tokens, 3*ctx)
				}
				if math.Abs(res.NLL-want) > 1e-4 || math.Abs(res.Perplexity-math.Exp(want)) > 1e-3*math.Exp(want) {
					t.Errorf("chunk %d: NLL %.6f perplexity %.4f, want %.6f and %.4f", chunk, res.NLL, res.Perplexity, want, math.Exp(want))
				}
			}
			if _, err := Perplexity(m, stream[:10], PerplexityOptions{Context: ctx}); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("a stream shorter than a window: %v", err)
			}
			if _, err := Perplexity(m, stream, PerplexityOptions{Context: spec.MaxPositions}); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("a window longer than the context: %v", err)
			}
		})
	}
}
