package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models"
)

// closingModel is a fakeModel that counts Close calls (the engine closes a runner it
// replaces).
type closingModel struct {
	*fakeModel
	closed atomic.Int32
}

func (m *closingModel) Close() error { m.closed.Add(1); return nil }

// failWhile makes m's forward passes fail while *on is set.
func failWhile(m *fakeModel, on *atomic.Bool) {
	m.failCall = func(int, *models.Batch) error {
		if on.Load() {
			return errors.New("injected: the runner failed")
		}
		return nil
	}
}

// TestFailedStepFailsOnlyItsRequests fails one forward pass that holds two running
// requests while a third waits (MaxNumSeqs 2): both get an ErrModel error event, their
// blocks are freed, the next step runs the waiting one to its normal end, and the engine
// stays healthy (one failure is not MaxStepFailures in a row).
func TestFailedStepFailsOnlyItsRequests(t *testing.T) {
	m := newFakeModel(1024)
	var failed atomic.Bool
	m.failCall = func(call int, b *models.Batch) error {
		// The first pass where both running requests decode.
		if len(b.Seqs) == 2 && len(b.Seqs[0].Tokens) == 1 && len(b.Seqs[1].Tokens) == 1 && !failed.Load() {
			failed.Store(true)
			return errors.New("injected: the runner failed")
		}
		return nil
	}
	cfg := testConfig()
	cfg.MaxNumSeqs = 2
	e, err := newEngine(cfg, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	// All three are queued before the loop starts: f0 and f1 run, f2 waits for room.
	var chans []<-chan Event
	for i := range 3 {
		r := greedyRequest(fmt.Sprintf("f%d", i), testPrompt(i, 10), 20)
		r.Params.IgnoreEOS = true
		ch, err := e.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	e.Start(context.Background())
	defer shutdown(t, e)
	for i := range 2 {
		ev := collect(chans[i]).seqs[0]
		if ev == nil || ev.FinishReason != FinishError || !errors.Is(ev.Err, ErrModel) || !strings.Contains(ev.Err.Error(), "injected") {
			t.Fatalf("request f%d in the failed step: %+v, want an ErrModel error event", i, ev)
		}
	}
	last := collect(chans[2]).seqs[0]
	if want := fakeGreedyIgnoreEOS(testPrompt(2, 10), 20); last == nil || last.Err != nil || !slices.Equal(last.TokenIDs, want) {
		t.Fatalf("the waiting request after the failed step: %+v, want %v", last, want)
	}
	waitFor(t, func() bool { st := e.Stats(); return st.KVFreeBlocks == st.KVTotalBlocks && st.Running == 0 })
	if st := e.Stats(); st.Unhealthy != "" || st.FailedSteps != 1 || st.RunnerRestarts != 0 {
		t.Fatalf("after one failed step: unhealthy %q, %d failed steps, %d restarts", st.Unhealthy, st.FailedSteps, st.RunnerRestarts)
	}
}

// runOne submits r and returns its merged sequence 0.
func runOne(t *testing.T, e *Engine, r *Request) *Event {
	t.Helper()
	ch, err := e.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return collect(ch).seqs[0]
}

// TestFailedStepsRestartRunner fails MaxStepFailures passes in a row: until then the
// engine stays healthy; then it is unhealthy with the reason for as long as ReopenModel
// runs, serves on with the reopened runner, closes the old one, and is healthy again.
// A successful pass in between starts the count again.
func TestFailedStepsRestartRunner(t *testing.T) {
	old := &closingModel{fakeModel: newFakeModel(1024)}
	var failing atomic.Bool
	failing.Store(true)
	failWhile(old.fakeModel, &failing)
	fresh := &closingModel{fakeModel: newFakeModel(1024)}
	reopening, release := make(chan struct{}), make(chan struct{})
	var reopens atomic.Int32
	cfg := testConfig()
	cfg.MaxStepFailures = 3
	cfg.ReopenModel = func() (Model, error) {
		reopens.Add(1)
		close(reopening)
		<-release
		return fresh, nil
	}
	e := startEngine(t, cfg, old, nil)
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the engine's shutdown, should the test fail first

	fail := func(id string) {
		t.Helper()
		if ev := runOne(t, e, greedyRequest(id, testPrompt(len(id), 8), 5)); ev.FinishReason != FinishError || !errors.Is(ev.Err, ErrModel) {
			t.Fatalf("%s: %+v, want an ErrModel failure", id, ev)
		}
	}
	// Two failures, a success, two failures: never three in a row.
	fail("a")
	fail("b")
	failing.Store(false)
	if ev := runOne(t, e, greedyRequest("ok", testPrompt(1, 8), 5)); ev.Err != nil {
		t.Fatalf("a pass that succeeds: %v", ev.Err)
	}
	failing.Store(true)
	fail("c")
	fail("d")
	if st := e.Stats(); st.Unhealthy != "" || reopens.Load() != 0 {
		t.Fatalf("after 2 failures in a row: unhealthy %q, %d reopens", st.Unhealthy, reopens.Load())
	}

	// The third in a row: unhealthy, with the reason, while the runner reopens.
	ch, err := e.Submit(context.Background(), greedyRequest("e", testPrompt(5, 8), 5))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-reopening:
	case <-time.After(time.Minute):
		t.Fatal("the runner was not reopened after 3 failed passes in a row")
	}
	if ev := collect(ch).seqs[0]; ev.FinishReason != FinishError || !errors.Is(ev.Err, ErrModel) {
		t.Fatalf("the third failure: %+v", ev)
	}
	waitFor(t, func() bool { return e.Stats().Unhealthy != "" })
	why := e.Stats().Unhealthy
	if !strings.Contains(why, "3 forward passes in a row failed") || !strings.Contains(why, "injected: the runner failed") || !strings.Contains(why, "restarting") {
		t.Fatalf("unhealthy reason %q", why)
	}
	// Requests submitted meanwhile wait for the fresh runner.
	waiting := greedyRequest("after", testPrompt(9, 12), 10)
	ch, err = e.Submit(context.Background(), waiting)
	if err != nil {
		t.Fatal(err)
	}
	unblock()
	checkGreedy(t, []*Request{waiting}, []result{collect(ch)})
	st := e.Stats()
	if st.Unhealthy != "" || st.RunnerRestarts != 1 || st.FailedSteps != 5 || reopens.Load() != 1 {
		t.Fatalf("after the restart: unhealthy %q, %d restarts, %d failed steps, %d reopens", st.Unhealthy, st.RunnerRestarts, st.FailedSteps, reopens.Load())
	}
	if old.closed.Load() != 1 || fresh.closed.Load() != 0 {
		t.Fatalf("closed: old %d times, fresh %d times", old.closed.Load(), fresh.closed.Load())
	}
	if c, _ := fresh.stats(); c == 0 {
		t.Fatal("the fresh runner ran no pass")
	}
	shutdown(t, e)
	if fresh.closed.Load() != 1 {
		t.Fatalf("the reopened runner was closed %d times when the engine stopped, want 1", fresh.closed.Load())
	}
}

// TestUnhealthyWithoutRestart covers the two ways a restart does not happen: no
// ReopenModel, and a ReopenModel that fails (tried again after the next failed pass). The
// engine is unhealthy until a pass succeeds.
func TestUnhealthyWithoutRestart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reopen func() (Model, error)
		want   string
	}{
		{"no ReopenModel", nil, "3 forward passes in a row failed, the last with: engine: model failure: injected"},
		{"ReopenModel fails", func() (Model, error) { return nil, errors.New("no memory for a session") }, "restarting the runner failed: no memory for a session"},
		{"ReopenModel returns another shape", func() (Model, error) { return newFakeModel(64), nil }, "restarting the runner failed: the reopened model's spec"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(1024)
			var failing atomic.Bool
			failing.Store(true)
			failWhile(m, &failing)
			cfg := testConfig()
			cfg.MaxStepFailures = 2
			cfg.ReopenModel = tc.reopen
			e := startEngine(t, cfg, m, nil)
			for i := range 3 {
				if ev := runOne(t, e, greedyRequest(fmt.Sprint(i), testPrompt(i, 8), 4)); !errors.Is(ev.Err, ErrModel) {
					t.Fatalf("request %d: %+v", i, ev)
				}
			}
			// The stats are published after the events: wait for the third failure's.
			waitFor(t, func() bool { return strings.Contains(e.Stats().Unhealthy, tc.want) })
			failing.Store(false)
			r := greedyRequest("ok", testPrompt(3, 8), 4)
			ch, err := e.Submit(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			checkGreedy(t, []*Request{r}, []result{collect(ch)})
			waitFor(t, func() bool { return e.Stats().Steps > 3 }) // its pass's stats are published
			if st := e.Stats(); st.Unhealthy != "" || st.RunnerRestarts != 0 {
				t.Fatalf("after a pass succeeded: unhealthy %q, %d restarts", st.Unhealthy, st.RunnerRestarts)
			}
		})
	}
}

