package scheduler

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestRandomRuns drives random workloads under random configurations (all policies, tiny
// pools that force preemption, prefix caching on and off, chunked prefill on and off, n > 1
// requests, aborts) and checks after every step the scheduler's and the pool's invariants,
// and at the end that every request not aborted completed with exactly the tokens it
// generates alone.
func TestRandomRuns(t *testing.T) {
	runs := 150
	if testing.Short() {
		runs = 30
	}
	var preemptions, hits, forks int64
	for seed := range uint64(runs) {
		p, h, f := randomRun(t, seed)
		preemptions += p
		hits += h
		forks += f
	}
	t.Logf("%d runs: %d preemptions, %d prefix-hit tokens, %d forked children", runs, preemptions, hits, forks)
	if preemptions == 0 || hits == 0 || forks == 0 {
		t.Fatalf("the runs never exercised preemption (%d), prefix hits (%d tokens) or forks (%d)", preemptions, hits, forks)
	}
}

func randomRun(t *testing.T, seed uint64) (preemptions, prefixHits, forks int64) {
	rng := rand.New(rand.NewPCG(seed, 42))
	cfg := DefaultConfig()
	cfg.Policy = Policy(rng.IntN(3))
	cfg.MaxNumSeqs = 1 + rng.IntN(8)
	cfg.MaxNumBatchedTokens = cfg.MaxNumSeqs + rng.IntN(24)
	cfg.MaxModelLen = 48
	cfg.EnableChunkedPrefill = rng.IntN(4) != 0
	if !cfg.EnableChunkedPrefill {
		cfg.MaxNumBatchedTokens = max(cfg.MaxNumBatchedTokens, cfg.MaxModelLen)
	}
	cfg.MaxBatchSize = 1 + rng.IntN(cfg.MaxNumSeqs)
	cfg.MaxBatchDelay = time.Duration(rng.IntN(4)) * time.Millisecond
	cfg.EnablePrefixCaching = rng.IntN(2) == 0
	bs := 1 + rng.IntN(4)
	const maxTotal = 40 // prompt + generated tokens of any sequence
	minBlocks := (maxTotal + bs - 1) / bs
	blocks := minBlocks + rng.IntN(3*minBlocks)

	desc := fmt.Sprintf("seed %d: %+v, %d blocks of %d", seed, cfg, blocks, bs)
	h := newHarness(t, cfg, blocks, bs, cfg.EnablePrefixCaching)

	bases := [][]int32{seqTokens(100, 30), seqTokens(200, 30), seqTokens(300, 30)}
	type arrival struct {
		step int
		r    req
	}
	var arrivals []arrival
	numReqs := 5 + rng.IntN(20)
	for i := range numReqs {
		promptLen := 1 + rng.IntN(24)
		var prompt []int32
		if rng.IntN(3) > 0 { // shared prefix, own tail
			base := bases[rng.IntN(len(bases))]
			shared := rng.IntN(promptLen + 1)
			prompt = append(prompt, base[:shared]...)
		}
		for len(prompt) < promptLen {
			prompt = append(prompt, int32(1000+rng.IntN(50)))
		}
		if i > 0 && rng.IntN(4) == 0 { // the same prompt again: a full prefix hit
			prompt = arrivals[rng.IntN(i)].r.prompt
			promptLen = len(prompt)
		}
		n := 1
		if rng.IntN(4) == 0 {
			n = 2 + rng.IntN(2)
		}
		limit := cfg.MaxNumSeqs
		if cfg.Policy == Static {
			limit = cfg.MaxBatchSize
		}
		n = min(n, limit)
		arrivals = append(arrivals, arrival{
			step: rng.IntN(3 * numReqs),
			r: req{
				name:      fmt.Sprintf("r%d_", i),
				prompt:    prompt,
				maxNew:    1 + rng.IntN(maxTotal-promptLen),
				n:         n,
				saltFirst: uint64(i * 10),
			},
		})
	}
	slices.SortStableFunc(arrivals, func(a, b arrival) int { return a.step - b.step })

	aborted := map[string]bool{}
	var added []req
	next := 0
	for step := 0; next < len(arrivals) || h.s.HasWork(); step++ {
		if step > 20000 {
			t.Fatalf("%s: no progress after %d steps: %+v", desc, step, h.s.Stats())
		}
		for next < len(arrivals) && arrivals[next].step <= step {
			if err := h.add(arrivals[next].r); err != nil {
				t.Fatalf("%s: add: %v", desc, err)
			}
			added = append(added, arrivals[next].r)
			next++
		}
		if rng.IntN(40) == 0 && len(h.s.seqs) > 0 {
			// Abort a random live sequence.
			ids := make([]*Sequence, 0, len(h.s.seqs))
			for _, q := range h.s.seqs {
				ids = append(ids, q)
			}
			slices.SortFunc(ids, func(a, b *Sequence) int { return int(a.ID) - int(b.ID) })
			q := ids[rng.IntN(len(ids))]
			if !h.s.Abort(q.ID) {
				t.Fatalf("%s: abort of live %s failed", desc, name(q))
			}
			aborted[name(q)] = true
			h.check()
		}
		h.clock.Advance(time.Millisecond)
		h.step()
		h.checkPolicy(desc)
	}
	if len(h.failed) > 0 {
		t.Fatalf("%s: sequences failed although each fits the pool alone: %v", desc, h.failed)
	}
	for _, r := range added {
		for i := range r.n {
			n := r.name
			if i > 0 {
				n = fmt.Sprintf("%s%d", r.name, i)
			}
			if aborted[n] {
				continue
			}
			q := h.done[n]
			if q == nil || q.FinishReason() != FinishEngine {
				t.Fatalf("%s: %s did not complete: %v", desc, n, q)
			}
			want := reference(r.saltFirst+uint64(i), r.prompt, r.maxNew)
			if got := q.Tokens[q.NumPromptTokens():]; !slices.Equal(got, want) {
				t.Fatalf("%s: %s generated %v, alone %v", desc, n, got, want)
			}
			if i > 0 && q.NumCachedPromptTokens() > 0 {
				forks++
			}
		}
	}
	if st := h.pool.Stats(); st.UsedBlocks != 0 {
		t.Fatalf("%s: blocks in use after the run: %+v", desc, st)
	}
	return h.s.Stats().Preemptions, h.pool.Stats().PrefixHitsTokens, forks
}

// checkPolicy verifies that static and sequential batches hold only members of the current
// batch (sequential: of one request).
func (h *harness) checkPolicy(desc string) {
	h.t.Helper()
	s := h.s
	if s.cfg.Policy == Continuous {
		return
	}
	var root *Sequence
	for _, q := range s.running {
		if q.batch != s.curBatch {
			h.t.Fatalf("%s: %s runs in batch %d while batch %d is current", desc, name(q), q.batch, s.curBatch)
		}
		r := q
		if q.parent != nil {
			r = q.parent
		}
		if s.cfg.Policy == Sequential {
			if root != nil && r != root {
				h.t.Fatalf("%s: %s and %s run together under the sequential policy", desc, name(root), name(r))
			}
			root = r
		}
	}
	if s.cfg.Policy == Static && len(s.running)+s.numAwaiting > s.cfg.MaxBatchSize {
		h.t.Fatalf("%s: %d sequences in a static batch of %d", desc, len(s.running)+s.numAwaiting, s.cfg.MaxBatchSize)
	}
}

// FuzzRandomRun explores more workloads and configurations; its seed corpus runs with the
// normal tests.
func FuzzRandomRun(f *testing.F) {
	for _, seed := range []uint64{1000, 1001, 1002} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		randomRun(t, seed)
	})
}
