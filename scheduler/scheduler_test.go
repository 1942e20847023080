package scheduler

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
)

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	bad := map[string]func(*Config){
		"policy":           func(c *Config) { c.Policy = Policy(7) },
		"max seqs":         func(c *Config) { c.MaxNumSeqs = 0 },
		"budget below cap": func(c *Config) { c.MaxNumBatchedTokens = c.MaxNumSeqs - 1 },
		"model len":        func(c *Config) { c.MaxModelLen = 0 },
		"no chunking":      func(c *Config) { c.EnableChunkedPrefill = false; c.MaxModelLen = c.MaxNumBatchedTokens + 1 },
		"queue":            func(c *Config) { c.MaxQueue = 0 },
		"batch size":       func(c *Config) { c.Policy = Static; c.MaxBatchSize = 0 },
		"batch over cap":   func(c *Config) { c.Policy = Static; c.MaxBatchSize = c.MaxNumSeqs + 1 },
		"batch delay":      func(c *Config) { c.Policy = Static; c.MaxBatchDelay = -time.Second },
	}
	for name, mutate := range bad {
		cfg := DefaultConfig()
		mutate(&cfg)
		if err := cfg.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", name, err)
		}
	}
	pool, _ := kvcache.NewPool(kvcache.PoolConfig{NumBlocks: 4, BlockSizeTokens: 4})
	if _, err := New(DefaultConfig(), nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("New with nil pool: %v", err)
	}
	cfg := DefaultConfig()
	cfg.MaxQueue = -1
	if _, err := New(cfg, pool); !errors.Is(err, ErrInvalid) {
		t.Errorf("New with bad config: %v", err)
	}
}

func TestParsePolicy(t *testing.T) {
	for _, p := range []Policy{Continuous, Static, Sequential} {
		got, err := ParsePolicy(" " + p.String() + " ")
		if err != nil || got != p {
			t.Errorf("ParsePolicy(%q) = %v, %v", p.String(), got, err)
		}
	}
	if _, err := ParsePolicy("Eager"); !errors.Is(err, ErrInvalid) {
		t.Errorf("ParsePolicy(Eager): %v", err)
	}
}

