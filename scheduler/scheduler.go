package scheduler

import (
	"fmt"
	"slices"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// Item is one sequence's share of a forward pass: feed the model the sequence's tokens at
// positions [StartPos, StartPos+NumNewTokens), with positions [0, StartPos) already in its
// KV blocks (Blocks).
type Item struct {
	Seq *Sequence
	// StartPos is the number of tokens already computed (the past length).
	StartPos int
	// NumNewTokens is how many tokens to compute this step (>= 1).
	NumNewTokens int
	// Sample is true when this step computes the last known token, so the logits of the last
	// new position give the sequence's next token. It is false for a prompt chunk that is
	// not the last one.
	Sample bool
	// Draft, for a decoding sequence that speculates, holds the tokens proposed after its
	// last one: they are fed at positions StartPos+1, ... and their KV slots are reserved
	// (and counted in the step's tokens). The engine needs logits at every position of the
	// row and reports the tokens it sampled in Result.Tokens. A view valid until the next
	// Schedule. With Speculation.External the engine fills it (see speculate.go).
	Draft []int32
	// draftSlots is how many slots were reserved for Draft when it was planned.
	draftSlots int
	// Blocks is the sequence's block table for this pass: entry i holds positions
	// [i*B, (i+1)*B) for the pool's block size B, and it covers at least
	// StartPos+NumNewTokens positions. Read the past from it and write the new K/V into it.
	// It is a read-only view of the pool's table, valid until Update (or an Abort of the
	// sequence).
	Blocks []kvcache.BlockID
}

// Tokens returns the token ids to feed the model for this item.
func (it Item) Tokens() []int32 { return it.Seq.Tokens[it.StartPos : it.StartPos+it.NumNewTokens] }

// Plan is one forward pass. It is owned by the scheduler, reused by the next Schedule, and
// must be handed back to Update once the pass has run.
type Plan struct {
	// Items lists the sequences in the batch, running ones first, then newly admitted ones.
	Items []Item
	// Copies are copy-on-write block copies to apply to the K/V storage, in order, before
	// writing any new K/V of this plan.
	Copies []kvcache.CopyOp
	// Preempted lists the sequences preempted this step: their blocks are freed and they wait
	// again (at the front of the queue) to be recomputed. Informational.
	Preempted []*Sequence
	// Failed lists the sequences finished this step with FinishNoCapacity: they cannot fit the
	// KV pool even alone. Their blocks are freed; the engine must end them. Failed may be
	// non-empty when Items is empty.
	Failed []*Sequence
	// NumBatchedTokens is the sum of Items[i].NumNewTokens.
	NumBatchedTokens int

	step  uint64
	draft []int32 // the items' drafts, back to back
}

// Result is the engine's outcome for one plan item.
type Result struct {
	// Token is the sampled token, appended to the sequence when the item's Sample is set
	// (ignored otherwise).
	Token int32
	// Finished ends the sequence (after appending Token): eos, a stop condition, max tokens,
	// or an error the engine reports itself.
	Finished bool
	// Tokens, for an item with a Draft, are the tokens sampled from its positions in order
	// (Token is then ignored): the proposals that matched, then the first token that did
	// not (or the one after the last proposal), cut short where the sequence finished. At
	// least one.
	Tokens []int32
}

// Stats is a snapshot of the scheduler's state and counters.
type Stats struct {
	Running         int   // sequences in the running batch, children waiting for their fork included
	Waiting         int   // sequences waiting to be admitted
	WaitingRequests int   // entries in the waiting queue (what MaxQueue caps)
	Preemptions     int64 // sequences preempted since start
	Failed          int64 // sequences finished with FinishNoCapacity since start
	Steps           int64 // plans with at least one item
	LastStepSeqs    int   // items in the last plan
	LastStepTokens  int   // tokens in the last plan
	ScheduledTokens int64 // tokens planned over all steps (prompt, recomputation and decode)
	GeneratedTokens int64 // tokens appended by Update
	// Speculative decoding: drafts verified, the tokens they proposed, those accepted, and
	// accepted ones by their position in the draft (AcceptedAt[j]: proposals j+1 deep
	// accepted).
	Drafts, DraftTokens, AcceptedTokens int64
	AcceptedAt                          []int64
}

// Scheduler decides, step by step, which sequences run and how many tokens each computes.
// It owns the KV pool's bookkeeping (prefix lookup and allocation, commit, free). It is not
// safe for concurrent use: one goroutine owns it (and the pool).
type Scheduler struct {
	cfg         Config
	pool        *kvcache.Pool
	clock       clock
	totalBlocks int

	seqs           map[kvcache.SeqID]*Sequence // every live sequence
	waiting        seqQueue
	running        []*Sequence // in admission order: the newest last
	numWaitingSeqs int         // sequences waiting, children attached to waiting parents included
	numAwaiting    int         // children attached to running parents (waiting for their fork)

	curBatch       uint64 // static batch being run; 0 = none yet
	batchRemaining int    // members of curBatch not finished

	plan     Plan
	hit      kvcache.PrefixHit // admission's prefix lookup, reused
	pending  bool              // plan returned by Schedule with items, not yet applied by Update
	step     uint64
	now      time.Time
	finished []*Sequence

	cost      StepCost  // learned step durations
	limit     stepLimit // this step's prefill bound
	lastShape StepShape // shape of the latest plan, for ObserveStep

	stats Stats
}

// New returns a scheduler over pool, timed by the wall clock.
func New(cfg Config, pool *kvcache.Pool) (*Scheduler, error) {
	return newWithClock(cfg, pool, systemClock{})
}

// newWithClock is New timed by c.
func newWithClock(cfg Config, pool *kvcache.Pool, c clock) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalid)
	}
	return &Scheduler{
		cfg:         cfg,
		pool:        pool,
		clock:       c,
		totalBlocks: pool.Stats().TotalBlocks,
		seqs:        make(map[kvcache.SeqID]*Sequence),
	}, nil
}

