package scheduler

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// req describes one test request. Its sequences get ids base, base+1, ... and names name,
// name+"1", name+"2", ... for children.
type req struct {
	name      string
	prompt    []int32
	maxNew    int // the engine ends the sequence after this many generated tokens
	n         int // sequences (0 means 1)
	saltFirst uint64
}

// seqInfo is the test engine's per-sequence data (Sequence.Data).
type seqInfo struct {
	name   string
	maxNew int
	salt   uint64
}

// fakeNext is the fake model: the next token is a deterministic function of the sequence's
// salt and every token it has seen.
func fakeNext(salt uint64, tokens []int32) int32 {
	h := uint64(14695981039346656037) ^ salt
	for _, t := range tokens {
		h ^= uint64(uint32(t))
		h *= 1099511628211
	}
	return int32(h%1000) + 1
}

// reference returns what a sequence generates when it runs alone with unlimited resources.
func reference(salt uint64, prompt []int32, maxNew int) []int32 {
	toks := append([]int32(nil), prompt...)
	for range maxNew {
		toks = append(toks, fakeNext(salt, toks))
	}
	return toks[len(prompt):]
}

// harness plays the engine with a fake model whose "K/V" is the token id itself, stored in
// a fake block storage: a wrong block table, a missed copy-on-write or a wrong start position
// makes the model see wrong tokens, which the harness reports.
type harness struct {
	t     testing.TB
	s     *Scheduler
	pool  *kvcache.Pool
	clock *manualClock
	bs    int
	kv    []int32 // slot block*bs+off holds token+1; 0 = never written

	nextID   kvcache.SeqID
	byName   map[string]*Sequence
	done     map[string]*Sequence
	failed   map[string]*Sequence
	results  []Result
	fed      int // tokens fed to the model
	nsteps   int
	maxBatch int
}

func newHarness(t testing.TB, cfg Config, numBlocks, blockSize int, prefixCaching bool) *harness {
	t.Helper()
	pool, err := kvcache.NewPool(kvcache.PoolConfig{NumBlocks: numBlocks, BlockSizeTokens: blockSize, EnablePrefixCaching: prefixCaching})
	if err != nil {
		t.Fatal(err)
	}
	clock := newManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := newWithClock(cfg, pool, clock)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{
		t: t, s: s, pool: pool, clock: clock, bs: blockSize,
		kv:     make([]int32, numBlocks*blockSize),
		nextID: 1,
		byName: map[string]*Sequence{}, done: map[string]*Sequence{}, failed: map[string]*Sequence{},
	}
}

// add queues r and returns Add's error.
func (h *harness) add(r req) error {
	n := max(r.n, 1)
	group := make([]*Sequence, n)
	for i := range group {
		name := r.name
		if i > 0 {
			name = fmt.Sprintf("%s%d", r.name, i)
		}
		group[i] = &Sequence{
			ID:     h.nextID,
			Tokens: append([]int32(nil), r.prompt...),
			Data:   &seqInfo{name: name, maxNew: r.maxNew, salt: r.saltFirst + uint64(i)},
		}
		h.nextID++
	}
	if err := h.s.AddGroup(group); err != nil {
		return err
	}
	for _, q := range group {
		h.byName[q.Data.(*seqInfo).name] = q
	}
	return nil
}

func (h *harness) mustAdd(r req) {
	h.t.Helper()
	if err := h.add(r); err != nil {
		h.t.Fatalf("add %s: %v", r.name, err)
	}
}

func name(q *Sequence) string { return q.Data.(*seqInfo).name }

