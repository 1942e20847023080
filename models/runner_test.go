package models

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/conveyor-llm/conveyor/models/convert"
)

// buildRunnerTestModel writes the model directory of cfg with RandomWeights(seed) into
// dir, as `conveyor build-model` does (model.onnx and the step graph, whose cache is
// kvType), and returns the weights.
func buildRunnerTestModel(tb testing.TB, cfg *convert.Config, seed int64, dir string, kvType convert.DType) convert.Weights {
	tb.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	src := filepath.Join(tb.TempDir(), "config.json")
	if err := os.WriteFile(src, raw, 0o644); err != nil {
		tb.Fatal(err)
	}
	if _, err := convert.BuildRandom(src, dir, seed, convert.Options{StepKVDType: kvType}); err != nil {
		tb.Fatalf("BuildRandom: %v", err)
	}
	return convert.RandomWeights(cfg, seed)
}

func openTestModel(tb testing.TB, dir, attention string) Model {
	tb.Helper()
	m, err := Open(dir, RunnerOptions{ORTLib: testORTLib(tb), IntraOpThreads: 2, Attention: attention})
	if err != nil {
		tb.Fatalf("Open(%s): %v", attention, err)
	}
	tb.Cleanup(func() { _ = m.Close() })
	return m
}

// scenarioResult maps each sequence of cacheScenario to its tokens and to the logits at
// every position it computed.
type scenarioResult struct {
	tokens [3][]int32
	logits [3][][]float32 // per position
}

// cacheScenario runs a fixed sequence of steps over a paged cache with blocks placed at
// random (of the model's smallest size, at least 4 tokens): a prompt of three blocks and
// two tokens prefilled in two chunks, a second sequence that shares the first one's full
// prefix blocks, a third forked from the first by copying its partial block
// (copy-on-write), then a step mixing a decode token, a prompt chunk with a cache hit and
// a fresh prompt, and a decode step for all. run executes each step.
func cacheScenario(t *testing.T, spec Spec, vocab int, run func(step int, b *Batch) *Output) scenarioResult {
	t.Helper()
	kv := newTestCache(spec, 3, 96, 4, 11)
	var res scenarioResult
	for i := range res.logits {
		res.logits[i] = make([][]float32, 4*kv.bs+16)
	}
	full := 3 * kv.bs
	prompt := randTokens(1, full+2, vocab)
	step := 0
	feed := func(seqs []int, toks [][]int32) {
		b := kv.batch(seqs, toks, true)
		out := run(step, b)
		step++
		for r, s := range seqs {
			start := len(res.tokens[s])
			res.tokens[s] = append(res.tokens[s], toks[r]...)
			for j := range toks[r] {
				res.logits[s][start+j] = append([]float32(nil), out.Logits[r][j*vocab:(j+1)*vocab]...) // valid until the next Forward
			}
		}
	}
	feed([]int{0}, [][]int32{prompt[:6]})
	feed([]int{0}, [][]int32{prompt[6:]})
	// Sequence 1 shares sequence 0's first three blocks.
	kv.share(0, 1, full)
	res.tokens[1] = append(res.tokens[1], prompt[:full]...)
	copy(res.logits[1], res.logits[0][:full])
	// Sequence 2 is a fork of sequence 0: full blocks shared, the partial block copied.
	kv.fork(0, 2)
	res.tokens[2] = append(res.tokens[2], prompt...)
	copy(res.logits[2], res.logits[0][:full+2])
	feed([]int{0, 1, 2}, [][]int32{{5}, randTokens(2, 5, vocab), randTokens(3, 3, vocab)})
	feed([]int{2, 0, 1}, [][]int32{{7}, {8}, {9}})
	return res
}