// Add queues one sequence (a request with n = 1). See AddGroup.
func (s *Scheduler) Add(seq *Sequence) error {
	return s.AddGroup([]*Sequence{seq})
}

// AddGroup queues the sequences of one request as one entry of the waiting queue. seqs[0]
// computes the prompt; the others (n > 1) must have the same prompt tokens and fork from it:
// they wait until seqs[0] has computed all prompt tokens but the last, then share its
// blocks (kvcache.Pool.Fork) and each compute the last prompt token themselves, so the
// prompt is computed once and every sequence samples its first token from its own logits.
//
// It returns an error wrapping ErrQueueFull when MaxQueue requests are waiting, ErrTooLong
// when the prompt exceeds MaxModelLen or the KV pool, and ErrInvalid for an empty prompt,
// a duplicate id, mismatched prompts or more sequences than a batch can hold.
func (s *Scheduler) AddGroup(seqs []*Sequence) error {
	if len(seqs) == 0 {
		return fmt.Errorf("%w: empty group", ErrInvalid)
	}
	if err := s.checkGroup(seqs); err != nil {
		return err
	}
	if s.waiting.len() >= s.cfg.MaxQueue {
		return fmt.Errorf("%w: %d requests waiting", ErrQueueFull, s.waiting.len())
	}
	now := s.clock.Now()
	parent := seqs[0]
	for i, q := range seqs {
		if q.ArrivalTime.IsZero() {
			q.ArrivalTime = now
		}
		q.status = StatusWaiting
		q.finish = FinishNone
		q.numPrompt = len(q.Tokens)
		q.numComputed = 0
		q.numPreemptions = 0
		q.numCachedTok = 0
		q.admitted = false
		q.firstScheduled = time.Time{}
		q.enqueued = now
		q.parent = nil
		q.awaiting = nil
		q.batch = 0
		if i > 0 {
			q.parent = parent
		}
		s.seqs[q.ID] = q
	}
	if len(seqs) > 1 {
		parent.awaiting = append([]*Sequence(nil), seqs[1:]...)
	}
	s.waiting.pushBack(parent)
	s.numWaitingSeqs += len(seqs)
	return nil
}

func (s *Scheduler) checkGroup(seqs []*Sequence) error {
	maxSeqs := s.cfg.MaxNumSeqs
	if s.cfg.Policy == Static {
		maxSeqs = s.cfg.MaxBatchSize
	}
	if len(seqs) > maxSeqs {
		return fmt.Errorf("%w: %d sequences in one request, at most %d fit a batch", ErrInvalid, len(seqs), maxSeqs)
	}
	prompt := seqs[0]
	if prompt == nil {
		return fmt.Errorf("%w: nil sequence", ErrInvalid)
	}
	n := len(prompt.Tokens)
	if n == 0 {
		return fmt.Errorf("%w: sequence %d has an empty prompt", ErrInvalid, prompt.ID)
	}
	if n > s.cfg.MaxModelLen {
		return fmt.Errorf("%w: %d tokens, MaxModelLen is %d", ErrTooLong, n, s.cfg.MaxModelLen)
	}
	if blocks := s.pool.SeqBlocks(n, s.cfg.MaxNumBatchedTokens); blocks > s.totalBlocks {
		return fmt.Errorf("%w: %d tokens need %d KV blocks, the pool has %d", ErrTooLong, n, blocks, s.totalBlocks)
	}
	for i, q := range seqs {
		if q == nil {
			return fmt.Errorf("%w: nil sequence", ErrInvalid)
		}
		if _, dup := s.seqs[q.ID]; dup {
			return fmt.Errorf("%w: sequence id %d is already live", ErrInvalid, q.ID)
		}
		for _, r := range seqs[:i] {
			if r.ID == q.ID || r == q {
				return fmt.Errorf("%w: sequence id %d twice in one request", ErrInvalid, q.ID)
			}
		}
		if i > 0 && !slices.Equal(q.Tokens, prompt.Tokens) {
			return fmt.Errorf("%w: sequence %d's prompt differs from sequence %d's", ErrInvalid, q.ID, prompt.ID)
		}
	}
	return nil
}