// TestSamplingPanicEndsOnlyItsRequest makes one request's sampling panic on its third
// token: that request ends with an ErrInternal error event (its channel closed, its
// blocks freed), every other request in the same steps finishes as if nothing happened,
// and the engine keeps serving. TestMain's goleak check covers leaked goroutines.
func TestSamplingPanicEndsOnlyItsRequest(t *testing.T) {
	cfg := testConfig()
	e, err := newEngine(cfg, newFakeModel(1024), fakeText{})
	if err != nil {
		t.Fatal(err)
	}
	var victimTokens int // engine goroutine only
	e.faults = &faultHooks{beforeSample: func(id string) {
		if id == "victim" {
			if victimTokens++; victimTokens == 3 {
				panic("injected: the sampler broke")
			}
		}
	}}
	e.Start(context.Background())
	defer shutdown(t, e)

	reqs := mixedRequests(6)
	for _, r := range reqs {
		r.Params.MaxTokens = 12
		r.Params.IgnoreEOS = true
	}
	victim := greedyRequest("victim", testPrompt(99, 30), 12)
	victim.Params.IgnoreEOS = true
	victim.Params.N = 2 // both sequences end with the request
	victim.Params.Temperature = 1
	all := append([]*Request{victim}, reqs...)
	res := runAll(t, e, all)
	if len(res[0].seqs) != 2 {
		t.Fatalf("victim: %d sequences reported", len(res[0].seqs))
	}
	for i, ev := range res[0].seqs {
		if ev.FinishReason != FinishError || !errors.Is(ev.Err, ErrInternal) || !strings.Contains(ev.Err.Error(), "injected: the sampler broke") {
			t.Fatalf("victim sequence %d: %+v, want an ErrInternal error", i, ev)
		}
	}
	if res[0].usage == nil {
		t.Fatal("victim: no usage on its last event")
	}
	for i, r := range reqs {
		ev := res[i+1].seqs[0]
		if want := fakeGreedyIgnoreEOS(r.Prompt, 12); ev.Err != nil || !slices.Equal(ev.TokenIDs, want) {
			t.Fatalf("request %s next to the panic: %+v, want %v", r.ID, ev, want)
		}
	}
	more := mixedRequests(3)
	checkGreedy(t, more, runAll(t, e, more))
	waitFor(t, func() bool { st := e.Stats(); return st.KVFreeBlocks == st.KVTotalBlocks })
	if st := e.Stats(); st.RecoveredPanics != 1 || st.Unhealthy != "" || st.SchedulerErrors != 0 {
		t.Fatalf("stats after the panic: %d panics, unhealthy %q, %d scheduler errors", st.RecoveredPanics, st.Unhealthy, st.SchedulerErrors)
	}
}

