package models

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/conveyor-llm/conveyor/models/build"
)

// The families' cross-check: every directory under testdata/families is a Hugging Face
// checkpoint (config.json, model.safetensors under the family's tensor names, random
// small weights) of one model_type with one of its options — Llama 3 and linear rope
// scaling, Qwen2's biases, Qwen3's q/k norms, Mistral's and Phi-3's sliding windows,
// Gemma, Phi-3's fused projections, partial rotary and longrope. reference.json holds the logits
// of a plain-PyTorch implementation of that family (gen_families.py, written from the
// transformers modeling code) at every position of three sequences. Conveyor builds
// the checkpoint with build.BuildFromHF and must reproduce them on both attention
// paths, in one batch of all three sequences and token by token through the KV cache.

// familyTolerance is the largest absolute logit difference accepted.
const familyTolerance = 1e-3

type familyReference struct {
	Model     string        `json:"model"`
	Sequences [][]int32     `json:"sequences"`
	Logits    [][][]float64 `json:"logits"` // [sequence][position][vocab]
}

func loadFamilyReference(t *testing.T, path string) *familyReference {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ref familyReference
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(ref.Sequences) == 0 || len(ref.Logits) != len(ref.Sequences) {
		t.Fatalf("%s is malformed", path)
	}
	for i, s := range ref.Sequences {
		if len(s) == 0 || len(ref.Logits[i]) != len(s) {
			t.Fatalf("%s: sequence %d is malformed", path, i)
		}
	}
	return &ref
}

// maxAbsDiff64 returns the largest |got[i] - want[i]|.
func maxAbsDiff64(got []float32, want []float64) float64 {
	d := 0.0
	for i := range want {
		d = max(d, math.Abs(float64(got[i])-want[i]))
	}
	return d
}

func TestFamiliesMatchPyTorch(t *testing.T) {
	refs, err := filepath.Glob(filepath.Join("testdata", "families", "*", "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) < 9 {
		t.Fatalf("found %d family fixtures, want 9 (run testdata/families/gen_families.py)", len(refs))
	}
	for _, refPath := range refs {
		src := filepath.Dir(refPath)
		t.Run(filepath.Base(src), func(t *testing.T) {
			ref := loadFamilyReference(t, refPath)
			dir := t.TempDir()
			if _, err := build.BuildFromHF(src, dir); err != nil {
				t.Fatalf("BuildFromHF: %v", err)
			}
			vocab := len(ref.Logits[0][0])
			wantContext := 512
			if filepath.Base(src) == "phi35" {
				wantContext = 64 // longrope: the original context, where the short factors hold
			}
			for _, path := range []string{AttentionPaged, AttentionDense} {
				m := openTestModel(t, dir, path)
				if got := m.Spec().MaxPositions; got != wantContext {
					t.Errorf("%s: context %d, want %d", path, got, wantContext)
				}
				check := func(how string, seq, pos int, logits []float32) {
					t.Helper()
					if d := maxAbsDiff64(logits[:vocab], ref.Logits[seq][pos]); d > familyTolerance {
						t.Errorf("%s, %s: sequence %d position %d differs from PyTorch by %.2e", path, how, seq, pos, d)
					}
				}

				// All sequences in one step, every position's logits.
				kv := newTestCache(m.Spec(), len(ref.Sequences), 64, 4, 3)
				seqs := make([]int, len(ref.Sequences))
				for i := range seqs {
					seqs[i] = i
				}
				out, err := m.Forward(kv.batch(seqs, ref.Sequences, true))
				if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				for s, toks := range ref.Sequences {
					for p := range toks {
						check("one batch", s, p, out.Logits[s][p*vocab:])
					}
				}

				// Token by token, sequence s starting at step 3s, so that the rows of a
				// step have different past lengths.
				kv = newTestCache(m.Spec(), len(ref.Sequences), 64, 4, 5)
				for step := 0; ; step++ {
					var rows []int
					var toks [][]int32
					for s, seq := range ref.Sequences {
						if p := step - 3*s; p >= 0 && p < len(seq) {
							rows = append(rows, s)
							toks = append(toks, seq[p:p+1])
						}
					}
					if len(rows) == 0 {
						if step > 3*len(ref.Sequences) {
							break
						}
						continue
					}
					out, err := m.Forward(kv.batch(rows, toks, false))
					if err != nil {
						t.Fatalf("%s step %d: %v", path, step, err)
					}
					for r, s := range rows {
						check("token by token", s, step-3*s, out.Logits[r])
					}
				}
			}
		})
	}
}