// step runs one engine iteration and describes it: items as name:start+count ("*" when
// sampling), then "; pre x" for preempted, "; fail x" for failed, "; done x" for finished
// sequences. An empty plan reads "-".
func (h *harness) step() string {
	h.t.Helper()
	s := h.s
	plan := s.Schedule()
	var b strings.Builder
	for _, c := range plan.Copies {
		copy(h.kv[int(c.Dst)*h.bs:(int(c.Dst)+1)*h.bs], h.kv[int(c.Src)*h.bs:(int(c.Src)+1)*h.bs])
	}
	h.results = h.results[:0]
	total := 0
	for i, it := range plan.Items {
		q := it.Seq
		info := q.Data.(*seqInfo)
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%d+%d", info.name, it.StartPos, it.NumNewTokens)
		if it.Sample {
			b.WriteByte('*')
		}
		if it.NumNewTokens < 1 || it.StartPos != q.NumComputed() {
			h.t.Fatalf("%s: bad item start %d count %d (computed %d)", info.name, it.StartPos, it.NumNewTokens, q.NumComputed())
		}
		total += it.NumNewTokens
		// The model reads and writes the blocks the plan names, which must be the pool's.
		table := it.Blocks
		if !slices.Equal(table, h.pool.BlockTable(q.ID)) {
			h.t.Fatalf("%s: plan names blocks %v, the pool's table is %v", info.name, table, h.pool.BlockTable(q.ID))
		}
		end := it.StartPos + it.NumNewTokens
		if len(table)*h.bs < end {
			h.t.Fatalf("%s: %d blocks cannot hold %d tokens", info.name, len(table), end)
		}
		// The model sees the past from the cache and the new tokens from the input.
		seen := make([]int32, 0, end)
		for pos := 0; pos < it.StartPos; pos++ {
			v := h.kv[int(table[pos/h.bs])*h.bs+pos%h.bs] - 1
			if v != q.Tokens[pos] {
				h.t.Fatalf("%s: cached K/V at position %d holds token %d, want %d", info.name, pos, v, q.Tokens[pos])
			}
			seen = append(seen, v)
		}
		seen = append(seen, it.Tokens()...)
		for pos := it.StartPos; pos < end; pos++ {
			h.kv[int(table[pos/h.bs])*h.bs+pos%h.bs] = q.Tokens[pos] + 1
		}
		var r Result
		if it.Sample {
			r.Token = fakeNext(info.salt, seen)
			r.Finished = q.NumGenerated()+1 >= info.maxNew
		}
		h.results = append(h.results, r)
	}
	if total != plan.NumBatchedTokens || total > s.cfg.MaxNumBatchedTokens {
		h.t.Fatalf("plan has %d tokens, NumBatchedTokens %d, budget %d", total, plan.NumBatchedTokens, s.cfg.MaxNumBatchedTokens)
	}
	if len(plan.Items) > 0 {
		h.nsteps++
	}
	h.fed += total
	h.maxBatch = max(h.maxBatch, len(plan.Items))
	for _, q := range plan.Preempted {
		fmt.Fprintf(&b, "; pre %s", name(q))
	}
	for _, q := range plan.Failed {
		fmt.Fprintf(&b, "; fail %s", name(q))
		h.failed[name(q)] = q
	}
	finished, err := s.Update(plan, h.results)
	if err != nil {
		h.t.Fatalf("update: %v", err)
	}
	for _, q := range finished {
		fmt.Fprintf(&b, "; done %s", name(q))
		h.done[name(q)] = q
	}
	h.check()
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}

// check verifies the scheduler's and the pool's invariants between steps.
func (h *harness) check() {
	h.t.Helper()
	s := h.s
	if err := h.pool.CheckInvariants(); err != nil {
		h.t.Fatal(err)
	}
	if n := len(s.running) + s.numAwaiting; n > s.cfg.MaxNumSeqs {
		h.t.Fatalf("%d sequences running, cap %d", n, s.cfg.MaxNumSeqs)
	}
	live := 0
	awaiting := 0
	for _, q := range s.running {
		live++
		if q.status != StatusRunning {
			h.t.Fatalf("%s in running with status %v", name(q), q.status)
		}
		if got := h.pool.NumTokens(q.ID); got != q.numComputed {
			h.t.Fatalf("%s: pool holds %d tokens, computed %d", name(q), got, q.numComputed)
		}
		awaiting += len(q.awaiting)
		for _, c := range q.awaiting {
			live++
			if h.pool.NumTokens(c.ID) != 0 {
				h.t.Fatalf("%s waits to fork but holds blocks", name(c))
			}
		}
	}
	if awaiting != s.numAwaiting {
		h.t.Fatalf("numAwaiting %d, counted %d", s.numAwaiting, awaiting)
	}
	waitingSeqs := 0
	for i := 0; i < s.waiting.len(); i++ {
		q := s.waiting.at(i)
		if q.status != StatusWaiting || q.numComputed != 0 || h.pool.NumTokens(q.ID) != 0 {
			h.t.Fatalf("%s waiting with status %v, computed %d, %d tokens in the pool", name(q), q.status, q.numComputed, h.pool.NumTokens(q.ID))
		}
		waitingSeqs += 1 + len(q.awaiting)
		for _, c := range q.awaiting {
			if h.pool.NumTokens(c.ID) != 0 {
				h.t.Fatalf("%s waits to fork but holds blocks", name(c))
			}
		}
	}
	live += waitingSeqs
	if waitingSeqs != s.numWaitingSeqs {
		h.t.Fatalf("numWaitingSeqs %d, counted %d", s.numWaitingSeqs, waitingSeqs)
	}
	if live != len(s.seqs) {
		h.t.Fatalf("%d live sequences in the map, %d in queues", len(s.seqs), live)
	}
	if st := s.Stats(); st.Running+st.Waiting != live {
		h.t.Fatalf("stats %+v, %d live", st, live)
	}
	if !s.HasWork() {
		if st := h.pool.Stats(); st.UsedBlocks != 0 || st.FreeBlocks != st.TotalBlocks {
			h.t.Fatalf("idle scheduler but pool %+v", st)
		}
	}
}

// run steps until no work is left (at most limit steps) and returns the step descriptions.
func (h *harness) run(limit int) []string {
	h.t.Helper()
	var out []string
	for h.s.HasWork() {
		if len(out) == limit {
			h.t.Fatalf("still busy after %d steps: %v", limit, out[max(0, len(out)-5):])
		}
		out = append(out, h.step())
	}
	return out
}

// output returns the tokens a finished sequence generated.
func (h *harness) output(name string) []int32 {
	q := h.done[name]
	if q == nil {
		h.t.Fatalf("%s did not finish", name)
	}
	return q.Tokens[q.NumPromptTokens():]
}

// seqTokens returns n tokens start, start+1, ...
func seqTokens(start, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(start + i)
	}
	return out
}
