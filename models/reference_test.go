package models

import (
	"testing"

	"github.com/conveyor-llm/conveyor/models/convert"
)

// TestONNXMatchesReference checks the ONNX graphs built from random weights against the
// plain-Go float64 reference, for multi-head, grouped-query and multi-query attention
// with tied and untied output embeddings.
func TestONNXMatchesReference(t *testing.T) {
	cases := []struct {
		name                                       string
		hidden, layers, heads, kvHeads, inter, voc int
		tied                                       bool
	}{
		{"mha-tied", 32, 2, 4, 4, 64, 97, true},
		{"mha-untied", 48, 1, 3, 3, 72, 64, false},
		{"gqa-untied", 64, 2, 8, 2, 112, 131, false},
		{"gqa-tied", 64, 3, 4, 2, 96, 120, true},
		{"mqa-untied", 32, 2, 4, 1, 40, 77, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := tinyConfig(c.hidden, c.layers, c.heads, c.kvHeads, c.inter, c.voc, c.tied)
			cfg.RopeTheta = []float64{10000, 500000, 10000, 1e6, 50}[i]
			dir := t.TempDir()
			w := buildTestModel(t, cfg, int64(100+i), dir)
			r := openTestRunner(t, dir)
			tokens := randTokens(uint64(i), 12, c.voc)
			out, err := r.Forward(&Batch{Seqs: []SeqInput{{Tokens: tokens, AllLogits: true}}})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := len(out.Logits[0]), len(tokens)*c.voc; got != want {
				t.Fatalf("got %d logits, want %d", got, want)
			}
			ref := newRefModel(t, cfg, w).forward(t, tokens)
			for p := range tokens {
				got := out.Logits[0][p*c.voc : (p+1)*c.voc]
				if e := relErr(got, ref[p]); e > logitTolerance {
					t.Errorf("position %d: ONNX logits differ from the reference by %.2e (scale %.3g)", p, e, maxAbs(ref[p]))
				}
			}
			if maxAbs(ref[len(tokens)-1]) == 0 {
				t.Fatal("reference logits are all zero; the comparison would be vacuous")
			}
		})
	}
}

// TestReferenceSanity makes sure the reference itself is not trivially insensitive:
// changing an earlier token changes later logits (attention reaches back) but not
// earlier ones (causality).
func TestReferenceSanity(t *testing.T) {
	cfg := tinyConfig(32, 2, 4, 2, 48, 61, false)
	w := convert.RandomWeights(cfg, 5)
	ref := newRefModel(t, cfg, w)
	a := randTokens(3, 8, cfg.VocabSize)
	b := append([]int32(nil), a...)
	b[4] = (b[4] + 1) % int32(cfg.VocabSize)
	la, lb := ref.forward(t, a), ref.forward(t, b)
	for p := range a {
		diff := relErr(toFloat32(la[p]), lb[p])
		if p < 4 && diff > 1e-7 {
			t.Errorf("position %d changed (%.2e) when token 4 changed", p, diff)
		}
		if p >= 4 && diff < 1e-4 {
			t.Errorf("position %d did not change when token 4 changed", p)
		}
	}
}

func toFloat32(xs []float64) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = float32(x)
	}
	return out
}