// TestSlowStepStallsThenFrees delays one forward pass by 1.5 s while two requests run
// and cancels one of them during it: the other's stream stalls (no event during the
// pass) and then finishes normally, with nothing timed out; the cancelled one ends with
// FinishAbort once that pass is over, and its blocks are free then.
func TestSlowStepStallsThenFrees(t *testing.T) {
	const delay = 1500 * time.Millisecond
	m := newFakeModel(1024)
	slowStarted := make(chan struct{})
	var slowEnded atomic.Int64 // UnixNano
	var slowOnce sync.Once
	var armed atomic.Bool
	m.failCall = func(call int, b *models.Batch) error {
		if armed.Load() {
			slowOnce.Do(func() {
				close(slowStarted)
				time.Sleep(delay)
				slowEnded.Store(time.Now().UnixNano())
			})
		}
		return nil
	}
	e := startEngine(t, testConfig(), m, nil)
	const keepTokens = 400 // long enough to be running when the slow pass comes, however loaded the machine
	keep := greedyRequest("keep", testPrompt(1, 20), keepTokens)
	keep.Params.IgnoreEOS = true
	keepCh, err := e.Submit(context.Background(), keep)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gone := greedyRequest("gone", testPrompt(2, 20), 1000)
	gone.Params.IgnoreEOS = true
	goneCh, err := e.Submit(cctx, gone)
	if err != nil {
		t.Fatal(err)
	}
	// Both are decoding: read a first token of each, then slow the next pass.
	var keepEvents []Event
	keepEvents = append(keepEvents, <-keepCh)
	<-goneCh
	armed.Store(true)
	<-slowStarted
	cancel()
	// What the engine sent before the slow pass began is already buffered.
	for buffered := true; buffered; {
		select {
		case ev, ok := <-keepCh:
			if !ok {
				t.Fatal("keep finished before the slow pass began")
			}
			keepEvents = append(keepEvents, ev)
		default:
			buffered = false
		}
	}
	stallUntil := time.Now().Add(delay / 2)
	for _, ev := range drainUntil(keepCh, stallUntil) {
		t.Errorf("an event arrived during the slow pass: %+v", ev)
	}
	var last Event
	for ev := range goneCh {
		last = ev
	}
	closed := time.Now()
	if last.FinishReason != FinishAbort {
		t.Fatalf("the cancelled request ended with %+v, want an abort", last)
	}
	if ended := time.Unix(0, slowEnded.Load()); slowEnded.Load() == 0 || closed.Before(ended) {
		t.Fatalf("the cancelled request was closed at %v, before the slow pass ended (%v)", closed, ended)
	}
	// The cancelled request's blocks are free once that pass is over: only keep holds any.
	waitFor(t, func() bool { st := e.Stats(); return st.Running <= 1 && st.Waiting == 0 })
	for ev := range keepCh {
		keepEvents = append(keepEvents, ev)
	}
	var got Event
	for _, ev := range keepEvents {
		mergeEvent(&got, ev)
	}
	if want := fakeGreedyIgnoreEOS(keep.Prompt, keepTokens); got.Err != nil || got.FinishReason != FinishLength || !slices.Equal(got.TokenIDs, want) {
		t.Fatalf("the request that stalled: %+v, want %v", got, want)
	}
	waitFor(t, func() bool { st := e.Stats(); return st.KVFreeBlocks == st.KVTotalBlocks })
}

