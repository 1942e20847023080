package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/scheduler"
)

// specRequests are greedy and seeded sampled requests, some stopped by a string or by
// max_tokens, some with logprobs, one with n=2.
func specRequests() []*Request {
	var reqs []*Request
	for i := range 12 {
		p := DefaultSamplingParams()
		p.MaxTokens = 10 + 7*i
		if i%2 == 1 {
			seed := int64(100 + i)
			p.Seed, p.Temperature, p.TopP = &seed, 1, 0.9
		} else {
			p.Temperature = 0
		}
		if i%3 == 0 {
			p.Logprobs = 2
		}
		if i == 4 {
			p.Stop = []string{"<7>"}
		}
		if i == 5 {
			p.N = 2
		}
		prompt := testPrompt(i, 6+i%4)
		prompt = append(prompt, prompt...) // something to look up
		reqs = append(reqs, &Request{ID: fmt.Sprintf("r%d", i), Prompt: prompt, Params: p})
	}
	return reqs
}

// runSpec runs reqs at once on a fresh engine over m with speculation spec (and draft
// model draft, if not nil) and returns each request's sequences' token ids and logprobs,
// and the engine's stats.
func runSpec(t *testing.T, m Model, spec scheduler.Speculation, draft Model, tweak ...func(*Config)) (map[string][][]int32, map[string][][]float32, Stats) {
	t.Helper()
	cfg := testConfig()
	for _, f := range tweak {
		f(&cfg)
	}
	cfg.Speculation = spec
	cfg.DraftModel = draft
	// Every request is queued before the engine starts, so both runs see the same
	// arrivals and their step counts compare speculation alone.
	e, err := newEngine(cfg, m, fakeText{})
	if err != nil {
		t.Fatal(err)
	}
	ids, lps := map[string][][]int32{}, map[string][][]float32{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, r := range specRequests() {
		ch, err := e.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			res := collect(ch)
			mu.Lock()
			defer mu.Unlock()
			for i := range len(res.seqs) {
				ev := res.seqs[i]
				if ev.Err != nil {
					t.Errorf("%s: %v", r.ID, ev.Err)
					return
				}
				if len(ev.TokenIDs) > r.Params.MaxTokens {
					t.Errorf("%s: %d tokens, max_tokens %d", r.ID, len(ev.TokenIDs), r.Params.MaxTokens)
				}
				ids[r.ID] = append(ids[r.ID], ev.TokenIDs)
				var l []float32
				for _, lp := range ev.Logprobs {
					l = append(l, lp.Logprob)
				}
				lps[r.ID] = append(lps[r.ID], l)
			}
		})
	}
	e.Start(context.Background())
	wg.Wait()
	st := e.Stats()
	shutdown(t, e)
	if e.drafter != nil && e.drafter.failures != 0 {
		t.Fatalf("%d draft passes failed", e.drafter.failures)
	}
	if e.drafter != nil {
		if err := e.drafter.pool.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		// Every request done: the draft's cache is empty again.
		if ps := e.drafter.pool.Stats(); ps.UsedBlocks != 0 || len(e.drafter.seqs) != 0 {
			t.Fatalf("the draft's cache holds %d blocks of %d sequences after the last request", ps.UsedBlocks, len(e.drafter.seqs))
		}
	}
	return ids, lps, st
}

// TestSpeculationIsExact: with prompt-lookup speculation the engine returns the very
// tokens (and logprobs) it returns without — greedy rows and seeded sampled rows alike,
// with stop strings, max_tokens, logprobs and n=2 — on a model whose replies repeat
// (so proposals are accepted, at several depths) and on one whose do not (so they are
// rejected); and proposals are counted.
func TestSpeculationIsExact(t *testing.T) {
	on := scheduler.Speculation{NumTokens: 4, LookupMin: 1, LookupMax: 3}
	for _, context := range []int{1, 0} {
		t.Run(fmt.Sprintf("context %d", context), func(t *testing.T) {
			m := newFakeModel(1024)
			m.context = context
			wantIDs, wantLPs, off := runSpec(t, m, scheduler.Speculation{}, nil)
			gotIDs, gotLPs, st := runSpec(t, m, on, nil)
			sameOutputs(t, wantIDs, gotIDs, wantLPs, gotLPs)
			if off.SpecDraftTokens != 0 || st.SpecDraftTokens == 0 {
				t.Fatalf("proposals counted: %d without speculation, %d with", off.SpecDraftTokens, st.SpecDraftTokens)
			}
			t.Logf("%d proposed, %d accepted, by depth %v; %d steps with, %d without", st.SpecDraftTokens, st.SpecAcceptedTokens, st.SpecAcceptedAt, st.Steps, off.Steps)
			if context == 1 && (st.SpecAcceptedTokens == 0 || len(st.SpecAcceptedAt) < 4 || st.SpecAcceptedAt[3] == 0 || st.Steps >= off.Steps) {
				t.Fatalf("a repeating model: %d of %d accepted, by depth %v, %d steps against %d; want proposals accepted at every depth and fewer steps",
					st.SpecAcceptedTokens, st.SpecDraftTokens, st.SpecAcceptedAt, st.Steps, off.Steps)
			}
		})
	}
}

