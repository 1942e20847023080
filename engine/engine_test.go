package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/models"

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

// shutdown stops e, waiting for the live requests.
func shutdown(t *testing.T, e *Engine) {
	t.Helper()
	if err := e.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds, failing the test if it never does (a broken engine
// must fail the test, not hang it).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within a minute")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCancelReturnsEveryBlock(t *testing.T) {
	cfg := testConfig()
	cfg.MaxQueue = 200
	e, err := newEngine(cfg, newFakeModel(1024), fakeText{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	e.Start(ctx)

	const n = 100
	cancels := make([]context.CancelFunc, n)
	chans := make([]<-chan Event, n)
	for i := range n {
		rctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		r := greedyRequest(fmt.Sprintf("c%d", i), testPrompt(i, 20+i), 500)
		r.Params.IgnoreEOS = true
		ch, err := e.Submit(rctx, r)
		if err != nil {
			t.Fatal(err)
		}
		chans[i] = ch
	}
	// Wait until some requests are generating, then cancel them all.
	waitFor(t, func() bool { return e.Stats().GenerationTokens > 50 })
	for _, c := range cancels {
		c()
	}
	for i, ch := range chans {
		res := collect(ch)
		ev := res.seqs[0]
		if ev == nil || ev.FinishReason != FinishAbort {
			t.Fatalf("request %d: last event %+v, want an abort", i, ev)
		}
		if res.usage == nil {
			t.Fatalf("request %d: no usage on the last event", i)
		}
	}
	waitFor(t, func() bool { st := e.Stats(); return st.Running == 0 && st.Waiting == 0 })
	if err := e.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The loop has stopped: the pool may be inspected from here.
	ps := e.pool.Stats()
	if ps.FreeBlocks != ps.TotalBlocks || ps.UsedBlocks != 0 {
		t.Fatalf("pool after cancelling everything: %+v", ps)
	}
	if err := e.pool.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if e.Stats().DroppedEvents != 0 {
		t.Fatal("events dropped")
	}
}

func TestForwardFailure(t *testing.T) {
	m := newFakeModel(1024)
	m.failCall = func(call int, _ *models.Batch) error {
		if call == 5 {
			return errors.New("boom")
		}
		return nil
	}
	e := startEngine(t, testConfig(), m, nil)
	reqs := mixedRequests(8)
	for _, r := range reqs {
		r.Params.MaxTokens = 20
		r.Params.IgnoreEOS = true
	}
	res := runAll(t, e, reqs)
	failed := 0
	for i, r := range reqs {
		ev := res[i].seqs[0]
		if ev.FinishReason == FinishError {
			if !errors.Is(ev.Err, ErrModel) || !strings.Contains(ev.Err.Error(), "boom") {
				t.Fatalf("request %s: error %v, want ErrModel wrapping the model's error", r.ID, ev.Err)
			}
			failed++
			continue
		}
		if want := fakeGreedyIgnoreEOS(r.Prompt, 20); !slices.Equal(ev.TokenIDs, want) {
			t.Fatalf("request %s: %v, want %v", r.ID, ev.TokenIDs, want)
		}
	}
	if failed == 0 {
		t.Fatal("no request failed with the failing forward pass")
	}
	// The engine keeps serving.
	more := mixedRequests(4)
	checkGreedy(t, more, runAll(t, e, more))
	waitFor(t, func() bool { st := e.Stats(); return st.KVFreeBlocks == st.KVTotalBlocks })
}

func TestSubmitValidation(t *testing.T) {
	cfg := testConfig()
	cfg.MaxQueue = 2
	e, err := newEngine(cfg, newFakeModel(64), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bad := func(mod func(r *Request)) *Request {
		r := greedyRequest("", testPrompt(1, 5), 4)
		mod(r)
		return r
	}
	tests := []struct {
		name string
		req  *Request
		want error
	}{
		{"prompt fills the context", bad(func(r *Request) { r.Prompt = testPrompt(1, 64) }), ErrPromptTooLong},
		{"empty prompt", bad(func(r *Request) { r.Prompt = nil }), ErrInvalidRequest},
		{"token outside the vocabulary", bad(func(r *Request) { r.Prompt[2] = fakeVocab }), ErrInvalidRequest},
		{"n 0", bad(func(r *Request) { r.Params.N = 0 }), ErrInvalidRequest},
		{"best_of below n", bad(func(r *Request) { r.Params.N = 3; r.Params.BestOf = 2 }), ErrInvalidRequest},
		{"more sequences than a batch", bad(func(r *Request) { r.Params.N = 33 }), ErrInvalidRequest},
		{"negative temperature", bad(func(r *Request) { r.Params.Temperature = -1 }), ErrInvalidRequest},
		{"top_p 0", bad(func(r *Request) { r.Params.TopP = 0 }), ErrInvalidRequest},
		{"max_tokens 0", bad(func(r *Request) { r.Params.MaxTokens = 0 }), ErrInvalidRequest},
		{"logit bias outside the vocabulary", bad(func(r *Request) { r.Params.LogitBias = map[int32]float32{-1: 1} }), ErrInvalidRequest},
		{"logprobs 21", bad(func(r *Request) { r.Params.Logprobs = 21 }), ErrInvalidRequest},
		{"NaN min_p", bad(func(r *Request) { r.Params.MinP = float32(math.NaN()) }), ErrInvalidRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := e.Submit(ctx, tc.req); !errors.Is(err, tc.want) {
				t.Fatalf("Submit: %v, want %v", err, tc.want)
			}
		})
	}

	// The queue holds two requests while the engine is not running; the third overflows.
	var chans []<-chan Event
	for i := range 2 {
		ch, err := e.Submit(ctx, greedyRequest(fmt.Sprintf("q%d", i), testPrompt(i, 60), 100))
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	if _, err := e.Submit(ctx, greedyRequest("q2", testPrompt(2, 5), 4)); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("third request: %v, want ErrOverloaded", err)
	}
	e.Start(ctx)
	for i, ch := range chans {
		res := collect(ch)
		// max_tokens 100 is clipped to the 4 positions left in the 64-token context.
		want := fakeGreedy(testPrompt(i, 60), 4)
		if got := res.seqs[0].TokenIDs; !slices.Equal(got, want) {
			t.Fatalf("queued request %d: %v, want %v", i, got, want)
		}
	}
	if err := e.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Submit(ctx, greedyRequest("late", testPrompt(3, 5), 4)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after shutdown: %v, want ErrClosed", err)
	}
}

func TestShutdownDrains(t *testing.T) {
	e, err := newEngine(testConfig(), newFakeModel(1024), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	reqs := mixedRequests(6)
	chans := make([]<-chan Event, len(reqs))
	for i, r := range reqs {
		if chans[i], err = e.Submit(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	res := make([]result, len(reqs))
	for i, ch := range chans {
		res[i] = collect(ch)
	}
	checkGreedy(t, reqs, res)
}

func TestShutdownDeadlineAborts(t *testing.T) {
	e, err := newEngine(testConfig(), newFakeModel(1024), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	r := greedyRequest("long", testPrompt(1, 10), 1000)
	r.Params.IgnoreEOS = true
	ch, err := e.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	<-ch // generating
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown: %v, want context.Canceled", err)
	}
	if res := collect(ch); res.seqs[0].FinishReason != FinishAbort {
		t.Fatalf("finish %q, want abort", res.seqs[0].FinishReason)
	}
}

func TestAbortByID(t *testing.T) {
	e := startEngine(t, testConfig(), newFakeModel(1024), nil)
	r := greedyRequest("x", testPrompt(1, 10), 1000)
	r.Params.IgnoreEOS = true
	ch, err := e.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	first := <-ch
	e.Abort("x")
	res := collect(ch)
	if res.seqs[0] == nil || res.seqs[0].FinishReason != FinishAbort {
		t.Fatalf("after Abort: %+v", res.seqs[0])
	}
	if n := len(first.TokenIDs) + len(res.seqs[0].TokenIDs); n >= 1000 {
		t.Fatalf("%d tokens generated despite the abort", n)
	}
	// The id is free again.
	ch, err = e.Submit(context.Background(), greedyRequest("x", testPrompt(2, 10), 3))
	if err != nil {
		t.Fatal(err)
	}
	collect(ch)
}

func TestSeedIndependentOfBatch(t *testing.T) {
	seeded := func(id string) *Request {
		p := DefaultSamplingParams()
		p.Temperature = 1
		p.MaxTokens = 30
		p.IgnoreEOS = true
		seed := int64(1234)
		p.Seed = &seed
		return &Request{ID: id, Prompt: testPrompt(5, 17), Params: p}
	}
	e := startEngine(t, testConfig(), newFakeModel(1024), nil)
	alone := runAll(t, e, []*Request{seeded("alone")})[0].seqs[0].TokenIDs

	reqs := []*Request{seeded("mixed")}
	for i := range 10 {
		r := greedyRequest(fmt.Sprintf("o%d", i), testPrompt(i, 3+i*5), 30)
		r.Params.Temperature = 1
		reqs = append(reqs, r)
	}
	mixed := runAll(t, e, reqs)[0].seqs[0].TokenIDs
	if !slices.Equal(alone, mixed) {
		t.Fatalf("seeded request alone %v, in a batch %v", alone, mixed)
	}
	if slices.Equal(alone, fakeGreedyIgnoreEOS(testPrompt(5, 17), 30)) {
		t.Fatal("temperature 1 sampled exactly the greedy tokens: the sampler ignores temperature")
	}
}

func TestParallelSequencesSharePrompt(t *testing.T) {
	cfg := testConfig()
	cfg.EnablePrefixCaching = false
	m := newFakeModel(1024)
	e := startEngine(t, cfg, m, nil)
	prompt := testPrompt(3, 70)
	r := greedyRequest("n3", prompt, 6)
	r.Params.N = 3
	r.Params.IgnoreEOS = true
	res := runAll(t, e, []*Request{r})[0]
	want := fakeGreedyIgnoreEOS(prompt, 6)
	for i := range 3 {
		if got := res.seqs[i]; got == nil || !slices.Equal(got.TokenIDs, want) {
			t.Fatalf("sequence %d: %+v, want %v", i, got, want)
		}
	}
	if res.usage.CompletionTokens != 18 {
		t.Fatalf("usage %+v, want 18 completion tokens", res.usage)
	}
	// The prompt is computed once, but its last token once per sequence.
	if _, fed := m.stats(); fed != len(prompt)+2+3*5 {
		t.Fatalf("fed %d tokens, want %d (prompt once + 2 forked last tokens + 3×5 decode)", fed, len(prompt)+2+3*5)
	}
}

// refLogprob is log_softmax(fakeLogits(prefix))[tok] computed independently.
func refLogprob(prefix []int32, tok int32) float64 {
	logits := make([]float32, fakeVocab)
	fakeLogits(prefix, logits)
	sum := 0.0
	for _, l := range logits {
		sum += math.Exp(float64(l))
	}
	return float64(logits[tok]) - math.Log(sum)
}

func TestBestOfReturnsHighestCumulativeLogprob(t *testing.T) {
	e := startEngine(t, testConfig(), newFakeModel(1024), nil)
	p := DefaultSamplingParams()
	p.N, p.BestOf, p.MaxTokens, p.Temperature, p.IgnoreEOS = 2, 5, 8, 2, true
	seed := int64(9)
	p.Seed = &seed
	prompt := testPrompt(4, 12)
	res := runAll(t, e, []*Request{{ID: "b", Prompt: prompt, Params: p}})[0]
	if len(res.seqs) != 2 || res.events != 2 {
		t.Fatalf("%d sequences in %d events, want 2 in 2", len(res.seqs), res.events)
	}
	if res.usage.CompletionTokens != 5*8 {
		t.Fatalf("usage %+v, want 40 completion tokens (all five sequences)", res.usage)
	}
	for i := range 2 {
		ev := res.seqs[i]
		seq := slices.Clone(prompt)
		cum := 0.0
		for _, tok := range ev.TokenIDs {
			cum += refLogprob(seq, tok)
			seq = append(seq, tok)
		}
		if math.Abs(cum-ev.CumulativeLogprob) > 1e-3 {
			t.Fatalf("sequence %d: cumulative logprob %v, reference %v", i, ev.CumulativeLogprob, cum)
		}
	}
	if res.seqs[0].CumulativeLogprob < res.seqs[1].CumulativeLogprob {
		t.Fatalf("best first: %v then %v", res.seqs[0].CumulativeLogprob, res.seqs[1].CumulativeLogprob)
	}
}

func TestLogprobs(t *testing.T) {
	e := startEngine(t, testConfig(), newFakeModel(1024), fakeText{})
	prompt := testPrompt(6, 40)
	r := greedyRequest("lp", prompt, 5)
	r.Params.IgnoreEOS = true
	r.Params.Logprobs = 3
	r.Params.PromptLogprobs = 2
	res := runAll(t, e, []*Request{r})[0]
	ev := res.seqs[0]
	if len(ev.PromptLogprobs) != len(prompt) || !math.IsNaN(float64(ev.PromptLogprobs[0].Logprob)) {
		t.Fatalf("prompt logprobs: %d entries (want %d), first %+v", len(ev.PromptLogprobs), len(prompt), ev.PromptLogprobs)
	}
	for i := 1; i < len(prompt); i++ {
		lp := ev.PromptLogprobs[i]
		if lp.ID != prompt[i] || math.Abs(float64(lp.Logprob)-refLogprob(prompt[:i], prompt[i])) > 1e-4 || len(lp.Top) != 2 {
			t.Fatalf("prompt logprob %d: %+v, want id %d logprob %v", i, lp, prompt[i], refLogprob(prompt[:i], prompt[i]))
		}
		if lp.Top[0].ID != fakeNext(prompt[:i]) || lp.Text != fakeTokenText(lp.ID) {
			t.Fatalf("prompt logprob %d: top %+v text %q", i, lp.Top, lp.Text)
		}
	}
	seq := slices.Clone(prompt)
	if len(ev.Logprobs) != 5 {
		t.Fatalf("%d logprobs for 5 tokens", len(ev.Logprobs))
	}
	for i, lp := range ev.Logprobs {
		want := refLogprob(seq, lp.ID)
		if lp.ID != ev.TokenIDs[i] || math.Abs(float64(lp.Logprob)-want) > 1e-4 || len(lp.Top) != 3 || lp.Top[0].ID != lp.ID {
			t.Fatalf("logprob %d: %+v, want %v", i, lp, want)
		}
		seq = append(seq, lp.ID)
	}
	if ev.Text != tokensText(ev.TokenIDs) {
		t.Fatalf("text %q, want %q", ev.Text, tokensText(ev.TokenIDs))
	}
}

func tokensText(ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(fakeTokenText(id))
	}
	return b.String()
}

func TestPromptLogprobsWithChunkedPrefill(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumBatchedTokens = 32 // the 100-token prompt takes 4 chunks
	e := startEngine(t, cfg, newFakeModel(1024), nil)
	prompt := testPrompt(11, 100)
	r := greedyRequest("chunks", prompt, 2)
	r.Params.PromptLogprobs = 0
	ev := runAll(t, e, []*Request{r})[0].seqs[0]
	if len(ev.PromptLogprobs) != len(prompt) {
		t.Fatalf("%d prompt logprobs, want %d", len(ev.PromptLogprobs), len(prompt))
	}
	for i := 1; i < len(prompt); i++ {
		if want := refLogprob(prompt[:i], prompt[i]); math.Abs(float64(ev.PromptLogprobs[i].Logprob)-want) > 1e-4 {
			t.Fatalf("prompt logprob %d: %v, want %v", i, ev.PromptLogprobs[i].Logprob, want)
		}
	}
	if !slices.Equal(ev.TokenIDs, fakeGreedy(prompt, 2)) {
		t.Fatalf("tokens %v, want %v", ev.TokenIDs, fakeGreedy(prompt, 2))
	}
}

func TestStopStringEndToEnd(t *testing.T) {
	e := startEngine(t, testConfig(), newFakeModel(1024), fakeText{})
	prompt := testPrompt(2, 9)
	full := fakeGreedyIgnoreEOS(prompt, 12)
	text := tokensText(full)
	// A stop string that starts inside token 4's text and ends inside token 5's.
	stop := text[len(tokensText(full[:4]))+1 : len(tokensText(full[:5]))+2]
	cut := strings.Index(text, stop)
	r := greedyRequest("s", prompt, 12)
	r.Params.IgnoreEOS = true
	r.Params.Stop = []string{stop}
	ch, err := e.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	var streamed strings.Builder
	var last Event
	for ev := range ch {
		streamed.WriteString(ev.Text)
		last = ev
	}
	if streamed.String() != text[:cut] || last.FinishReason != FinishStop {
		t.Fatalf("streamed %q (%s), want %q (stop)", streamed.String(), last.FinishReason, text[:cut])
	}
}

func TestSlowReaderDoesNotBlockOthers(t *testing.T) {
	var mu sync.Mutex
	var infos []StepInfo
	cfg := testConfig()
	cfg.OnStep = func(s StepInfo) {
		mu.Lock()
		infos = append(infos, s)
		mu.Unlock()
	}
	e := startEngine(t, cfg, newFakeModel(1024), fakeText{})
	slow := greedyRequest("slow", testPrompt(1, 30), 200)
	slow.Params.IgnoreEOS = true
	slow.Params.Logprobs = 2
	slowCh, err := e.Submit(context.Background(), slow)
	if err != nil {
		t.Fatal(err)
	}
	// Nobody reads slowCh while other requests run to completion.
	more := mixedRequests(8)
	checkGreedy(t, more, runAll(t, e, more))
	res := collect(slowCh)
	ev := res.seqs[0]
	if want := fakeGreedyIgnoreEOS(slow.Prompt, 200); !slices.Equal(ev.TokenIDs, want) || ev.FinishReason != FinishLength {
		t.Fatalf("slow reader got %d tokens (%s), want %d", len(ev.TokenIDs), ev.FinishReason, len(want))
	}
	if res.events != 200 || len(ev.Logprobs) != 200 {
		t.Fatalf("%d events with %d logprobs for 200 tokens", res.events, len(ev.Logprobs))
	}
	tm := ev.Timings
	if tm.Arrival.IsZero() || tm.Scheduled.Before(tm.Arrival) || tm.FirstToken.Before(tm.Scheduled) || tm.Finished.Before(tm.FirstToken) {
		t.Fatalf("timings out of order: %+v", tm)
	}
	shutdown(t, e)
	st := e.Stats()
	mu.Lock()
	defer mu.Unlock()
	if int64(len(infos)) != st.Steps || st.DroppedEvents != 0 {
		t.Fatalf("%d OnStep calls for %d steps, %d dropped events", len(infos), st.Steps, st.DroppedEvents)
	}
	fed := 0
	for _, s := range infos {
		fed += s.NumTokens
	}
	if int64(fed) != st.FedTokens || len(st.RecentBatchSizes) == 0 || len(st.RecentStepDurations) != len(st.RecentBatchSizes) {
		t.Fatalf("stats %+v disagree with OnStep (%d tokens)", st, fed)
	}
	if st.KVTotalBlocks != 512 || st.KVFreeBlocks != 512 || st.BlockSizeTokens != 16 {
		t.Fatalf("KV stats %+v, want 512 free 16-token blocks", st)
	}
}