func TestAddRejectsBadInput(t *testing.T) {
	cfg := testConfig()
	cfg.MaxModelLen = 16
	cfg.MaxQueue = 2
	h := newHarness(t, cfg, 3, 4, false) // 12 token slots
	tests := []struct {
		name  string
		group []*Sequence
		want  error
	}{
		{"empty group", nil, ErrInvalid},
		{"nil sequence", []*Sequence{nil}, ErrInvalid},
		{"empty prompt", []*Sequence{{ID: 1}}, ErrInvalid},
		{"longer than the model", []*Sequence{{ID: 1, Tokens: seqTokens(0, 17)}}, ErrTooLong},
		{"larger than the pool", []*Sequence{{ID: 1, Tokens: seqTokens(0, 13)}}, ErrTooLong},
		{"same id twice", []*Sequence{{ID: 1, Tokens: seqTokens(0, 2)}, {ID: 1, Tokens: seqTokens(0, 2)}}, ErrInvalid},
		{"different prompts", []*Sequence{{ID: 1, Tokens: seqTokens(0, 2)}, {ID: 2, Tokens: seqTokens(1, 2)}}, ErrInvalid},
		{"more than a batch", []*Sequence{
			{ID: 1, Tokens: seqTokens(0, 2)}, {ID: 2, Tokens: seqTokens(0, 2)}, {ID: 3, Tokens: seqTokens(0, 2)},
			{ID: 4, Tokens: seqTokens(0, 2)}, {ID: 5, Tokens: seqTokens(0, 2)},
		}, ErrInvalid},
	}
	for _, tc := range tests {
		if err := h.s.AddGroup(tc.group); !errors.Is(err, tc.want) {
			t.Errorf("%s: AddGroup = %v, want %v", tc.name, err, tc.want)
		}
	}
	if h.s.HasWork() {
		t.Fatal("a rejected request was queued")
	}
	if err := h.s.Add(&Sequence{ID: 1, Tokens: seqTokens(0, 12)}); err != nil {
		t.Fatalf("a prompt filling the pool exactly: %v", err)
	}
	if err := h.s.Add(&Sequence{ID: 1, Tokens: seqTokens(0, 2)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("live id reused: %v", err)
	}
}

func TestQueueFull(t *testing.T) {
	cfg := testConfig()
	cfg.MaxQueue = 2
	h := newHarness(t, cfg, 64, 4, false)
	h.mustAdd(req{name: "a", prompt: seqTokens(1, 2), maxNew: 3})
	h.mustAdd(req{name: "b", prompt: seqTokens(1, 2), maxNew: 3, n: 3}) // one request, three sequences
	if err := h.add(req{name: "c", prompt: seqTokens(1, 2), maxNew: 1}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third request: %v, want ErrQueueFull", err)
	}
	if st := h.s.Stats(); st.WaitingRequests != 2 || st.Waiting != 4 {
		t.Fatalf("stats %+v, want 2 requests, 4 sequences waiting", st)
	}
	h.step() // both admitted: the queue has room again
	h.mustAdd(req{name: "c", prompt: seqTokens(1, 2), maxNew: 1})
	h.run(20)
}

func TestMaxModelLen(t *testing.T) {
	cfg := testConfig()
	cfg.MaxModelLen = 6
	h := newHarness(t, cfg, 64, 4, false)
	h.mustAdd(req{name: "a", prompt: seqTokens(1, 4), maxNew: 100})
	h.mustAdd(req{name: "b", prompt: seqTokens(1, 6), maxNew: 100}) // a prompt as long as the context
	h.run(10)
	for name, want := range map[string]int{"a": 6, "b": 7} {
		q := h.done[name]
		if q.FinishReason() != FinishLength || len(q.Tokens) != want {
			t.Errorf("%s: %v with %d tokens, want length with %d", name, q.FinishReason(), len(q.Tokens), want)
		}
	}
}

func TestAbortFreesBlocks(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumSeqs = 2
	h := newHarness(t, cfg, 64, 4, true)
	h.mustAdd(req{name: "a", prompt: seqTokens(1, 9), maxNew: 50})
	h.mustAdd(req{name: "b", prompt: seqTokens(20, 5), maxNew: 50})
	h.mustAdd(req{name: "c", prompt: seqTokens(40, 5), maxNew: 50})
	h.step()
	h.step()
	if h.pool.Stats().UsedBlocks == 0 {
		t.Fatal("nothing allocated")
	}
	a, b, c := h.byName["a"], h.byName["b"], h.byName["c"]
	if c.Status() != StatusWaiting || a.Status() != StatusRunning {
		t.Fatalf("statuses a %v c %v", a.Status(), c.Status())
	}
	if !h.s.Abort(c.ID) || !h.s.Abort(a.ID) {
		t.Fatal("Abort of a live sequence returned false")
	}
	if h.s.Abort(a.ID) {
		t.Fatal("second Abort returned true")
	}
	if a.Status() != StatusFinished || a.FinishReason() != FinishAborted || c.FinishReason() != FinishAborted {
		t.Fatalf("a %v/%v c %v", a.Status(), a.FinishReason(), c.FinishReason())
	}
	if got := h.pool.NumTokens(a.ID); got != 0 {
		t.Fatalf("aborted a still holds %d tokens", got)
	}
	h.check()

	// Abort between Schedule and Update: Update skips the aborted item.
	plan := h.s.Schedule()
	if len(plan.Items) != 1 || plan.Items[0].Seq != b {
		t.Fatalf("plan %+v", plan.Items)
	}
	h.s.Abort(b.ID)
	done, err := h.s.Update(plan, []Result{{Token: 5, Finished: false}})
	if err != nil || len(done) != 0 {
		t.Fatalf("Update after abort: %v, %v", done, err)
	}
	if h.s.HasWork() {
		t.Fatal("work left")
	}
	if st := h.pool.Stats(); st.UsedBlocks != 0 || st.FreeBlocks != st.TotalBlocks {
		t.Fatalf("pool after aborting everything: %+v", st)
	}
	h.check()
}

func TestAbortGroup(t *testing.T) {
	h := newHarness(t, testConfig(), 64, 4, false)
	h.mustAdd(req{name: "a", prompt: seqTokens(1, 10), maxNew: 3, n: 3})
	h.step() // a computes 9 tokens; a1, a2 wait to fork
	if st := h.s.Stats(); st.Running != 3 || st.Waiting != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Aborting a waiting child, then the parent: the last child becomes an ordinary sequence.
	h.s.Abort(h.byName["a1"].ID)
	h.check()
	h.s.Abort(h.byName["a"].ID)
	h.check()
	if st := h.s.Stats(); st.Running != 0 || st.Waiting != 1 {
		t.Fatalf("stats %+v", st)
	}
	h.run(10)
	if got, want := h.output("a2"), reference(2, seqTokens(1, 10), 3); !slices.Equal(got, want) {
		t.Fatalf("a2 generated %v, want %v", got, want)
	}
}

func TestForkCopiesPartialBlock(t *testing.T) {
	h := newHarness(t, testConfig(), 32, 4, false)
	h.mustAdd(req{name: "a", prompt: seqTokens(1, 6), maxNew: 2, n: 3})
	h.step()
	plan := h.s.Schedule()
	// Positions 4..5 share block 1 (one token computed). Two of three sequences copy it; the
	// last writes in place.
	if len(plan.Items) != 3 || len(plan.Copies) != 2 {
		t.Fatalf("items %d copies %v", len(plan.Items), plan.Copies)
	}
	if h.s.Schedule() != plan {
		t.Fatal("Schedule before Update did not return the pending plan")
	}
	tables := map[kvcache.BlockID]int{}
	for _, it := range plan.Items {
		tb := h.pool.BlockTable(it.Seq.ID)
		tables[tb[0]]++
		tables[tb[1]]++
	}
	if len(tables) != 4 {
		t.Fatalf("want block 0 shared and three private second blocks, got %v", tables)
	}
	if _, err := h.s.Update(plan, make([]Result, 2)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("short results: %v", err)
	}
	if _, err := h.s.Update(plan, make([]Result, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.s.Update(plan, make([]Result, 3)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("second Update of one plan: %v", err)
	}
	if _, err := h.s.Update(&Plan{}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("foreign plan: %v", err)
	}
	for n, want := range map[string]int{"a": 0, "a1": 5, "a2": 5} {
		if got := h.byName[n].NumCachedPromptTokens(); got != want {
			t.Errorf("%s: %d cached prompt tokens, want %d", n, got, want)
		}
	}
}

func TestNextBatchTime(t *testing.T) {
	cfg := testConfig()
	cfg.Policy = Static
	cfg.MaxBatchSize = 2
	cfg.MaxBatchDelay = 30 * time.Millisecond
	h := newHarness(t, cfg, 64, 4, false)
	if _, ok := h.s.NextBatchTime(); ok {
		t.Fatal("deadline with an empty queue")
	}
	t0 := h.clock.Now()
	h.mustAdd(req{name: "a", prompt: seqTokens(1, 2), maxNew: 1})
	h.clock.Advance(5 * time.Millisecond)
	h.mustAdd(req{name: "b", prompt: seqTokens(1, 2), maxNew: 1, n: 2})
	// Three sequences wait, so a batch forms at once; b's two do not fit next to a.
	if got := h.step(); got != "a:0+2*; done a" {
		t.Fatalf("step: %q", got)
	}
	if _, ok := h.s.NextBatchTime(); ok {
		t.Fatal("a full batch (b's two sequences) is waiting: no deadline expected")
	}
	for h.s.Stats().Running > 0 || h.s.Stats().Waiting > 0 {
		h.step()
	}
	h.mustAdd(req{name: "c", prompt: seqTokens(1, 2), maxNew: 1})
	at, ok := h.s.NextBatchTime()
	if !ok || !at.Equal(t0.Add(35*time.Millisecond)) {
		t.Fatalf("NextBatchTime = %v, %v; want %v", at, ok, t0.Add(35*time.Millisecond))
	}
	h.clock.Set(at.Add(-time.Nanosecond))
	if got := h.step(); got != "-" {
		t.Fatalf("before the deadline: %q", got)
	}
	h.clock.Set(at)
	if got := h.step(); got != "c:0+2*; done c" {
		t.Fatalf("at the deadline: %q", got)
	}
}

func TestStats(t *testing.T) {
	h := newHarness(t, testConfig(), 4, 2, false)
	h.mustAdd(req{name: "a", prompt: seqTokens(1, 3), maxNew: 4})
	h.mustAdd(req{name: "b", prompt: seqTokens(5, 3), maxNew: 4})
	h.mustAdd(req{name: "c", prompt: seqTokens(9, 3), maxNew: 1})
	h.step()
	st := h.s.Stats()
	if st.Running != 2 || st.Waiting != 1 || st.LastStepSeqs != 2 || st.LastStepTokens != 6 || st.Steps != 1 {
		t.Fatalf("after one step: %+v", st)
	}
	h.run(50)
	st = h.s.Stats()
	if st.Preemptions < 1 || st.GeneratedTokens != 9 || st.Running != 0 || st.Waiting != 0 {
		t.Fatalf("at the end: %+v", st)
	}
	if st.ScheduledTokens != int64(h.fed) || st.Steps != int64(h.nsteps) {
		t.Fatalf("stats %+v, fed %d in %d steps", st, h.fed, h.nsteps)
	}
	if h.byName["b"].NumPreemptions() == 0 {
		t.Fatal("b was never preempted")
	}
}

// TestPreemptionMatchesUnconstrained runs the same load through a pool far too small for it
// and through one that holds everything: the small pool must preempt, every request must
// still complete, and each request must generate the same tokens in both runs.
func TestPreemptionMatchesUnconstrained(t *testing.T) {
	var reqs []req
	for i := range 12 {
		reqs = append(reqs, req{
			name:      string(rune('a' + i)),
			prompt:    append(seqTokens(1, 8), seqTokens(100*i, 3+i%5)...),
			maxNew:    6 + (i*7)%13,
			saltFirst: uint64(i),
			n:         1 + i%3/2,
		})
	}
	outputs := func(blocks int, prefix bool) (*harness, map[string][]int32) {
		cfg := testConfig()
		cfg.MaxNumSeqs = 8
		cfg.EnablePrefixCaching = prefix
		h := newHarness(t, cfg, blocks, 4, prefix)
		for _, r := range reqs {
			h.mustAdd(r)
		}
		h.run(1000)
		out := map[string][]int32{}
		for n := range h.done {
			out[n] = h.output(n)
		}
		return h, out
	}
	_, free := outputs(1000, false)
	for _, prefix := range []bool{false, true} {
		h, tight := outputs(9, prefix) // 36 token slots for 8 running sequences of up to 30 tokens
		if p := h.s.Stats().Preemptions; p == 0 {
			t.Fatalf("prefix caching %v: no preemption with a tiny pool", prefix)
		}
		if len(h.failed) != 0 || len(tight) != len(free) || len(free) != 16 {
			t.Fatalf("prefix caching %v: %d finished (%d failed), unconstrained %d", prefix, len(tight), len(h.failed), len(free))
		}
		for n, want := range free {
			if !slices.Equal(tight[n], want) {
				t.Errorf("prefix caching %v: %s generated %v with preemption, %v without", prefix, n, tight[n], want)
			}
		}
	}
}

// TestPrefixCachingComputesOnlyNewTokens: a second request sharing a 200-token prefix
// computes only its own tokens, and generates what it generates without caching.
func TestPrefixCachingComputesOnlyNewTokens(t *testing.T) {
	shared := seqTokens(1, 200)
	a := req{name: "a", prompt: append(append([]int32(nil), shared...), seqTokens(1000, 10)...), maxNew: 5}
	b := req{name: "b", prompt: append(append([]int32(nil), shared...), seqTokens(2000, 20)...), maxNew: 7, saltFirst: 1}
	run := func(prefix bool) (*harness, string) {
		cfg := testConfig()
		cfg.MaxNumBatchedTokens = 512
		cfg.MaxModelLen = 512
		cfg.EnablePrefixCaching = prefix
		h := newHarness(t, cfg, 64, 16, prefix)
		h.mustAdd(a)
		h.run(100)
		h.mustAdd(b)
		first := h.step()
		h.run(100)
		return h, first
	}
	hc, first := run(true)
	if first != "b:192+28*" { // 12 whole blocks of 16 served from the cache
		t.Fatalf("b's first step: %q", first)
	}
	if got := hc.byName["b"].NumCachedPromptTokens(); got != 192 {
		t.Fatalf("b: %d cached prompt tokens", got)
	}
	// Fed tokens: every known token but the last is computed once, less the cache hits.
	want := (210 + 5 - 1) + (220 + 7 - 1) - 192
	if hc.fed != want {
		t.Fatalf("fed %d tokens to the model, want %d", hc.fed, want)
	}
	h, _ := run(false)
	if !slices.Equal(hc.output("b"), h.output("b")) || h.fed != want+192 {
		t.Fatalf("with caching b generated %v, without %v (fed %d)", hc.output("b"), h.output("b"), h.fed)
	}
}

// TestPrefixQueryCountedOnceAtAdmission: a prompt that waits several steps for KV blocks is
// counted in the pool's prefix-cache query and hit counters once, when it is admitted, and
// not at all while it waits (the lookup has no side effects; admission takes the blocks).
func TestPrefixQueryCountedOnceAtAdmission(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumBatchedTokens = 32
	cfg.EnablePrefixCaching = true
	h := newHarness(t, cfg, 8, 4, true) // 8 blocks of 4 tokens
	shared := seqTokens(1, 8)           // two full blocks
	// b holds 5 blocks after its prompt and 6 while it decodes, and registers the shared blocks.
	h.mustAdd(req{name: "b", prompt: slices.Concat(shared, seqTokens(100, 9)), maxNew: 5})
	if got := h.step(); got != "b:0+17*" {
		t.Fatalf("first step %q", got)
	}
	// c hits the two shared blocks but needs 4 fresh ones: it waits until b is done.
	c := slices.Concat(shared, seqTokens(200, 16))
	h.mustAdd(req{name: "c", prompt: c, maxNew: 1, saltFirst: 1})
	before := h.pool.Stats()
	if before.PrefixQueriesTokens != 17 || before.PrefixHitsTokens != 0 {
		t.Fatalf("after b's admission: queries %d hits %d", before.PrefixQueriesTokens, before.PrefixHitsTokens)
	}
	waited := 0
	for h.byName["c"].Status() == StatusWaiting {
		h.step()
		st := h.pool.Stats()
		if h.byName["c"].Status() == StatusWaiting {
			waited++
			if st.PrefixQueriesTokens != before.PrefixQueriesTokens || st.PrefixHitsTokens != before.PrefixHitsTokens {
				t.Fatalf("waiting step %d counted c: queries %d -> %d, hits %d -> %d", waited,
					before.PrefixQueriesTokens, st.PrefixQueriesTokens, before.PrefixHitsTokens, st.PrefixHitsTokens)
			}
			continue
		}
		if q, hits := st.PrefixQueriesTokens-before.PrefixQueriesTokens, st.PrefixHitsTokens-before.PrefixHitsTokens; q != int64(len(c)) || hits != 8 {
			t.Fatalf("c's admission counted %d query and %d hit tokens, want %d and 8", q, hits, len(c))
		}
	}
	if waited < 3 {
		t.Fatalf("c waited %d steps, the test wants several", waited)
	}
	if got := h.byName["c"].NumCachedPromptTokens(); got != 8 {
		t.Fatalf("c: %d cached prompt tokens, want 8", got)
	}
	h.run(20)
	if st := h.pool.Stats(); st.PrefixQueriesTokens != 17+int64(len(c)) || st.PrefixHitsTokens != 8 {
		t.Fatalf("at the end: queries %d hits %d", st.PrefixQueriesTokens, st.PrefixHitsTokens)
	}
}

// TestCachedGroupSharesOneLookup: the sequences of an n > 1 request whose prompt is cached up
// to its last token are admitted together, share the cached blocks, and count one query.
func TestCachedGroupSharesOneLookup(t *testing.T) {
	cfg := testConfig()
	cfg.EnablePrefixCaching = true
	h := newHarness(t, cfg, 32, 4, true)
	prompt := seqTokens(1, 9)
	h.mustAdd(req{name: "a", prompt: prompt, maxNew: 1})
	h.run(10)
	before := h.pool.Stats()
	h.mustAdd(req{name: "b", prompt: prompt, maxNew: 2, n: 3, saltFirst: 5})
	if got := h.step(); got != "b:8+1* b1:8+1* b2:8+1*" {
		t.Fatalf("first step %q", got)
	}
	st := h.pool.Stats()
	if q, hits := st.PrefixQueriesTokens-before.PrefixQueriesTokens, st.PrefixHitsTokens-before.PrefixHitsTokens; q != 9 || hits != 8 {
		t.Fatalf("the group counted %d query and %d hit tokens, want 9 and 8", q, hits)
	}
	head := h.pool.BlockTable(h.byName["b"].ID)[:2]
	for _, n := range []string{"b1", "b2"} {
		if got := h.pool.BlockTable(h.byName[n].ID)[:2]; !slices.Equal(got, head) {
			t.Fatalf("%s's cached blocks %v, b's %v", n, got, head)
		}
	}
	h.run(10)
	for i, n := range []string{"b", "b1", "b2"} {
		if got, want := h.output(n), reference(5+uint64(i), prompt, 2); !slices.Equal(got, want) {
			t.Fatalf("%s generated %v, want %v", n, got, want)
		}
	}
}

// TestRecomputeAll: every running sequence is preempted to be recomputed from scratch
// (its blocks freed, the first running first in the queue), refused while a plan is
// pending; the next step computes each one's prompt and generated tokens again.
func TestRecomputeAll(t *testing.T) {
	cfg := testConfig()
	h := newHarness(t, cfg, 64, 4, false)
	h.mustAdd(req{name: "a", prompt: seqTokens(1, 9), maxNew: 50})
	h.mustAdd(req{name: "b", prompt: seqTokens(20, 5), maxNew: 50})
	h.step()
	h.step()
	a, b := h.byName["a"], h.byName["b"]
	plan := h.s.Schedule()
	if _, err := h.s.RecomputeAll(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("RecomputeAll with a pending plan: %v", err)
	}
	if _, err := h.s.Update(plan, []Result{{Token: 5}, {Token: 6}}); err != nil {
		t.Fatal(err)
	}
	n, err := h.s.RecomputeAll()
	if err != nil || n != 2 {
		t.Fatalf("RecomputeAll = %d, %v; want 2", n, err)
	}
	if a.Status() != StatusWaiting || b.Status() != StatusWaiting || h.pool.Stats().UsedBlocks != 0 {
		t.Fatalf("after: a %v, b %v, %+v", a.Status(), b.Status(), h.pool.Stats())
	}
	h.check()
	plan = h.s.Schedule()
	if len(plan.Items) != 2 || plan.Items[0].Seq != a || plan.Items[0].StartPos != 0 || plan.Items[0].NumNewTokens != len(a.Tokens) {
		t.Fatalf("the next step: %+v; want a's %d tokens first, from 0", plan.Items, len(a.Tokens))
	}
}