// sameOutputs fails unless every request's sequences (in any order) have the same
// tokens with speculation as without, and a one-sequence request the same logprobs.
func sameOutputs(t *testing.T, wantIDs, gotIDs map[string][][]int32, wantLPs, gotLPs map[string][][]float32) {
	t.Helper()
	for id, want := range wantIDs {
		got := gotIDs[id]
		slices.SortFunc(want, slices.Compare[[]int32])
		slices.SortFunc(got, slices.Compare[[]int32])
		if len(got) != len(want) {
			t.Fatalf("%s: %d sequences with speculation, %d without", id, len(got), len(want))
		}
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Fatalf("%s: tokens with speculation %v, without %v", id, got[i], want[i])
			}
		}
		if len(wantLPs[id]) == 1 && !slices.Equal(gotLPs[id][0], wantLPs[id][0]) {
			t.Fatalf("%s: logprobs with speculation %v, without %v", id, gotLPs[id][0], wantLPs[id][0])
		}
	}
}

// TestDraftModelIsExact: with a draft model proposing the tokens, greedy rows get the
// very tokens and logprobs they get without speculation (stop strings, max_tokens,
// logprobs and n=2 among them), and seeded sampled rows (whose proposals are drawn from
// the draft's distribution and verified by rejection sampling) the same tokens from run
// to run — with a draft that is the model itself (nearly every proposal accepted, half
// the steps; the cache kept in step over many steps: the fake model fails a pass whose
// cache holds a wrong past) and with a poor one (a different model: proposals rejected,
// the draft's cache cut back). An engine without a draft refuses an external
// speculation, as one with a draft refuses prompt lookup.
func TestDraftModelIsExact(t *testing.T) {
	on := scheduler.Speculation{NumTokens: 4, External: true}
	m := newFakeModel(1024)
	m.context = 1
	greedy := func(ids map[string][][]int32) map[string][][]int32 {
		out := map[string][][]int32{}
		for _, r := range specRequests() {
			if r.Params.Temperature == 0 {
				out[r.ID] = ids[r.ID]
			}
		}
		return out
	}
	wantIDs, wantLPs, off := runSpec(t, m, scheduler.Speculation{}, nil)
	var rates []float64
	for _, tc := range []struct {
		name    string
		context int
	}{{"itself", 1}, {"poor", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			draft := newFakeModel(1024)
			draft.context = tc.context
			gotIDs, gotLPs, st := runSpec(t, m, on, draft)
			sameOutputs(t, greedy(wantIDs), gotIDs, wantLPs, gotLPs)
			againIDs, againLPs, _ := runSpec(t, m, on, draft)
			sameOutputs(t, gotIDs, againIDs, gotLPs, againLPs)
			t.Logf("%d proposed, %d accepted, by depth %v; %d steps with, %d without", st.SpecDraftTokens, st.SpecAcceptedTokens, st.SpecAcceptedAt, st.Steps, off.Steps)
			rate := float64(st.SpecAcceptedTokens) / float64(max(st.SpecDraftTokens, 1))
			rates = append(rates, rate)
			switch {
			case st.SpecDraftTokens == 0:
				t.Fatal("nothing proposed")
			case tc.name == "itself" && (rate < 0.8 || 2*st.Steps >= off.Steps):
				t.Fatalf("the model as its own draft: %.2f accepted, %d steps against %d", rate, st.Steps, off.Steps)
			case tc.name == "poor" && rate >= rates[0]:
				t.Fatalf("a poor draft: %.2f accepted, as many as the model itself", rate)
			}
		})
	}
	t.Run("preempted", func(t *testing.T) {
		// A cache of 24 blocks: sequences are preempted (their draft caches dropped) and
		// recomputed, and the draft's own cache, as small, is at times full.
		draft := newFakeModel(1024)
		draft.context = 1
		tight := func(c *Config) { c.KVCacheBytes = blockBytesFake(16) * 24 }
		gotIDs, gotLPs, st := runSpec(t, m, on, draft, tight)
		sameOutputs(t, greedy(wantIDs), gotIDs, wantLPs, gotLPs)
		t.Logf("%d preemptions; %d proposed, %d accepted", st.Preemptions, st.SpecDraftTokens, st.SpecAcceptedTokens)
		if st.Preemptions == 0 || st.SpecAcceptedTokens == 0 {
			t.Fatalf("%d preemptions, %d proposals accepted; the test needs both", st.Preemptions, st.SpecAcceptedTokens)
		}
	})
	for _, tc := range []struct {
		spec  scheduler.Speculation
		draft Model
	}{{on, nil}, {scheduler.Speculation{NumTokens: 4, LookupMin: 1, LookupMax: 2}, newFakeModel(1024)}} {
		cfg := testConfig()
		cfg.Speculation, cfg.DraftModel = tc.spec, tc.draft
		if _, err := newEngine(cfg, m, fakeText{}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("speculation %+v with draft %v: %v, want ErrInvalidConfig", tc.spec, tc.draft != nil, err)
		}
	}
	small := newFakeModel(1024)
	small.spec.VocabSize = fakeVocab - 1
	cfg := testConfig()
	cfg.Speculation, cfg.DraftModel = on, small
	if _, err := newEngine(cfg, m, fakeText{}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "vocabulary") {
		t.Errorf("a draft with another vocabulary: %v, want ErrInvalidConfig naming it", err)
	}
	onGPU := newFakeModel(1024)
	onGPU.spec.KVOnDevice = true
	cfg.DraftModel = onGPU
	if _, err := newEngine(cfg, m, fakeText{}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "GPU") {
		t.Errorf("a draft on the GPU: %v, want ErrInvalidConfig naming it", err)
	}
}