// Abort ends a live sequence at once, waiting or running, and frees its KV blocks. It
// reports whether the sequence was live. The sequence's status becomes StatusFinished with
// FinishAborted. Children of an n > 1 request waiting to fork from an aborted sequence go
// back to the front of the queue as ordinary sequences (abort them too to end the request).
// Abort may be called between Schedule and Update: Update skips the aborted sequence.
func (s *Scheduler) Abort(id kvcache.SeqID) bool {
	q := s.seqs[id]
	if q == nil {
		return false
	}
	switch {
	case q.parent != nil && q.parent.hasAwaiting(q):
		p := q.parent
		p.removeAwaiting(q)
		if p.status == StatusRunning {
			s.numAwaiting--
		} else {
			s.numWaitingSeqs--
		}
	case q.status == StatusWaiting:
		i := s.waiting.index(q)
		if i >= 0 {
			s.waiting.remove(i)
			s.numWaitingSeqs--
			s.detachChildren(q, i)
		}
	case q.status == StatusRunning:
		for i, r := range s.running {
			if r == q {
				s.removeRunning(i)
				break
			}
		}
		s.detachChildren(q, 0)
	}
	s.finishSeq(q, FinishAborted)
	return true
}

func (q *Sequence) hasAwaiting(c *Sequence) bool {
	for _, a := range q.awaiting {
		if a == c {
			return true
		}
	}
	return false
}

func (q *Sequence) removeAwaiting(c *Sequence) {
	for i, a := range q.awaiting {
		if a == c {
			q.awaiting = append(q.awaiting[:i], q.awaiting[i+1:]...)
			return
		}
	}
}

// detachChildren turns the children still waiting to fork from q into ordinary waiting
// sequences at queue position at. q is leaving (finished); if it was running, its children
// move from the running count to the waiting count.
func (s *Scheduler) detachChildren(q *Sequence, at int) {
	if len(q.awaiting) == 0 {
		return
	}
	if q.status == StatusRunning {
		s.numAwaiting -= len(q.awaiting)
		s.numWaitingSeqs += len(q.awaiting)
	}
	s.waiting.insert(at, q.awaiting...)
	q.awaiting = nil
}

// finishSeq frees q's blocks and forgets it.
func (s *Scheduler) finishSeq(q *Sequence, reason FinishReason) {
	s.pool.Free(q.ID)
	q.status = StatusFinished
	q.finish = reason
	delete(s.seqs, q.ID)
	if q.batch != 0 && q.batch == s.curBatch {
		s.batchRemaining--
	}
}

// NextBatchTime reports when the static policy will form its next batch from the requests
// already waiting, if no more arrive (the oldest request's arrival plus MaxBatchDelay).
// ok is false when no batch is pending on the delay: another policy, a batch running, an
// empty queue, or a full batch already waiting. An engine with nothing to run sleeps until
// this time or the next Add.
func (s *Scheduler) NextBatchTime() (t time.Time, ok bool) {
	if s.cfg.Policy != Static || s.batchRemaining > 0 || s.waiting.len() == 0 ||
		s.numWaitingSeqs >= s.cfg.MaxBatchSize {
		return time.Time{}, false
	}
	return s.waiting.front().enqueued.Add(s.cfg.MaxBatchDelay), true
}

// Stats returns a snapshot of the scheduler's state and counters.
func (s *Scheduler) Stats() Stats {
	st := s.stats
	st.Running = len(s.running) + s.numAwaiting
	st.Waiting = s.numWaitingSeqs
	st.WaitingRequests = s.waiting.len()
	st.AcceptedAt = slices.Clone(s.stats.AcceptedAt)
	return st
}

// HasWork reports whether any sequence is waiting or running.
func (s *Scheduler) HasWork() bool { return len(s.seqs) > 0 }
