package models

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

// The tests in this file serve a decoder that the project's own builder did not write:
// testdata/gpt2-optimum holds a tiny GPT-2 (learned position embeddings, LayerNorm,
// fused c_attn, GELU MLP, tied lm_head) written in PyTorch and exported with
// torch.onnx.export in the Hugging Face Optimum text-generation-with-past interface by
// testdata/gen_gpt2_optimum.py, with reference results computed by PyTorch in float64.

// gpt2OptimumDir is the exported GPT-2 model directory.
var gpt2OptimumDir = filepath.Join("testdata", "gpt2-optimum")

// gpt2Reference is testdata/gpt2-optimum/reference.json.
type gpt2Reference struct {
	VocabSize int `json:"vocab_size"`
	// Full holds logits of every prompt position computed without a cache.
	Full []struct {
		Tokens []int32   `json:"tokens"`
		Logits []float64 `json:"logits"` // [len(Tokens), vocab]
	} `json:"full"`
	// Cached holds a prefill followed by single-token steps through PyTorch's own past:
	// Logits row 0 is the prompt's last position, row i the position of Fed[i-1].
	Cached []struct {
		Prompt []int32   `json:"prompt"`
		Fed    []int32   `json:"fed"`
		Logits []float64 `json:"logits"` // [1+len(Fed), vocab]
	} `json:"cached"`
	// Greedy holds greedy continuations with eos ignored.
	Greedy []struct {
		Prompt []int32 `json:"prompt"`
		Tokens []int32 `json:"tokens"`
	} `json:"greedy"`
}

func loadGPT2Reference(t *testing.T) *gpt2Reference {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(gpt2OptimumDir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref gpt2Reference
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatalf("reference.json: %v", err)
	}
	if ref.VocabSize != 512 || len(ref.Full) == 0 || len(ref.Cached) == 0 || len(ref.Greedy) == 0 {
		t.Fatalf("reference.json is incomplete: vocab %d, %d/%d/%d cases", ref.VocabSize, len(ref.Full), len(ref.Cached), len(ref.Greedy))
	}
	return &ref
}

// row returns position p of a flattened [positions, vocab] reference.
func refRow(logits []float64, p, vocab int) []float64 { return logits[p*vocab : (p+1)*vocab] }

func TestOptimumGPT2Spec(t *testing.T) {
	for dir, kvType := range map[string]DType{
		gpt2OptimumDir:                         Float32,
		filepath.Join(gpt2OptimumDir, "f16kv"): Float16,
	} {
		r := openTestRunner(t, dir)
		want := Spec{NumLayers: 2, NumKVHeads: 4, HeadDim: 16, VocabSize: 512, MaxPositions: 128, KVDType: kvType,
			BOSTokenID: 1, EOSTokenIDs: []int32{2}}
		if got := r.Spec(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Spec = %+v, want %+v", dir, got, want)
		}
	}
}

// TestOptimumGPT2Logits compares the runner's logits with PyTorch's, one prompt at a
// time and all prompts (of lengths 12, 7, 4 and 1) right-padded into one batch.
func TestOptimumGPT2Logits(t *testing.T) {
	ref := loadGPT2Reference(t)
	r := openTestRunner(t, gpt2OptimumDir)
	V := r.Spec().VocabSize
	check := func(t *testing.T, what string, got []float32, i int) {
		t.Helper()
		c := ref.Full[i]
		if len(got) != len(c.Tokens)*V {
			t.Fatalf("%s: prompt %d: %d logits, want %d", what, i, len(got), len(c.Tokens)*V)
		}
		for p := range c.Tokens {
			if e := relErr(got[p*V:(p+1)*V], refRow(c.Logits, p, V)); e > logitTolerance {
				t.Fatalf("%s: prompt %d position %d: logits differ from PyTorch by %.2e", what, i, p, e)
			}
		}
	}
	batch := &Batch{}
	for i, c := range ref.Full {
		out, err := r.Forward(&Batch{Seqs: []SeqInput{{Tokens: c.Tokens, AllLogits: true}}})
		if err != nil {
			t.Fatal(err)
		}
		check(t, "alone", out.Logits[0], i)
		batch.Seqs = append(batch.Seqs, SeqInput{Tokens: c.Tokens, AllLogits: true})
	}
	out, err := r.Forward(batch)
	if err != nil {
		t.Fatal(err)
	}
	for i := range ref.Full {
		check(t, "batched", out.Logits[i], i)
	}
}