// TestDraftModelFailures: a draft model whose passes fail now and then costs only the
// proposals of the steps it fails in: every request gets the tokens it gets without
// speculation, the failures are counted, and proposals made in the other steps are
// still accepted (the draft's caches started over cleanly).
func TestDraftModelFailures(t *testing.T) {
	m := newFakeModel(1024)
	m.context = 1
	wantIDs, wantLPs, _ := runSpec(t, m, scheduler.Speculation{}, nil)
	draft := newFakeModel(1024)
	draft.context = 1
	draft.failCall = func(call int, _ *models.Batch) error {
		if call%7 == 3 {
			return errors.New("injected draft failure")
		}
		return nil
	}
	cfg := testConfig()
	cfg.Speculation, cfg.DraftModel = scheduler.Speculation{NumTokens: 4, External: true}, draft
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := newEngine(cfg, m, fakeText{})
	if err != nil {
		t.Fatal(err)
	}
	gotIDs, gotLPs := map[string][][]int32{}, map[string][][]float32{}
	var chans []<-chan Event
	reqs := specRequests()
	for _, r := range reqs {
		ch, err := e.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	e.Start(context.Background())
	for i, ch := range chans {
		res := collect(ch)
		for _, ev := range res.seqs {
			if ev.Err != nil {
				t.Fatalf("%s: %v", reqs[i].ID, ev.Err)
			}
			gotIDs[reqs[i].ID] = append(gotIDs[reqs[i].ID], ev.TokenIDs)
			var l []float32
			for _, lp := range ev.Logprobs {
				l = append(l, lp.Logprob)
			}
			gotLPs[reqs[i].ID] = append(gotLPs[reqs[i].ID], l)
		}
	}
	st := e.Stats()
	shutdown(t, e)
	greedy := map[string][][]int32{}
	for _, r := range reqs {
		if r.Params.Temperature == 0 {
			greedy[r.ID] = wantIDs[r.ID]
		}
	}
	sameOutputs(t, greedy, gotIDs, wantLPs, gotLPs)
	if e.drafter.failures == 0 || st.SpecAcceptedTokens == 0 {
		t.Fatalf("%d draft failures, %d proposals accepted; want both", e.drafter.failures, st.SpecAcceptedTokens)
	}
	t.Logf("%d draft passes failed; %d proposed, %d accepted", e.drafter.failures, st.SpecDraftTokens, st.SpecAcceptedTokens)
}
