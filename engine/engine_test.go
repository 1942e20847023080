package engine

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	removeTinyModel()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// runAll submits reqs concurrently and returns their results in order.
func runAll(t *testing.T, e *Engine, reqs []*Request) []result {
	t.Helper()
	out := make([]result, len(reqs))
	var wg sync.WaitGroup
	errs := make(chan error, len(reqs))
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch, err := e.Submit(context.Background(), r)
			if err != nil {
				errs <- fmt.Errorf("request %s: %w", r.ID, err)
				return
			}
			out[i] = collect(ch)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return out
}

// mixedRequests returns n greedy requests with prompts of 1..~300 tokens and 1..40
// output tokens.
func mixedRequests(n int) []*Request {
	reqs := make([]*Request, n)
	for i := range reqs {
		plen := 1 + (i*37)%300
		reqs[i] = greedyRequest(fmt.Sprintf("r%d", i), testPrompt(i, plen), 1+(i*13)%40)
	}
	return reqs
}

// checkGreedy asserts every request produced fakeGreedy's tokens and a consistent
// finish reason and usage.
func checkGreedy(t *testing.T, reqs []*Request, res []result) {
	t.Helper()
	for i, r := range reqs {
		want := fakeGreedy(r.Prompt, r.Params.MaxTokens)
		got := res[i].seqs[0]
		if got == nil {
			t.Fatalf("request %s: no events", r.ID)
		}
		if got.Err != nil {
			t.Fatalf("request %s failed: %v", r.ID, got.Err)
		}
		if !slices.Equal(got.TokenIDs, want) {
			t.Fatalf("request %s: tokens %v, want %v", r.ID, got.TokenIDs, want)
		}
		wantFinish := FinishLength
		if want[len(want)-1] == fakeEOS {
			wantFinish = FinishStop
		}
		if got.FinishReason != wantFinish {
			t.Fatalf("request %s: finish %q, want %q", r.ID, got.FinishReason, wantFinish)
		}
		u := res[i].usage
		if u == nil || u.PromptTokens != len(r.Prompt) || u.CompletionTokens != len(want) {
			t.Fatalf("request %s: usage %+v, want %d prompt and %d completion tokens", r.ID, u, len(r.Prompt), len(want))
		}
	}
}

// fedTokens is what the model must have been fed for greedy single-sequence requests
// without preemption: every prompt token not served by the prefix cache, and every
// generated token but the last (which ends the sequence without being fed back).
func fedTokens(res []result) int {
	n := 0
	for _, r := range res {
		n += r.usage.PromptTokens - r.usage.CachedTokens + r.usage.CompletionTokens - 1
	}
	return n
}

func TestConcurrentRequestsMatchReference(t *testing.T) {
	m := newFakeModel(1024)
	e := startEngine(t, testConfig(), m, nil)
	reqs := mixedRequests(64)
	res := runAll(t, e, reqs)
	checkGreedy(t, reqs, res)

	shutdown(t, e) // Stats are final once the loop has stopped
	calls, tokens := m.stats()
	st := e.Stats()
	if int64(calls) != st.Steps {
		t.Fatalf("%d forward calls for %d steps", calls, st.Steps)
	}
	totalGen := 0
	for _, r := range res {
		totalGen += r.usage.CompletionTokens
	}
	// Batching: far fewer passes than tokens.
	if calls >= totalGen/2 {
		t.Fatalf("%d forward calls for %d generated tokens: requests were not batched", calls, totalGen)
	}
	if want := fedTokens(res); tokens != want || st.FedTokens != int64(want) {
		t.Fatalf("model fed %d tokens (stats %d), want Σprompt + Σgenerated − requests − cached = %d", tokens, st.FedTokens, want)
	}
	if st.GenerationTokens != int64(totalGen) {
		t.Fatalf("stats count %d generated tokens, want %d", st.GenerationTokens, totalGen)
	}
}

func TestEachAloneMatchesBatch(t *testing.T) {
	reqs := mixedRequests(12)
	m := newFakeModel(1024)
	e := startEngine(t, testConfig(), m, nil)
	batch := runAll(t, e, reqs)
	cfg := testConfig()
	cfg.Policy = PolicySequential
	alone := startEngine(t, cfg, newFakeModel(1024), nil)
	for i, r := range reqs {
		ch, err := alone.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		got := collect(ch)
		if !slices.Equal(got.seqs[0].TokenIDs, batch[i].seqs[0].TokenIDs) {
			t.Fatalf("request %s: alone %v, in a batch %v", r.ID, got.seqs[0].TokenIDs, batch[i].seqs[0].TokenIDs)
		}
	}
}

