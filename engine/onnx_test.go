package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/scheduler"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// The real-model tests run a tiny random Llama (models/testdata/tiny-llama) through ONNX
// Runtime. The model is built once per test binary into a temporary directory.

var (
	onnxOnce   sync.Once
	onnxDir    string
	onnxErr    error
	onnxTmpDir string
)

// ortLib finds the ONNX Runtime library: $CONVEYOR_ORT_LIB, else <repo>/.ort/... found by
// walking up to go.mod. A missing library fails the test with how to get it.
func ortLib(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv(models.ORTLibEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			tb.Fatalf("%s=%s: %v (run `make ort`)", models.ORTLibEnv, p, err)
		}
		return p
	}
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, models.DefaultORTLib)
			if _, err := os.Stat(p); err != nil {
				tb.Fatalf("ONNX Runtime library %s not found: run `make ort` (or set %s)", p, models.ORTLibEnv)
			}
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatalf("go.mod not found above the test directory; set %s", models.ORTLibEnv)
		}
		dir = parent
	}
}

// tinyModelDir builds the tiny random model directory (model.onnx, config.json and the
// tokenizer) once.
func tinyModelDir(tb testing.TB) string {
	tb.Helper()
	onnxOnce.Do(func() {
		onnxTmpDir, onnxErr = os.MkdirTemp("", "conveyor-engine-test-")
		if onnxErr != nil {
			return
		}
		onnxDir = filepath.Join(onnxTmpDir, "tiny-llama")
		_, onnxErr = convert.BuildRandom(filepath.Join("..", "models", "testdata", "tiny-llama", "config.json"), onnxDir, 1, convert.Options{})
	})
	if onnxErr != nil {
		tb.Fatalf("building the tiny test model: %v", onnxErr)
	}
	return onnxDir
}

// removeTinyModel deletes the built model (called from TestMain).
func removeTinyModel() {
	if onnxTmpDir != "" {
		os.RemoveAll(onnxTmpDir)
	}
}

// countingModel counts forward passes and fed tokens of a real model.
type countingModel struct {
	models.Model
	mu     sync.Mutex
	calls  int
	tokens int
}

func (m *countingModel) Forward(b *models.Batch) (*models.Output, error) {
	m.mu.Lock()
	m.calls++
	for _, s := range b.Seqs {
		m.tokens += len(s.Tokens)
	}
	m.mu.Unlock()
	return m.Model.Forward(b)
}

// attentionPaths are the attention paths the real-model tests run on.
var attentionPaths = []string{models.AttentionGraph, models.AttentionDense}