// TestOptimumGPT2CachedDecode prefills each prompt and then feeds PyTorch's tokens one
// at a time through a dense KV cache, alone and with both sequences in one batch (so
// rows have different past lengths), comparing every step with PyTorch's cached decode.
func TestOptimumGPT2CachedDecode(t *testing.T) {
	ref := loadGPT2Reference(t)
	for _, tc := range []struct {
		dir string
		tol float64
	}{
		{gpt2OptimumDir, logitTolerance},
		{filepath.Join(gpt2OptimumDir, "f16kv"), 1e-2}, // keys and values rounded to float16
	} {
		t.Run(filepath.Base(tc.dir), func(t *testing.T) {
			r := openTestRunner(t, tc.dir)
			V := r.Spec().VocabSize
			decode := func(t *testing.T, seqs []int) {
				t.Helper()
				kv := newContextCache(r.Spec(), len(seqs))
				rows := make([]int, len(seqs))
				toks := make([][]int32, len(seqs))
				for i, s := range seqs {
					rows[i], toks[i] = i, ref.Cached[s].Prompt
				}
				for step := 0; ; step++ {
					out, err := r.Forward(kv.batch(rows, toks, false))
					if err != nil {
						t.Fatal(err)
					}
					more := false
					for i, s := range seqs {
						c := ref.Cached[s]
						if step > len(c.Fed) {
							continue
						}
						if e := relErr(out.Logits[i], refRow(c.Logits, step, V)); e > tc.tol {
							t.Fatalf("sequence %d step %d: logits differ from PyTorch by %.2e", s, step, e)
						}
						if step < len(c.Fed) {
							if got := argmax(out.Logits[i]); got != c.Fed[step] {
								t.Fatalf("sequence %d step %d: greedy token %d, PyTorch %d", s, step, got, c.Fed[step])
							}
							toks[i] = []int32{c.Fed[step]}
							more = true
						} else {
							toks[i] = []int32{c.Fed[step-1]} // finished; keeps decoding, unchecked
						}
					}
					if !more {
						break
					}
				}
			}
			for s := range ref.Cached {
				decode(t, []int{s})
			}
			decode(t, []int{0, 1})
		})
	}
}

// TestOptimumGPT2BatchInvariance runs the shared batch-invariance schedules (mixed
// prompt lengths, prefill chunks next to decode steps) on the GPT-2 export.
func TestOptimumGPT2BatchInvariance(t *testing.T) {
	testBatchInvariance(t, openTestRunner(t, gpt2OptimumDir), logitTolerance)
}

// TestOptimumGPT2FullContext fills the context window: a sequence decoding its last
// positions shares batches with a fresh prompt, so the padded past plus the new
// tokens (maxPast + maxNew) is longer than the model's n_positions. Every row must
// still match its solo run, and the last position (127) must be usable.
func TestOptimumGPT2FullContext(t *testing.T) {
	r := openTestRunner(t, gpt2OptimumDir)
	sp := r.Spec()
	V := sp.VocabSize
	long := randTokens(41, sp.MaxPositions-4, V)
	short := randTokens(42, 20, V)
	longAlone := decodeAlone(t, r, long, 3) // positions up to MaxPositions-2
	shortAlone := decodeAlone(t, r, short, 1)

	kv := newContextCache(sp, 2)
	if _, err := r.Forward(kv.batch([]int{0}, [][]int32{long}, false)); err != nil {
		t.Fatal(err)
	}
	// Row 0 decodes at position 124 with a past of 124 while row 1 prefills 20 tokens:
	// the pass's key length is 144 > 128.
	b := kv.batch([]int{0, 1}, [][]int32{{longAlone.tokens[len(long)]}, short}, false)
	out, err := r.Forward(b)
	if err != nil {
		t.Fatalf("decode next to a prefill at the end of the context: %v", err)
	}
	if e := relErr32(out.Logits[0], longAlone.logits[len(long)]); e > logitTolerance {
		t.Fatalf("long row differs from its solo run by %.2e", e)
	}
	if e := relErr32(out.Logits[1], shortAlone.logits[len(short)-1]); e > logitTolerance {
		t.Fatalf("short row differs from its solo run by %.2e", e)
	}
	// The keys and values that pass stored are right: both rows decode on as alone.
	b = kv.batch([]int{0, 1}, [][]int32{{longAlone.tokens[len(long)+1]}, {shortAlone.tokens[len(short)]}}, false)
	if out, err = r.Forward(b); err != nil {
		t.Fatal(err)
	}
	if e := relErr32(out.Logits[0], longAlone.logits[len(long)+1]); e > logitTolerance {
		t.Fatalf("long row's next step differs from its solo run by %.2e", e)
	}
	if e := relErr32(out.Logits[1], shortAlone.logits[len(short)]); e > logitTolerance {
		t.Fatalf("short row's next step differs from its solo run by %.2e", e)
	}
	// Decode the long row to the last position alone, and a full-context prompt.
	for p := len(long) + 2; p < sp.MaxPositions; p++ {
		if _, err := r.Forward(kv.batch([]int{0}, [][]int32{{1}}, false)); err != nil {
			t.Fatalf("position %d: %v", p, err)
		}
	}
	if _, err := r.Forward(kv.batch([]int{0}, [][]int32{{1}}, false)); err == nil {
		t.Fatal("a token beyond the context window was accepted")
	}
	if _, err := r.Forward(&Batch{Seqs: []SeqInput{{Tokens: randTokens(43, sp.MaxPositions, V)}}}); err != nil {
		t.Fatalf("a prompt of exactly n_positions tokens: %v", err)
	}
}

