package models

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// The default model's cross-check: models/default/reference_logits.json holds logits computed by the PyTorch Llama
// the model was trained with (models/train/llama.py, float32 math on the float16 checkpoint). Conveyor's ONNX graph,
// built from the same checkpoint by convert.BuildFromHF, must reproduce them. This is the independent check that the Go
// builder implements Llama (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU, tied embeddings) the way
// Hugging Face does.

// defaultModelDir is the shipped checkpoint, relative to this package.
const defaultModelDir = "default"

// crosscheckTolerance is the largest absolute logit difference accepted.
const crosscheckTolerance = 1e-3

// referenceLogits is the fixture written by models/train/export_fixture.py.
type referenceLogits struct {
	VocabSize int               `json:"vocab_size"`
	HeadVocab int               `json:"head_vocab"`
	Prompts   []referencePrompt `json:"prompts"`
}

// referencePrompt holds, for every position of one prompt, the first HeadVocab logits, the argmax and the
// log-sum-exp of the whole row, and the whole row of the last position.
type referencePrompt struct {
	Text       string      `json:"text"`
	IDs        []int32     `json:"ids"`
	LogitsHead [][]float64 `json:"logits_head"`
	Argmax     []int32     `json:"argmax"`
	LogSumExp  []float64   `json:"logsumexp"`
	LastLogits []float64   `json:"last_logits"`
}

func loadReferenceLogits(t *testing.T, dir string) *referenceLogits {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "reference_logits.json"))
	if err != nil {
		t.Fatalf("reading the fixture: %v", err)
	}
	var ref referenceLogits
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatalf("parsing the fixture: %v", err)
	}
	if len(ref.Prompts) == 0 || ref.HeadVocab <= 0 {
		t.Fatalf("fixture holds no prompts")
	}
	for i, p := range ref.Prompts {
		n := len(p.IDs)
		if n == 0 || len(p.LogitsHead) != n || len(p.Argmax) != n || len(p.LogSumExp) != n || len(p.LastLogits) != ref.VocabSize {
			t.Fatalf("fixture prompt %d is malformed", i)
		}
	}
	return &ref
}

// buildDefaultModel converts the checkpoint in dir with convert.BuildFromHF and opens it
// on both attention paths.
func buildDefaultModel(t *testing.T, dir string) map[string]Model {
	t.Helper()
	out := t.TempDir()
	if _, err := convert.BuildFromHF(dir, out, convert.Options{}); err != nil {
		t.Fatalf("convert.BuildFromHF(%s): %v", dir, err)
	}
	return map[string]Model{AttentionGraph: openTestModel(t, out, AttentionGraph), AttentionDense: openTestModel(t, out, AttentionDense)}
}

// checkPosition compares one position's full logits row with the reference for position pos of p.
func checkPosition(t *testing.T, where string, got []float32, p *referencePrompt, pos int) {
	t.Helper()
	worst := 0.0
	for j, want := range p.LogitsHead[pos] {
		worst = math.Max(worst, math.Abs(float64(got[j])-want))
	}
	if worst > crosscheckTolerance {
		t.Errorf("%s position %d: first %d logits differ by up to %.3g", where, pos, len(p.LogitsHead[pos]), worst)
	}
	if d := math.Abs(logSumExp(got) - p.LogSumExp[pos]); d > crosscheckTolerance {
		t.Errorf("%s position %d: log-sum-exp of the row differs by %.3g", where, pos, d)
	}
	best := got[argmax(got)]
	if d := float64(best - got[p.Argmax[pos]]); d > crosscheckTolerance {
		t.Errorf("%s position %d: reference argmax %d is %.3g below the row's max", where, pos, p.Argmax[pos], d)
	}
	if pos == len(p.IDs)-1 {
		worst = 0
		for j, want := range p.LastLogits {
			worst = math.Max(worst, math.Abs(float64(got[j])-want))
		}
		if worst > crosscheckTolerance {
			t.Errorf("%s last position: logits differ by up to %.3g", where, worst)
		}
	}
}

