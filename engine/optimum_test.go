package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// The tests in this file serve models/testdata/gpt2-optimum: a tiny GPT-2 written in
// PyTorch and exported with torch.onnx.export in the Hugging Face Optimum
// text-generation-with-past interface (models/testdata/gen_gpt2_optimum.py), whose
// reference.json records PyTorch's greedy continuations.

var gpt2Dir = filepath.Join("..", "models", "testdata", "gpt2-optimum")

// gpt2Model counts the passes whose padded key length (longest past + longest new
// tokens) is longer than the context window.
type gpt2Model struct {
	*models.DenseRunner
	mu        sync.Mutex
	overflows int
}

func (m *gpt2Model) Forward(b *models.Batch) (*models.Output, error) {
	maxPast, maxNew := 0, 0
	for _, s := range b.Seqs {
		maxPast, maxNew = max(maxPast, s.PastLen), max(maxNew, len(s.Tokens))
	}
	if maxPast+maxNew > m.Spec().MaxPositions {
		m.mu.Lock()
		m.overflows++
		m.mu.Unlock()
	}
	return m.DenseRunner.Forward(b)
}

func openGPT2(t *testing.T) (*gpt2Model, *tokenizer.Tokenizer) {
	t.Helper()
	r, err := models.OpenDense(gpt2Dir, models.RunnerOptions{ORTLib: ortLib(t), IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	tok, err := tokenizer.Load(gpt2Dir)
	if err != nil {
		t.Fatal(err)
	}
	return &gpt2Model{DenseRunner: r}, tok
}

// gpt2Greedy reads the greedy continuations (eos ignored) PyTorch computed.
func gpt2Greedy(t *testing.T) (prompts, want [][]int32) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(gpt2Dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Greedy []struct {
			Prompt []int32 `json:"prompt"`
			Tokens []int32 `json:"tokens"`
		} `json:"greedy"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatalf("reference.json: %v", err)
	}
	if len(ref.Greedy) != 8 {
		t.Fatalf("reference.json has %d greedy cases, want 8", len(ref.Greedy))
	}
	for _, g := range ref.Greedy {
		prompts, want = append(prompts, g.Prompt), append(want, g.Tokens)
	}
	return prompts, want
}

// runAlone runs each request by itself (sequential policy, no prefix cache).
func runAlone(t *testing.T, m Model, tok *tokenizer.Tokenizer, reqs []*Request) []result {
	t.Helper()
	cfg := tinyConfig()
	cfg.Policy = PolicySequential
	cfg.EnablePrefixCaching = false
	e, err := New(cfg, m, tok)
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	defer shutdown(t, e)
	out := make([]result, len(reqs))
	for i, r := range reqs {
		ch, err := e.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = collect(ch)
	}
	return out
}

// TestGPT2OptimumConcurrentGreedy serves 8 concurrent greedy requests on the GPT-2
// export: each equals its solo run and PyTorch's greedy continuation.
func TestGPT2OptimumConcurrentGreedy(t *testing.T) {
	m, tok := openGPT2(t)
	if sp := m.Spec(); sp.MaxPositions != 128 || sp.VocabSize != 512 || !slices.Equal(sp.EOSTokenIDs, []int32{2}) {
		t.Fatalf("spec %+v", sp)
	}
	prompts, want := gpt2Greedy(t)
	reqs := make([]*Request, len(prompts))
	for i, p := range prompts {
		reqs[i] = greedyRequest(fmt.Sprintf("g%d", i), p, len(want[i]))
		reqs[i].Params.IgnoreEOS = true
	}
	e, err := New(tinyConfig(), m, tok)
	if err != nil {
		t.Fatal(err)
	}
	// Submitted from 8 goroutines before the engine starts, so that the first step
	// sees all of them and the batching does not depend on timing.
	chans := make([]<-chan Event, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() {
			ch, err := e.Submit(context.Background(), r)
			if err != nil {
				t.Errorf("request %s: %v", r.ID, err)
				return
			}
			chans[i] = ch
		})
	}
	wg.Wait()
	if t.Failed() {
		shutdown(t, e)
		t.FailNow()
	}
	e.Start(context.Background())
	got := make([]result, len(reqs))
	for i, ch := range chans {
		wg.Go(func() { got[i] = collect(ch) })
	}
	wg.Wait()
	shutdown(t, e)
	longest := 0
	for _, w := range want {
		longest = max(longest, len(w))
	}
	if st := e.Stats(); st.Steps > int64(longest) {
		t.Errorf("%d steps for 8 requests of at most %d tokens: not batched", st.Steps, longest)
	}
	alone := runAlone(t, m, tok, reqs)
	for i, r := range reqs {
		g, a := got[i].seqs[0], alone[i].seqs[0]
		if g == nil || a == nil {
			t.Fatalf("request %s: no output", r.ID)
		}
		if !slices.Equal(g.TokenIDs, want[i]) {
			t.Errorf("request %s: batched %v, PyTorch %v", r.ID, g.TokenIDs, want[i])
		}
		if !slices.Equal(a.TokenIDs, want[i]) {
			t.Errorf("request %s: alone %v, PyTorch %v", r.ID, a.TokenIDs, want[i])
		}
		if g.Text != a.Text || g.FinishReason != FinishLength || a.FinishReason != FinishLength {
			t.Errorf("request %s: batched %q (%s), alone %q (%s)", r.ID, g.Text, g.FinishReason, a.Text, a.FinishReason)
		}
	}
}

// TestGPT2OptimumEndOfContext decodes one request to the last position of the
// 128-token context while other requests' prompts are prefilled next to it, so some
// passes have a longest past plus longest new-token count above 128 (which GPT-2's
// causal-mask buffer cannot span in one pass). Every request still equals its solo run.
func TestGPT2OptimumEndOfContext(t *testing.T) {
	m, tok := openGPT2(t)
	long := greedyRequest("long", testGPT2Prompt(1, 100), 100) // clipped to the 28 positions left
	long.Params.IgnoreEOS = true
	var shorts []*Request
	for i := range 3 {
		r := greedyRequest(fmt.Sprintf("short%d", i), testGPT2Prompt(2+i, 30+5*i), 4)
		r.Params.IgnoreEOS = true
		shorts = append(shorts, r)
	}
	// The short prompts must be prefilled while the long request is near the end of its
	// context; that depends on when the submitting goroutine runs, so a run that missed
	// the window is repeated (each run's outputs are checked below all the same).
	var first Event
	var got []result
	for attempt := 0; ; attempt++ {
		m.mu.Lock()
		m.overflows = 0
		m.mu.Unlock()
		e, err := New(tinyConfig(), m, tok)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := e.Submit(context.Background(), long)
		if err != nil {
			t.Fatal(err)
		}
		e.Start(context.Background())
		// Submit the short prompts once the long one is decoding.
		first = <-ch
		got = runAll(t, e, shorts)
		longRes := collect(ch)
		shutdown(t, e)
		mergeEvent(&first, *longRes.seqs[0])
		m.mu.Lock()
		overflows := m.overflows
		m.mu.Unlock()
		if overflows > 0 {
			break
		}
		if attempt == 9 {
			t.Fatal("no pass was longer than the context window in 10 runs; the test did not exercise it")
		}
	}

	reqs := append([]*Request{long}, shorts...)
	alone := runAlone(t, m, tok, reqs)
	got = append([]result{{seqs: map[int]*Event{0: &first}}}, got...)
	for i, r := range reqs {
		g, a := got[i].seqs[0], alone[i].seqs[0]
		if g.FinishReason != a.FinishReason || !slices.Equal(g.TokenIDs, a.TokenIDs) {
			t.Errorf("request %s: batched %v (%s %v), alone %v (%s)", r.ID, g.TokenIDs, g.FinishReason, g.Err, a.TokenIDs, a.FinishReason)
		}
	}
	if n := len(alone[0].seqs[0].TokenIDs); n != 28 || alone[0].seqs[0].FinishReason != FinishLength {
		t.Errorf("long request generated %d tokens (%s), want 28 (length)", n, alone[0].seqs[0].FinishReason)
	}
}

// testGPT2Prompt returns a deterministic prompt of n tokens starting with BOS.
func testGPT2Prompt(seed, n int) []int32 {
	out := []int32{1}
	for i := 1; i < n; i++ {
		out = append(out, int32(3+(seed*7919+i*104729+(seed*i)%13)%509))
	}
	return out
}