func TestPlanPassesRespectsContext(t *testing.T) {
	seq := func(past, n int) SeqInput { return SeqInput{PastLen: past, Tokens: make([]int32, n)} }
	b := &Batch{Seqs: []SeqInput{seq(120, 1), seq(0, 20), seq(100, 1), seq(0, 8), seq(127, 1), seq(10, 10)}}
	// A cost model that favours one pass still splits where the context demands it.
	got := planPasses(b, costModel{perToken: 1, perPass: 1e30}, 128)
	if len(got) < 2 {
		t.Fatalf("planPasses = %v: one pass would span %d positions", got, 127+20)
	}
	checkGroups(t, b, got, 128)
}

func TestPlanPasses(t *testing.T) {
	seq := func(past, n int) SeqInput { return SeqInput{PastLen: past, Tokens: make([]int32, n)} }
	sp := Spec{NumLayers: 6, NumKVHeads: 4, HeadDim: 32, VocabSize: 4096, MaxPositions: 512}
	cost := newCostModel(sp, 23<<20)

	// Decoding sequences of similar lengths: one pass.
	var decode []SeqInput
	for i := range 48 {
		decode = append(decode, seq(150+i, 1))
	}
	if got := planPasses(&Batch{Seqs: decode}, cost, 512); got != nil {
		t.Errorf("48 decoding rows of past 150..197: planned %v, want one pass", got)
	}

	// A 384-token prompt chunk next to the decoding rows: the chunk runs on its own.
	mixed := &Batch{Seqs: append(slices.Clone(decode[:20]), seq(0, 384))}
	mixed.Seqs = append(mixed.Seqs, decode[20:]...)
	got := planPasses(mixed, cost, 512)
	checkGroups(t, mixed, got, 512)
	if !slices.ContainsFunc(got, func(g []int) bool { return len(g) == 1 && g[0] == 20 }) {
		t.Errorf("prompt chunk next to 48 decoding rows: planned %v, want row 20 alone", got)
	}
	if len(got) != 2 {
		t.Errorf("planned %d passes, want 2 (chunk, decodes)", len(got))
	}

	// One pass of a single row.
	if got := planPasses(&Batch{Seqs: []SeqInput{seq(0, 300)}}, cost, 512); got != nil {
		t.Errorf("a single row: planned %v", got)
	}
}

// checkGroups requires groups to hold every row of b exactly once, in ascending order
// inside a group, each group spanning at most maxPositions positions.
func checkGroups(t *testing.T, b *Batch, groups [][]int, maxPositions int) {
	t.Helper()
	seen := make([]int, len(b.Seqs))
	for _, g := range groups {
		if !slices.IsSorted(g) {
			t.Errorf("group %v is not in row order", g)
		}
		past, n := 0, 0
		for _, row := range g {
			seen[row]++
			past, n = max(past, b.Seqs[row].PastLen), max(n, len(b.Seqs[row].Tokens))
		}
		if past+n > maxPositions {
			t.Errorf("group %v spans %d positions > %d", g, past+n, maxPositions)
		}
	}
	for row, k := range seen {
		if k != 1 {
			t.Errorf("row %d is in %d groups", row, k)
		}
	}
}