func logSumExp(xs []float32) float64 {
	m := float64(xs[0])
	for _, x := range xs {
		m = math.Max(m, float64(x))
	}
	s := 0.0
	for _, x := range xs {
		s += math.Exp(float64(x) - m)
	}
	return m + math.Log(s)
}

// crosscheckModelDir runs all prompts of dir's fixture through the model built from dir, on the paged and the
// dense attention path: once as one batch of whole prompts, and once for the longest prompt as a prefill of its
// first half followed by one token per pass through the KV cache (paged blocks placed at random).
func crosscheckModelDir(t *testing.T, dir string) {
	ref := loadReferenceLogits(t, dir)
	for attention, r := range buildDefaultModel(t, dir) {
		t.Run(attention, func(t *testing.T) { crosscheckModel(t, ref, r) })
	}
}

func crosscheckModel(t *testing.T, ref *referenceLogits, r Model) {
	spec := r.Spec()
	if spec.VocabSize != ref.VocabSize {
		t.Fatalf("model vocabulary %d, fixture %d", spec.VocabSize, ref.VocabSize)
	}
	V := spec.VocabSize

	t.Run("batch", func(t *testing.T) {
		kv := newTestCache(spec, len(ref.Prompts), 64, 16, 3)
		seqs := make([]int, len(ref.Prompts))
		tokens := make([][]int32, len(ref.Prompts))
		for i, p := range ref.Prompts {
			seqs[i], tokens[i] = i, p.IDs
		}
		out, err := r.Forward(kv.batch(seqs, tokens, true))
		if err != nil {
			t.Fatalf("Forward: %v", err)
		}
		for i := range ref.Prompts {
			p := &ref.Prompts[i]
			if len(out.Logits[i]) != len(p.IDs)*V {
				t.Fatalf("prompt %d: %d logits, want %d", i, len(out.Logits[i]), len(p.IDs)*V)
			}
			for pos := range p.IDs {
				checkPosition(t, fmt.Sprintf("prompt %d", i), out.Logits[i][pos*V:(pos+1)*V], p, pos)
			}
		}
	})

	t.Run("incremental", func(t *testing.T) {
		p := &ref.Prompts[0]
		for i := range ref.Prompts {
			if len(ref.Prompts[i].IDs) > len(p.IDs) {
				p = &ref.Prompts[i]
			}
		}
		kv := newTestCache(spec, 1, 16, 16, 4)
		half := len(p.IDs) / 2
		out, err := r.Forward(kv.batch([]int{0}, [][]int32{p.IDs[:half]}, false))
		if err != nil {
			t.Fatalf("prefill: %v", err)
		}
		checkPosition(t, "prefill", out.Logits[0], p, half-1)
		for pos := half; pos < len(p.IDs); pos++ {
			out, err := r.Forward(kv.batch([]int{0}, [][]int32{p.IDs[pos : pos+1]}, false))
			if err != nil {
				t.Fatalf("decode position %d: %v", pos, err)
			}
			checkPosition(t, "decode", out.Logits[0], p, pos)
		}
	})
}

// TestDefaultModelMatchesPyTorch checks the shipped checkpoint against the PyTorch reference logits.
func TestDefaultModelMatchesPyTorch(t *testing.T) {
	crosscheckModelDir(t, defaultModelDir)
}

// TestDefaultModelFixtureTokens checks that the fixture's token ids are what the shipped tokenizer.json produces
// (with the bos token), so the reference stands for real prompts.
func TestDefaultModelFixtureTokens(t *testing.T) {
	checkFixtureTokens(t, defaultModelDir)
}

func checkFixtureTokens(t *testing.T, dir string) {
	ref := loadReferenceLogits(t, dir)
	tk, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatalf("loading the tokenizer: %v", err)
	}
	if got := tk.VocabSize(); got != ref.VocabSize {
		t.Errorf("tokenizer vocabulary %d, model %d", got, ref.VocabSize)
	}
	for _, p := range ref.Prompts {
		ids, err := tk.Encode(p.Text, true)
		if err != nil {
			t.Fatalf("encoding %q: %v", p.Text, err)
		}
		if !slices.Equal(ids, p.IDs) {
			t.Errorf("%q: tokens %v, fixture has %v", p.Text, ids, p.IDs)
		}
	}
}