// drainUntil returns the events that arrive on ch before deadline.
func drainUntil(ch <-chan Event, deadline time.Time) []Event {
	var out []Event
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, ev)
		case <-t.C:
			return out
		}
	}
}

// deviceModel keeps its KV cache on its "device", as a GPU step runner does: memory of its
// own, which a fresh instance starts without. It records which slots it wrote (and
// copied), fails a pass that reads a slot it never wrote, and counts block copies.
type deviceModel struct {
	spec    models.Spec
	mu      sync.Mutex
	written map[[2]int]bool // (block, offset) written by this instance
	copies  atomic.Int32
	fail    *atomic.Bool
	closed  atomic.Int32
}

func newDeviceModel(fail *atomic.Bool) *deviceModel {
	m := &deviceModel{spec: newFakeModel(1024).spec, written: map[[2]int]bool{}, fail: fail}
	m.spec.KVOnDevice = true
	return m
}

func (m *deviceModel) Spec() models.Spec { return m.spec }
func (m *deviceModel) Close() error      { m.closed.Add(1); return nil }

func (m *deviceModel) Forward(b *models.Batch) (*models.Output, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail.Load() {
		return nil, errors.New("injected: the runner failed")
	}
	bs := b.Cache.Config().BlockSizeTokens
	out := &models.Output{Logits: make([][]float32, len(b.Seqs))}
	for r, s := range b.Seqs {
		for p := range s.PastLen {
			if !m.written[[2]int{int(s.Blocks[p/bs]), p % bs}] {
				return nil, fmt.Errorf("device: row %d reads position %d from block %d, which this runner never wrote", r, p, s.Blocks[p/bs])
			}
		}
		for j := range s.Tokens {
			p := s.PastLen + j
			m.written[[2]int{int(s.Blocks[p/bs]), p % bs}] = true
		}
		out.Logits[r] = make([]float32, fakeVocab)
		out.Logits[r][1+r%3] = 4 // never the fake's EOS (0)
	}
	return out, nil
}