func openTiny(tb testing.TB, attention string) (*countingModel, *tokenizer.Tokenizer) {
	tb.Helper()
	dir := tinyModelDir(tb)
	r, err := models.Open(dir, models.RunnerOptions{ORTLib: ortLib(tb), IntraOpThreads: 1, Attention: attention})
	if err != nil {
		tb.Fatal(err)
	}
	if r.Attention() != attention {
		tb.Fatalf("opened with %s attention, want %s", r.Attention(), attention)
	}
	tb.Cleanup(func() { r.Close() })
	tok, err := tokenizer.Load(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return &countingModel{Model: r}, tok
}

func tinyConfig() Config {
	c := DefaultConfig()
	c.MaxNumSeqs = 64
	c.MaxNumBatchedTokens = 512
	c.KVCacheBytes = 32 << 20
	c.StorageParallelism = 1
	return c
}

// tinyRequests returns n greedy requests with tokenized prompts of mixed lengths and
// mixed output lengths.
func tinyRequests(tb testing.TB, tok *tokenizer.Tokenizer, n int) []*Request {
	words := []string{"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "far", "away", "into", "night"}
	reqs := make([]*Request, n)
	for i := range reqs {
		text := ""
		for j := range 1 + (i*7)%40 {
			text += words[(i*3+j*5)%len(words)] + " "
		}
		ids, err := tok.Encode(text, true)
		if err != nil {
			tb.Fatal(err)
		}
		reqs[i] = greedyRequest(fmt.Sprintf("t%d", i), ids, 1+(i*11)%24)
	}
	return reqs
}

func TestONNXConcurrentMatchesAlone(t *testing.T) {
	for _, attention := range attentionPaths {
		t.Run(attention, func(t *testing.T) { testONNXConcurrentMatchesAlone(t, attention) })
	}
}

func testONNXConcurrentMatchesAlone(t *testing.T, attention string) {
	m, tok := openTiny(t, attention)
	reqs := tinyRequests(t, tok, 64)

	cfg := tinyConfig()
	e, err := New(cfg, m, tok)
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	res := runAll(t, e, reqs)
	shutdown(t, e)
	st := e.Stats()

	m.mu.Lock()
	calls, fed := m.calls, m.tokens
	m.mu.Unlock()
	if int64(calls) != st.Steps {
		t.Fatalf("%d forward passes for %d steps", calls, st.Steps)
	}
	gen := 0
	for _, r := range res {
		gen += r.usage.CompletionTokens
	}
	if calls >= gen/2 {
		t.Fatalf("%d forward passes for %d generated tokens: not batched", calls, gen)
	}
	if want := fedTokens(res); fed != want {
		t.Fatalf("fed %d tokens, want Σprompt − cached + Σgenerated − requests = %d", fed, want)
	}

	// Each request alone: sequential policy, no prefix cache.
	cfg.Policy = PolicySequential
	cfg.EnablePrefixCaching = false
	alone, err := New(cfg, m, tok)
	if err != nil {
		t.Fatal(err)
	}
	alone.Start(context.Background())
	defer shutdown(t, alone)
	for i, r := range reqs {
		ch, err := alone.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		want := collect(ch).seqs[0]
		got := res[i].seqs[0]
		if !slices.Equal(got.TokenIDs, want.TokenIDs) || got.Text != want.Text || got.FinishReason != want.FinishReason {
			t.Fatalf("request %s: batched %v %q (%s), alone %v %q (%s)", r.ID,
				got.TokenIDs, got.Text, got.FinishReason, want.TokenIDs, want.Text, want.FinishReason)
		}
		if want.Text != tok.Decode(want.TokenIDs, true) {
			t.Fatalf("request %s: streamed text %q, decoded %q", r.ID, want.Text, tok.Decode(want.TokenIDs, true))
		}
	}
}

func TestONNXPrefixCachingAndPreemption(t *testing.T) {
	for _, attention := range attentionPaths {
		t.Run(attention, func(t *testing.T) { testONNXPrefixCachingAndPreemption(t, attention) })
	}
}

func testONNXPrefixCachingAndPreemption(t *testing.T, attention string) {
	m, tok := openTiny(t, attention)
	prefix := tinyRequests(t, tok, 40)[39].Prompt // ~200 tokens
	for len(prefix) < 200 {
		prefix = append(prefix, prefix[1:]...)
	}
	prefix = prefix[:200]
	a := append(slices.Clone(prefix), 5, 6, 7)
	b := append(slices.Clone(prefix), 8, 9, 10, 11)

	run := func(cfg Config, reqs ...*Request) ([]result, int) {
		e, err := New(cfg, m, tok)
		if err != nil {
			t.Fatal(err)
		}
		e.Start(context.Background())
		defer shutdown(t, e)
		var out []result
		fed := 0
		for _, r := range reqs {
			m.mu.Lock()
			before := m.tokens
			m.mu.Unlock()
			out = append(out, runAll(t, e, []*Request{r})...)
			m.mu.Lock()
			fed = m.tokens - before
			m.mu.Unlock()
		}
		return out, fed // fed: the last request's tokens
	}
	cfg := tinyConfig()
	cached, fedCached := run(cfg, greedyRequest("a", a, 10), greedyRequest("b", b, 10))
	cfg.EnablePrefixCaching = false
	plain, _ := run(cfg, greedyRequest("b", b, 10))

	gotB, wantB := cached[1].seqs[0], plain[0].seqs[0]
	if !slices.Equal(gotB.TokenIDs, wantB.TokenIDs) {
		t.Fatalf("with the prefix cache %v, without %v", gotB.TokenIDs, wantB.TokenIDs)
	}
	if cached[1].usage.CachedTokens != 192 {
		t.Fatalf("cached %d tokens, want 192", cached[1].usage.CachedTokens)
	}
	if want := len(b) - 192 + len(gotB.TokenIDs) - 1; fedCached != want {
		t.Fatalf("second request fed %d tokens, want %d", fedCached, want)
	}

	// A pool of 12 blocks (192 tokens) for 6 requests of ~150 tokens: preemptions, same outputs.
	reqs := make([]*Request, 6)
	for i := range reqs {
		reqs[i] = greedyRequest(fmt.Sprintf("p%d", i), append(slices.Clone(prefix[:60+i*7]), int32(20+i)), 40)
		reqs[i].Params.IgnoreEOS = true
	}
	small := tinyConfig()
	small.EnablePrefixCaching = false
	small.KVCacheBytes = 12 * 16 * 512 // 512 bytes per token for this model
	e, err := New(small, m, tok)
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	squeezed := runAll(t, e, reqs)
	shutdown(t, e)
	if e.Stats().Preemptions == 0 || e.NumKVBlocks() != 12 {
		t.Fatalf("%d preemptions with %d blocks", e.Stats().Preemptions, e.NumKVBlocks())
	}
	for i, r := range reqs {
		alone, _ := run(tinyConfig(), r)
		if !slices.Equal(squeezed[i].seqs[0].TokenIDs, alone[0].seqs[0].TokenIDs) {
			t.Fatalf("request %s: under preemption %v, alone %v", r.ID, squeezed[i].seqs[0].TokenIDs, alone[0].seqs[0].TokenIDs)
		}
	}
}

// TestONNXPathsAgree serves the same requests on the paged and the dense attention
// paths: the greedy outputs match token for token.
func TestONNXPathsAgree(t *testing.T) {
	var outs [][]result
	for _, attention := range attentionPaths {
		m, tok := openTiny(t, attention)
		e, err := New(tinyConfig(), m, tok)
		if err != nil {
			t.Fatal(err)
		}
		e.Start(context.Background())
		outs = append(outs, runAll(t, e, tinyRequests(t, tok, 48)))
		shutdown(t, e)
	}
	for i := range outs[0] {
		paged, dense := outs[0][i].seqs[0], outs[1][i].seqs[0]
		if !slices.Equal(paged.TokenIDs, dense.TokenIDs) {
			t.Fatalf("request %d: paged %v, dense %v", i, paged.TokenIDs, dense.TokenIDs)
		}
	}
}

// TestONNXAbortsReturnEveryBlock cancels requests mid-generation on the step graph:
// every block returns to the pool and the pool's invariants hold.
func TestONNXAbortsReturnEveryBlock(t *testing.T) {
	m, tok := openTiny(t, models.AttentionGraph)
	e, err := New(tinyConfig(), m, tok)
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	reqs := tinyRequests(t, tok, 24)
	var cancels []context.CancelFunc
	var chans []<-chan Event
	for _, r := range reqs {
		r.Params.MaxTokens, r.Params.IgnoreEOS = 400, true
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := e.Submit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		cancels, chans = append(cancels, cancel), append(chans, ch)
	}
	waitFor(t, func() bool { return e.Stats().GenerationTokens > 100 })
	for _, c := range cancels {
		c()
	}
	for i, ch := range chans {
		if ev := collect(ch).seqs[0]; ev == nil || ev.FinishReason != FinishAbort {
			t.Fatalf("request %d: last event %+v, want an abort", i, ev)
		}
	}
	shutdown(t, e)
	if ps := e.pool.Stats(); ps.FreeBlocks != ps.TotalBlocks || ps.UsedBlocks != 0 {
		t.Fatalf("pool after the aborts: %+v", ps)
	}
	if err := e.pool.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestONNXFloat16KVCache serves on a float16 KV cache: the same memory budget holds twice
// the blocks, and requests complete (their logits are checked against the float64
// reference in package models).
func TestONNXFloat16KVCache(t *testing.T) {
	// The step graph's cache type is built in: the tiny model's is float32.
	half := t.TempDir()
	if _, err := convert.BuildRandom(filepath.Join("..", "models", "testdata", "tiny-llama", "config.json"), half, 1,
		convert.Options{StepKVDType: convert.Float16}); err != nil {
		t.Fatal(err)
	}
	var blocks []int
	for _, dtype := range []string{"float32", "float16"} {
		dir := tinyModelDir(t)
		if dtype == "float16" {
			dir = half
		}
		r, err := models.Open(dir, models.RunnerOptions{ORTLib: ortLib(t), IntraOpThreads: 1, KVCacheDType: dtype})
		if err != nil {
			t.Fatal(err)
		}
		tok, err := tokenizer.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(tinyConfig(), r, tok)
		if err != nil {
			t.Fatal(err)
		}
		e.Start(context.Background())
		for i, res := range runAll(t, e, tinyRequests(t, tok, 8)) {
			if s := res.seqs[0]; s == nil || len(s.TokenIDs) == 0 || s.FinishReason == FinishError {
				t.Fatalf("%s request %d: %+v", dtype, i, s)
			}
		}
		shutdown(t, e)
		blocks = append(blocks, e.NumKVBlocks())
		_ = r.Close()
	}
	if blocks[1] != 2*blocks[0] {
		t.Errorf("KV blocks in the same budget: float32 %d, float16 %d; want twice", blocks[0], blocks[1])
	}
}

// TestONNXSpeculationMatches: on every attention path of a real model, prompt-lookup
// speculation (proposals of up to 4 tokens verified in the shared step, whatever the
// batch) returns the very tokens decoding without it returns, for 24 concurrent greedy
// requests of mixed lengths; the random model's replies repeat, so proposals are
// accepted and rejected both.
func TestONNXSpeculationMatches(t *testing.T) {
	for _, attention := range attentionPaths {
		t.Run(attention, func(t *testing.T) {
			m, tok := openTiny(t, attention)
			run := func(spec scheduler.Speculation) ([]result, Stats) {
				cfg := tinyConfig()
				cfg.Speculation = spec
				e, err := New(cfg, m, tok)
				if err != nil {
					t.Fatal(err)
				}
				e.Start(context.Background())
				reqs := tinyRequests(t, tok, 24)
				for _, r := range reqs {
					r.Params.MaxTokens += 24
				}
				out := runAll(t, e, reqs)
				st := e.Stats()
				shutdown(t, e)
				return out, st
			}
			want, _ := run(scheduler.Speculation{})
			got, st := run(scheduler.Speculation{NumTokens: 4, LookupMin: 1, LookupMax: 3})
			for i := range want {
				if w, g := want[i].seqs[0].TokenIDs, got[i].seqs[0].TokenIDs; !slices.Equal(w, g) {
					t.Fatalf("request %d: %v with speculation, %v without", i, g, w)
				}
			}
			t.Logf("%s: %d proposed, %d accepted (by depth %v)", attention, st.SpecDraftTokens, st.SpecAcceptedTokens, st.SpecAcceptedAt)
			if st.SpecAcceptedTokens == 0 || st.SpecAcceptedTokens == st.SpecDraftTokens {
				t.Fatalf("%d of %d proposals accepted; the test needs both outcomes", st.SpecAcceptedTokens, st.SpecDraftTokens)
			}
		})
	}
}

// TestONNXPrefixCachingLargeBlocks: on the step graph with 256-token blocks (the GPU's
// FlashAttention size for this model's heads), a second prompt sharing a 300-token prefix
// is served its first block from the prefix cache and decodes as it does without the
// cache.
func TestONNXPrefixCachingLargeBlocks(t *testing.T) {
	m, tok := openTiny(t, models.AttentionGraph)
	prefix := tinyRequests(t, tok, 40)[39].Prompt
	for len(prefix) < 300 {
		prefix = append(prefix, prefix[1:]...)
	}
	prefix = prefix[:300]
	a, b := append(slices.Clone(prefix), 5, 6, 7), append(slices.Clone(prefix), 8, 9, 10, 11)
	run := func(cache bool, reqs ...*Request) []result {
		cfg := tinyConfig()
		cfg.BlockSizeTokens = 256
		cfg.EnablePrefixCaching = cache
		e, err := New(cfg, m, tok)
		if err != nil {
			t.Fatal(err)
		}
		e.Start(context.Background())
		defer shutdown(t, e)
		var out []result
		for _, r := range reqs {
			out = append(out, runAll(t, e, []*Request{r})...)
		}
		return out
	}
	cached := run(true, greedyRequest("a", a, 10), greedyRequest("b", b, 10))
	plain := run(false, greedyRequest("b", b, 10))
	if got, want := cached[1].seqs[0].TokenIDs, plain[0].seqs[0].TokenIDs; !slices.Equal(got, want) {
		t.Fatalf("with the prefix cache %v, without %v", got, want)
	}
	if cached[1].usage.CachedTokens != 256 {
		t.Fatalf("cached %d tokens, want one 256-token block", cached[1].usage.CachedTokens)
	}
}

// TestONNXDraftModelMatches: with a draft model proposing the tokens (the draft_model
// method), greedy decoding returns the very tokens it returns without speculation, one
// request alone and 64 at once, whether the draft is the model itself (every proposal
// accepted) or its int4 build (proposals accepted and rejected); on every attention
// path with the model as its own draft, on the step graph with the int4 one.
func TestONNXDraftModelMatches(t *testing.T) {
	int4Dir := filepath.Join(t.TempDir(), "int4")
	q := convert.Options{Quantize: convert.Quantization{Bits: 4, BlockSize: 32}}
	if _, err := convert.BuildRandom(filepath.Join("..", "models", "testdata", "tiny-llama", "config.json"), int4Dir, 1, q); err != nil {
		t.Fatal(err)
	}
	openDraft := func(t *testing.T, dir, attention string) Model {
		r, err := models.Open(dir, models.RunnerOptions{ORTLib: ortLib(t), IntraOpThreads: 1, Attention: attention})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	for _, tc := range []struct {
		attention, draft string
	}{
		{models.AttentionGraph, "int4"}, {models.AttentionGraph, "itself"},
		{models.AttentionDense, "itself"},
	} {
		t.Run(tc.attention+"/"+tc.draft, func(t *testing.T) {
			m, tok := openTiny(t, tc.attention)
			dir := tinyModelDir(t)
			if tc.draft == "int4" {
				dir = int4Dir
			}
			draft := openDraft(t, dir, tc.attention)
			for _, n := range []int{1, 64} {
				run := func(draft Model) ([]result, Stats) {
					cfg := tinyConfig()
					if draft != nil {
						cfg.Speculation = scheduler.Speculation{NumTokens: 4, External: true}
						cfg.DraftModel = draft
					}
					e, err := New(cfg, m, tok)
					if err != nil {
						t.Fatal(err)
					}
					e.Start(context.Background())
					reqs := tinyRequests(t, tok, 64)[64-n:]
					for _, r := range reqs {
						r.Params.MaxTokens += 24
					}
					out := runAll(t, e, reqs)
					st := e.Stats()
					shutdown(t, e)
					if e.drafter != nil && e.drafter.failures != 0 {
						t.Fatalf("%d draft passes failed", e.drafter.failures)
					}
					return out, st
				}
				want, _ := run(nil)
				got, st := run(draft)
				for i := range want {
					if w, g := want[i].seqs[0].TokenIDs, got[i].seqs[0].TokenIDs; !slices.Equal(w, g) {
						t.Fatalf("%d at once, request %d: %v with speculation, %v without", n, i, g, w)
					}
				}
				t.Logf("%d at once: %d proposed, %d accepted (by depth %v)", n, st.SpecDraftTokens, st.SpecAcceptedTokens, st.SpecAcceptedAt)
				switch {
				case st.SpecDraftTokens == 0:
					t.Fatal("nothing proposed")
				case tc.draft == "itself" && float64(st.SpecAcceptedTokens) < 0.9*float64(st.SpecDraftTokens):
					t.Fatalf("the model as its own draft: %d of %d accepted", st.SpecAcceptedTokens, st.SpecDraftTokens)
				case tc.draft == "int4" && n == 64 && (st.SpecAcceptedTokens == 0 || st.SpecAcceptedTokens == st.SpecDraftTokens):
					t.Fatalf("the int4 draft: %d of %d accepted; the test needs both outcomes", st.SpecAcceptedTokens, st.SpecDraftTokens)
				}
			}
		})
	}
}