// TestRunnersMatchReference runs the cache scenario on the step graph and on the dense
// path, and checks every computed position against the float64 reference.
func TestRunnersMatchReference(t *testing.T) {
	cases := []struct {
		name                                       string
		hidden, layers, heads, kvHeads, inter, voc int
		tied                                       bool
	}{
		{"mha-tied", 64, 2, 4, 4, 64, 97, true},
		{"gqa-untied", 64, 2, 8, 2, 112, 131, false},
		{"mqa-untied", 64, 2, 4, 1, 40, 77, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := tinyConfig(c.hidden, c.layers, c.heads, c.kvHeads, c.inter, c.voc, c.tied)
			cfg.RopeTheta = []float64{10000, 500000, 50}[i]
			dir := t.TempDir()
			w := buildRunnerTestModel(t, cfg, int64(200+i), dir, convert.Float32)
			ref := newRefModel(t, cfg, w)
			for _, path := range []string{AttentionGraph, AttentionDense} {
				m := openTestModel(t, dir, path)
				if m.Attention() != path {
					t.Fatalf("Open(%s) gave %s", path, m.Attention())
				}
				res := cacheScenario(t, m.Spec(), c.voc, func(step int, b *Batch) *Output {
					out, err := m.Forward(b)
					if err != nil {
						t.Fatalf("%s step %d: %v", path, step, err)
					}
					return out
				})
				for s := range res.tokens {
					want := ref.forward(t, res.tokens[s])
					for p, got := range res.logits[s][:len(res.tokens[s])] {
						if e := relErr(got, want[p]); e > logitTolerance {
							t.Errorf("%s: sequence %d position %d differs from the reference by %.2e", path, s, p, e)
						}
					}
				}
			}
		})
	}
}

// TestGraphBatchInvariance checks that a row's logits do not depend on the rows next to it:
// each sequence alone against all of them in one step.
func TestGraphBatchInvariance(t *testing.T) {
	cfg := tinyConfig(64, 2, 8, 2, 112, 131, false)
	dir := t.TempDir()
	buildRunnerTestModel(t, cfg, 3, dir, convert.Float32)
	m := openTestModel(t, dir, AttentionGraph)
	prompts := [][]int32{randTokens(5, 9, 131), randTokens(6, 1, 131), randTokens(7, 17, 131)}
	together := newTestCache(m.Spec(), 3, 64, 4, 1)
	out, err := m.Forward(together.batch([]int{0, 1, 2}, prompts, false))
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range prompts {
		alone := newTestCache(m.Spec(), 1, 64, 4, uint64(9+i))
		o, err := m.Forward(alone.batch([]int{0}, [][]int32{p}, false))
		if err != nil {
			t.Fatal(err)
		}
		if e := relErr32(out.Logits[i], o.Logits[0]); e > 1e-5 {
			t.Errorf("sequence %d: batched logits differ from its logits alone by %.2e", i, e)
		}
	}
}

func TestGraphRejectsBadInput(t *testing.T) {
	cfg := tinyConfig(32, 2, 4, 2, 64, 50, true)
	dir := t.TempDir()
	buildRunnerTestModel(t, cfg, 4, dir, convert.Float32)
	m := openTestModel(t, dir, AttentionGraph)
	kv := newTestCache(m.Spec(), 1, 8, 4, 1)
	b := kv.batch([]int{0}, [][]int32{randTokens(1, kv.bs+1, 50)}, false)
	kv.tables[0][1] = 99 // a block outside the arena
	if _, err := m.Forward(b); !errors.Is(err, ErrRun) {
		t.Errorf("bad block table: %v, want ErrRun", err)
	}
	if _, err := m.Forward(&Batch{Seqs: []SeqInput{{Tokens: []int32{50}}}}); !errors.Is(err, ErrBatch) {
		t.Errorf("token out of the vocabulary: %v, want ErrBatch", err)
	}
	if _, err := m.Forward(&Batch{Seqs: []SeqInput{{Tokens: []int32{1}, PastLen: 3}}, Cache: kv.storage}); !errors.Is(err, ErrBatch) {
		t.Errorf("a row without a block table: %v, want ErrBatch", err)
	}
	if _, err := m.Forward(&Batch{Seqs: []SeqInput{{Tokens: []int32{1}, PastLen: 3}}}); !errors.Is(err, ErrBatch) {
		t.Errorf("a past without a cache: %v, want ErrBatch", err)
	}
	otherSpec := m.Spec()
	otherSpec.HeadDim *= 2
	other := newTestCache(otherSpec, 1, 8, 4, 1)
	if _, err := m.Forward(other.batch([]int{0}, [][]int32{{1}}, false)); !errors.Is(err, ErrBatch) {
		t.Errorf("another model's cache: %v, want ErrBatch", err)
	}
	// Without a cache, rows without past run on scratch blocks.
	if _, err := m.Forward(&Batch{Seqs: []SeqInput{{Tokens: []int32{1, 2}}, {Tokens: []int32{3}}}}); err != nil {
		t.Errorf("no cache, no past: %v", err)
	}
}