func (m *deviceModel) CopyBlocks(ops []kvcache.CopyOp) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.copies.Add(1)
	for _, op := range ops {
		for off := range 4096 {
			if m.written[[2]int{int(op.Src), off}] {
				m.written[[2]int{int(op.Dst), off}] = true
			}
		}
	}
	return nil
}

// TestRestartOnDeviceRecomputes: a runner whose KV cache lives on its device is replaced
// after MaxStepFailures failed passes; the fresh runner's memory holds none of the old
// blocks. A prompt whose blocks the prefix cache held before the restart is computed
// anew (no cached tokens, no read of a block the fresh runner never wrote), and a forked
// request's block copies go to the fresh runner, not the closed one. Without the flush
// the second request fails reading the old runner's blocks.
func TestRestartOnDeviceRecomputes(t *testing.T) {
	var failing atomic.Bool
	old, fresh := newDeviceModel(&failing), newDeviceModel(&atomic.Bool{})
	cfg := testConfig()
	cfg.MaxStepFailures = 2
	cfg.ReopenModel = func() (Model, error) { return fresh, nil }
	e := startEngine(t, cfg, old, nil)
	prompt := testPrompt(3, 40) // two full 16-token blocks to cache
	if ev := runOne(t, e, greedyRequest("first", prompt, 4)); ev.Err != nil {
		t.Fatalf("before the restart: %v", ev.Err)
	}
	again := greedyRequest("cached", prompt, 4)
	ch, err := e.Submit(context.Background(), again)
	if err != nil {
		t.Fatal(err)
	}
	if res := collect(ch); res.usage == nil || res.usage.CachedTokens != 32 {
		t.Fatalf("before the restart the prompt's blocks are cached: usage %+v", res.usage)
	}
	failing.Store(true)
	for _, id := range []string{"x", "y"} {
		if ev := runOne(t, e, greedyRequest(id, testPrompt(9, 5), 3)); !errors.Is(ev.Err, ErrModel) {
			t.Fatalf("%s: %+v, want a failed pass", id, ev)
		}
	}
	waitFor(t, func() bool { return e.Stats().RunnerRestarts == 1 })
	copiesBefore := old.copies.Load()
	forked := greedyRequest("after", prompt, 4)
	forked.Params.N = 2
	ch, err = e.Submit(context.Background(), forked)
	if err != nil {
		t.Fatal(err)
	}
	res := collect(ch)
	for i, ev := range res.seqs {
		if ev.Err != nil {
			t.Fatalf("after the restart, choice %d: %v", i, ev.Err)
		}
	}
	if res.usage == nil || res.usage.CachedTokens != 0 {
		t.Fatalf("after the restart nothing may come from the old runner's memory: usage %+v", res.usage)
	}
	if old.copies.Load() != copiesBefore || fresh.copies.Load() == 0 {
		t.Fatalf("block copies: %d more on the closed runner, %d on the live one", old.copies.Load()-copiesBefore, fresh.copies.Load())
	}
	if old.closed.Load() != 1 {
		t.Fatalf("the old runner was closed %d times", old.closed.Load())
	}
	shutdown(t, e)
}
