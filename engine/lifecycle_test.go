package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/models"
)

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
	cfg.MaxNumSeqs = 3
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
		{"more sequences than a batch", bad(func(r *Request) { r.Params.N = 4 }), ErrInvalidRequest},
		{"negative temperature", bad(func(r *Request) { r.Params.Temperature = -1 }), ErrInvalidRequest},
		{"top_p above 1", bad(func(r *Request) { r.Params.TopP = 1.5 }), ErrInvalidRequest},
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

	// While the engine is not running, the first requests take the batch's three free
	// slots (n=2, then n=1) without waiting; the next two wait (MaxQueue 2); the sixth
	// overflows.
	if got := e.MaxPrompts(1); got != 5 {
		t.Fatalf("MaxPrompts(1) = %d, want 3 slots + 2 waiting", got)
	}
	var chans []<-chan Event
	var wants [][]int32
	for i := range 4 {
		req := greedyRequest(fmt.Sprintf("q%d", i), testPrompt(i, 60), 64)
		if i == 0 {
			req.Params.N = 2
		}
		ch, err := e.Submit(ctx, req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		chans = append(chans, ch)
		// max_tokens 64 is clipped to the 4 positions left in the 64-token context.
		wants = append(wants, fakeGreedy(testPrompt(i, 60), 4))
	}
	_, err = e.Submit(ctx, greedyRequest("q4", testPrompt(4, 5), 4))
	if !errors.Is(err, ErrOverloaded) || !strings.Contains(err.Error(), "2 requests waiting") {
		t.Fatalf("fifth request: %v, want ErrOverloaded with 2 requests waiting", err)
	}
	e.Start(ctx)
	for i, ch := range chans {
		res := collect(ch)
		for _, s := range res.seqs {
			if !slices.Equal(s.TokenIDs, wants[i]) {
				t.Fatalf("queued request %d: %v, want %v", i, s.TokenIDs, wants[i])
			}
		}
	}
	// Once they have all ended, a burst of MaxPrompts requests is accepted again.
	chans = chans[:0]
	for i := range e.MaxPrompts(1) {
		ch, err := e.Submit(ctx, greedyRequest(fmt.Sprintf("r%d", i), testPrompt(i, 5), 2))
		if err != nil {
			t.Fatalf("second burst, request %d: %v", i, err)
		}
		chans = append(chans, ch)
	}
	for _, ch := range chans {
		collect(ch)
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
	if res.events > 200 || len(ev.Logprobs) != 200 { // events merge once the buffer is full
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
	fed, sampled, pastSeen := 0, false, false
	for _, s := range infos {
		fed += s.NumTokens
		if parts := s.Schedule + s.Forward + s.Sample + s.Emit; s.Forward <= 0 || s.Schedule < 0 || s.Sample < 0 || s.Emit < 0 || parts > s.Duration {
			t.Fatalf("step phases %+v: want a positive forward and parts that fit in the step", s)
		}
		if s.MaxPast > s.PastTokens || s.PastTokens > s.NumSeqs*s.MaxPast {
			t.Fatalf("step %+v: past %d tokens with the longest row's %d", s, s.PastTokens, s.MaxPast)
		}
		sampled = sampled || s.Sample > 0
		pastSeen = pastSeen || s.MaxPast >= 200 // the slow request's last steps read its whole output
	}
	if !sampled || !pastSeen {
		t.Fatalf("no step timed its sampling (%v) or read a 200-token past (%v)", sampled, pastSeen)
	}
	if int64(fed) != st.FedTokens || len(st.RecentBatchSizes) == 0 || len(st.RecentStepDurations) != len(st.RecentBatchSizes) {
		t.Fatalf("stats %+v disagree with OnStep (%d tokens)", st, fed)
	}
	if st.KVTotalBlocks != 512 || st.KVFreeBlocks != 512 || st.BlockSizeTokens != 16 {
		t.Fatalf("KV stats %+v, want 512 free 16-token blocks", st)
	}
}

// TestSlowReaderEventsMerged checks the bounded event buffer: a reader that reads
// nothing until its request has finished still gets every token, text and logprob of
// every sequence, in order, in fewer events than a prompt reader, from a channel whose
// buffer does not grow with max_tokens × n.
func TestSlowReaderEventsMerged(t *testing.T) {
	e := startEngine(t, testConfig(), newFakeModel(1024), fakeText{})
	request := func(id string) *Request {
		seed := int64(7)
		p := DefaultSamplingParams()
		p.Temperature = 1
		p.Seed = &seed
		p.N = 3
		p.MaxTokens = 300
		p.IgnoreEOS = true
		p.Logprobs = 1
		return &Request{ID: id, Prompt: testPrompt(5, 20), Params: p}
	}
	eager, err := e.Submit(context.Background(), request("eager"))
	if err != nil {
		t.Fatal(err)
	}
	want := collect(eager)

	before := e.Stats().GenerationTokens
	slow, err := e.Submit(context.Background(), request("slow"))
	if err != nil {
		t.Fatal(err)
	}
	if c := cap(slow); c > eventBuffer+3+1 {
		t.Fatalf("event channel holds %d events for n=3, max_tokens=300", c)
	}
	deadline := time.Now().Add(time.Minute)
	for e.Stats().GenerationTokens < before+900 {
		if time.Now().After(deadline) {
			t.Fatal("the slow request did not finish")
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := collect(slow)
	if got.events >= want.events {
		t.Errorf("slow reader got %d events, prompt reader %d: nothing was merged", got.events, want.events)
	}
	for i := range 3 {
		g, w := got.seqs[i], want.seqs[i]
		if g == nil || w == nil {
			t.Fatalf("sequence %d missing", i)
		}
		if !slices.Equal(g.TokenIDs, w.TokenIDs) || g.Text != w.Text || len(g.Logprobs) != len(w.Logprobs) ||
			g.FinishReason != w.FinishReason || len(g.TokenIDs) != 300 {
			t.Errorf("sequence %d: slow reader got %d tokens (%q...), finish %q; prompt reader %d tokens, finish %q",
				i, len(g.TokenIDs), g.Text[:min(20, len(g.Text))], g.FinishReason, len(w.TokenIDs), w.FinishReason)
		}
	}
	if got.usage == nil || got.usage.CompletionTokens != 900 {
		t.Errorf("usage %+v, want 900 completion tokens", got.usage)
	}
	if d := e.Stats().DroppedEvents; d != 0 {
		t.Errorf("%d events dropped", d)
	}
}

// TestShutdownReleasesKVCache: the KV cache's memory goes back when the engine stops, run
// or never started, not when the garbage collector gets to it (it does not see the
// arenas, so engines made one after another would pile them up).
func TestShutdownReleasesKVCache(t *testing.T) {
	for _, start := range []bool{true, false} {
		e, err := newEngine(DefaultConfig(), newFakeModel(64), nil)
		if err != nil {
			t.Fatal(err)
		}
		if e.storage.LayerK(0) == nil {
			t.Fatal("no arena before shutdown")
		}
		if start {
			e.Start(context.Background())
		}
		shutdown(t, e)
		if e.storage.LayerK(0) != nil {
			t.Fatalf("started %v: the KV arenas are still mapped after Shutdown", start)
		}
	}
}

// TestContextCappedToKVCache: a KV cache that cannot hold one sequence of the model's
// context caps the served context to what it holds (so no reply is cut short of the
// context it was promised); an asked-for MaxModelLen beyond it is refused.
func TestContextCappedToKVCache(t *testing.T) {
	cfg := testConfig()
	cfg.KVCacheBytes = blockBytesFake(16) * 2 // 32 tokens
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := newEngine(cfg, newFakeModel(64), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.MaxModelLen(); got != 32 {
		t.Fatalf("MaxModelLen %d, want the 32 tokens the cache holds", got)
	}
	if _, err := e.Submit(context.Background(), greedyRequest("long", testPrompt(1, 40), 4)); !errors.Is(err, ErrPromptTooLong) {
		t.Fatalf("a 40-token prompt: %v, want ErrPromptTooLong", err)
	}
	cfg.MaxModelLen = 48
	if _, err := newEngine(cfg, newFakeModel(64), nil); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "holds 32 tokens of one sequence, fewer than MaxModelLen 48") {
		t.Fatalf("MaxModelLen 48: %v", err)
	}
}