func TestOpenAttentionChoice(t *testing.T) {
	cfg := tinyConfig(32, 1, 4, 2, 64, 50, true)
	denseOnly := t.TempDir()
	buildTestModel(t, cfg, 1, denseOnly)
	if m := openTestModel(t, denseOnly, ""); m.Attention() != AttentionDense {
		t.Errorf("a model without a step graph opened with %s attention", m.Attention())
	}
	_, err := Open(denseOnly, RunnerOptions{ORTLib: testORTLib(t), Attention: AttentionGraph})
	if !errors.Is(err, ErrModelDir) {
		t.Errorf("the step graph of a model without one: %v, want ErrModelDir", err)
	}
	both := t.TempDir()
	buildRunnerTestModel(t, cfg, 1, both, convert.Float32)
	if m := openTestModel(t, both, ""); m.Attention() != AttentionGraph {
		t.Errorf("default attention on a model with a step graph: %s", m.Attention())
	}
	for _, attention := range []string{"flash", "paged"} {
		if _, err := Open(both, RunnerOptions{ORTLib: testORTLib(t), Attention: attention}); !errors.Is(err, ErrModelDir) {
			t.Errorf("attention %q: %v, want ErrModelDir", attention, err)
		}
	}
}

// TestGraphFloat16KV runs the cache scenario on a step graph built for a float16 KV cache:
// every position stays close to the float64 reference, and the cache really holds
// float16 (the logits differ from the float32 cache's).
func TestGraphFloat16KV(t *testing.T) {
	cfg := tinyConfig(64, 2, 8, 2, 112, 131, false)
	halfDir, fullDir := t.TempDir(), t.TempDir()
	w := buildRunnerTestModel(t, cfg, 21, halfDir, convert.Float16)
	buildRunnerTestModel(t, cfg, 21, fullDir, convert.Float32)
	run := func(m Model) scenarioResult {
		return cacheScenario(t, m.Spec(), cfg.VocabSize, func(step int, b *Batch) *Output {
			out, err := m.Forward(b)
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			return out
		})
	}
	half, full := openTestModel(t, halfDir, ""), openTestModel(t, fullDir, "")
	if half.Spec().KVDType != Float16 || full.Spec().KVDType != Float32 {
		t.Fatalf("KV types %v and %v", half.Spec().KVDType, full.Spec().KVDType)
	}
	h, f := run(half), run(full)
	ref := newRefModel(t, cfg, w)
	differs := false
	for s := range h.tokens {
		want := ref.forward(t, h.tokens[s])
		for p, got := range h.logits[s][:len(h.tokens[s])] {
			if e := relErr(got, want[p]); e > 2e-3 {
				t.Errorf("sequence %d position %d: float16 KV differs from the reference by %.2e", s, p, e)
			}
			differs = differs || relErr32(got, f.logits[s][p]) > 0
		}
	}
	if !differs {
		t.Error("float16 and float32 caches gave identical logits: the float16 cache is not used")
	}
	_, err := Open(fullDir, RunnerOptions{ORTLib: testORTLib(t), Attention: AttentionDense, KVCacheDType: "float16"})
	if !errors.Is(err, ErrModelDir) {
		t.Errorf("a float16 cache on the dense path of a float32 graph: %v, want ErrModelDir", err)
	}
	if _, err := Open(fullDir, RunnerOptions{ORTLib: testORTLib(t), KVCacheDType: "int3"}); !errors.Is(err, ErrModelDir) {
		t.Errorf("KV cache dtype int3: %v, want ErrModelDir", err)
	}
}