func TestPoliciesAgree(t *testing.T) {
	for _, pol := range []Policy{PolicyStatic, PolicySequential} {
		t.Run(pol.String(), func(t *testing.T) {
			cfg := testConfig()
			cfg.Policy = pol
			cfg.MaxBatchSize = 4
			cfg.MaxBatchDelay = time.Millisecond
			e := startEngine(t, cfg, newFakeModel(1024), nil)
			reqs := mixedRequests(10)
			checkGreedy(t, reqs, runAll(t, e, reqs))
		})
	}
}

func TestPreemptionKeepsOutputs(t *testing.T) {
	cfg := testConfig()
	cfg.KVCacheBytes = blockBytesFake(16) * 24 // 384 tokens for 16 requests of ~110 tokens
	cfg.EnablePrefixCaching = false
	m := newFakeModel(1024)
	e := startEngine(t, cfg, m, nil)
	reqs := make([]*Request, 16)
	for i := range reqs {
		p := greedyRequest(fmt.Sprintf("p%d", i), testPrompt(100+i, 50+i), 60)
		p.Params.IgnoreEOS = true
		reqs[i] = p
	}
	res := runAll(t, e, reqs)
	for i, r := range reqs {
		want := fakeGreedyIgnoreEOS(r.Prompt, 60)
		if got := res[i].seqs[0].TokenIDs; !slices.Equal(got, want) {
			t.Fatalf("request %s: %v, want %v", r.ID, got, want)
		}
	}
	shutdown(t, e)
	st := e.Stats()
	if st.Preemptions == 0 {
		t.Fatalf("no preemption with %d blocks for 16 requests of ~110 tokens", st.KVTotalBlocks)
	}
	// Recomputation feeds more than the minimum.
	if _, tokens := m.stats(); tokens <= fedTokens(res) {
		t.Fatalf("fed %d tokens with %d preemptions, want more than %d", tokens, st.Preemptions, fedTokens(res))
	}
}

func fakeGreedyIgnoreEOS(prompt []int32, n int) []int32 {
	seq := append([]int32(nil), prompt...)
	for range n {
		seq = append(seq, fakeNext(seq))
	}
	return seq[len(prompt):]
}

func TestPrefixCaching(t *testing.T) {
	prefix := testPrompt(7, 200)
	a := append(slices.Clone(prefix), testPrompt(8, 10)...)
	b := append(slices.Clone(prefix), testPrompt(9, 13)...)

	run := func(caching bool) (resA, resB result, fedB int) {
		cfg := testConfig()
		cfg.EnablePrefixCaching = caching
		m := newFakeModel(1024)
		e := startEngine(t, cfg, m, nil)
		resA = runAll(t, e, []*Request{greedyRequest("a", a, 8)})[0]
		_, before := m.stats()
		resB = runAll(t, e, []*Request{greedyRequest("b", b, 8)})[0]
		_, after := m.stats()
		return resA, resB, after - before
	}
	_, cachedB, fedCached := run(true)
	_, plainB, fedPlain := run(false)

	if want := 192; cachedB.usage.CachedTokens != want { // 12 full 16-token blocks of the 200-token prefix
		t.Fatalf("cached tokens %d, want %d", cachedB.usage.CachedTokens, want)
	}
	n := len(cachedB.seqs[0].TokenIDs)
	if want := len(b) - 192 + n - 1; fedCached != want {
		t.Fatalf("second request fed %d tokens with caching, want %d", fedCached, want)
	}
	if want := len(b) + n - 1; fedPlain != want || plainB.usage.CachedTokens != 0 {
		t.Fatalf("second request fed %d tokens (cached %d) without caching, want %d", fedPlain, plainB.usage.CachedTokens, want)
	}
	if !slices.Equal(cachedB.seqs[0].TokenIDs, plainB.seqs[0].TokenIDs) ||
		!slices.Equal(cachedB.seqs[0].TokenIDs, fakeGreedy(b, 8)) {
		t.Fatalf("outputs differ: cached %v, plain %v", cachedB.seqs[0].TokenIDs, plainB.seqs[0].TokenIDs)
	}
}
