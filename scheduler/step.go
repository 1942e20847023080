package scheduler

import (
	"fmt"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// Schedule plans the next forward pass. Running sequences come first, in admission order:
// each gets its decode token or its next prompt chunk while the token budget lasts, and when
// one needs a KV block that is not free, the newest running sequence is preempted. Then, if
// nothing was preempted, waiting sequences are admitted as the policy, the sequence cap,
// the remaining budget and free blocks allow.
//
// The returned plan stays valid until the next Schedule. A plan with items must be applied
// with Update before the next pass can be planned: until then Schedule returns the same
// plan. A plan may be empty (nothing to run yet) and still carry Failed sequences.
func (s *Scheduler) Schedule() *Plan {
	p := &s.plan
	if s.pending {
		return p
	}
	p.Items = p.Items[:0]
	p.Copies = p.Copies[:0]
	p.draft = p.draft[:0]
	clear(p.Preempted)
	p.Preempted = p.Preempted[:0]
	clear(p.Failed)
	p.Failed = p.Failed[:0]
	s.step++
	p.step = s.step
	s.now = s.clock.Now()

	s.planStepLimit()
	budget := s.scheduleRunning(s.cfg.MaxNumBatchedTokens)
	if len(p.Preempted) == 0 && budget > 0 {
		budget = s.admit(budget)
	}
	p.NumBatchedTokens = s.cfg.MaxNumBatchedTokens - budget
	s.lastShape = StepShape{}
	for _, it := range p.Items {
		s.lastShape.add(it.StartPos, it.NumNewTokens+len(it.Draft))
	}

	s.stats.LastStepSeqs = len(p.Items)
	s.stats.LastStepTokens = p.NumBatchedTokens
	if len(p.Items) > 0 {
		s.stats.Steps++
		s.stats.ScheduledTokens += int64(p.NumBatchedTokens)
		s.pending = true
	}
	return p
}

// wantTokens returns how many tokens q should compute next: all it knows, except that a
// parent whose children wait to fork stops one token short of its prompt.
func (q *Sequence) wantTokens() int { return q.wantTokensFrom(q.numComputed) }

// wantTokensFrom is wantTokens with computed tokens already computed.
func (q *Sequence) wantTokensFrom(computed int) int {
	n := len(q.Tokens) - computed
	if len(q.awaiting) > 0 {
		n = min(n, q.numPrompt-1-computed)
	}
	return n
}

// addItem plans n tokens of q, whose block table (after this step's allocation) is blocks.
func (s *Scheduler) addItem(q *Sequence, n int, blocks []kvcache.BlockID) {
	items := s.plan.Items
	if len(items) < cap(items) {
		items = items[:len(items)+1]
	} else {
		items = append(items, Item{})
	}
	s.plan.Items = items
	// Field by field into the slot: building the item on the stack and copying it costs
	// a store-forwarding stall per item.
	it := &items[len(items)-1]
	it.Seq = q
	it.StartPos = q.numComputed
	it.NumNewTokens = n
	it.Sample = it.StartPos+n == len(q.Tokens)
	it.Draft, it.draftSlots = nil, 0
	it.Blocks = blocks
}

// scheduleRunning plans the running sequences and returns the budget left.
func (s *Scheduler) scheduleRunning(budget int) int {
	spec := s.cfg.Speculation
	speculate := spec.on() && (spec.MaxBatch == 0 || len(s.running) <= spec.MaxBatch)
	for i := 0; i < len(s.running) && budget > 0; i++ {
		q := s.running[i]
		if len(q.awaiting) > 0 && q.numComputed >= q.numPrompt-1 {
			s.forkChildren(q)
		}
		n := min(q.wantTokens(), budget)
		if n > 1 {
			n = s.prefillTokens(q.numComputed, n)
		}
		if n <= 0 {
			continue
		}
		// A decoding sequence may bring proposals: within the budget left after the
		// rows still to come get one token each, and no position past MaxModelLen - 1.
		var draft []int32
		if speculate && q.Speculate && n == 1 && len(q.awaiting) == 0 && q.wantTokens() == 1 {
			k := min(spec.NumTokens, budget-1-(len(s.running)-1-i), s.cfg.MaxModelLen-len(q.Tokens)-1)
			from := len(s.plan.draft)
			if spec.External {
				s.plan.draft = proposeSlots(s.plan.draft, k)
			} else {
				s.plan.draft = proposeLookup(s.plan.draft, q.Tokens, k, spec.LookupMin, spec.LookupMax)
			}
			draft = s.plan.draft[from:]
		}
		blocks, ok := s.reserve(i, n+len(draft))
		if !ok {
			break // q left the running batch; it was the newest, so nothing follows it
		}
		s.addItem(q, n, blocks)
		it := &s.plan.Items[len(s.plan.Items)-1]
		it.Draft, it.draftSlots = draft, len(draft)
		budget -= n + len(draft)
	}
	return budget
}

// reserve allocates n more token slots for running[i], preempting the newest running
// sequences while that does not fit, and returns its block table. When running[i] is itself
// the newest, it is preempted (older sequences will free blocks as they finish) or, when it
// is the only running sequence, failed (it can never fit), and reserve returns false.
func (s *Scheduler) reserve(i, n int) ([]kvcache.BlockID, bool) {
	q := s.running[i]
	for {
		blocks, cow, ok := s.pool.AllocateSlots(q.ID, nil, n)
		if ok {
			s.plan.Copies = append(s.plan.Copies, cow...)
			return blocks, true
		}
		last := len(s.running) - 1
		switch {
		case last > i:
			s.preempt(last)
		case i > 0:
			s.preempt(i)
			return nil, false
		default:
			s.removeRunning(i)
			s.fail(q)
			return nil, false
		}
	}
}

// forkChildren makes q's waiting children share q's blocks and run; they join the end of
// the running batch with q's computed count. q has computed all prompt tokens but the last.
func (s *Scheduler) forkChildren(q *Sequence) {
	children := q.awaiting
	q.awaiting = nil
	s.numAwaiting -= len(children)
	for _, c := range children {
		if q.numComputed > 0 {
			if err := s.pool.Fork(q.ID, c.ID); err != nil {
				// Cannot share: the child waits as an ordinary sequence and the prefix cache
				// serves what it can.
				s.pool.Free(c.ID)
				s.waiting.insert(0, c)
				s.numWaitingSeqs++
				continue
			}
		}
		s.startRunning(c, q.numComputed)
	}
}

// startRunning moves a sequence into the running batch with computed tokens.
func (s *Scheduler) startRunning(q *Sequence, computed int) {
	q.status = StatusRunning
	q.numComputed = computed
	if !q.admitted {
		q.admitted = true
		q.firstScheduled = s.now
		q.numCachedTok = computed
	}
	s.running = append(s.running, q)
}

func (s *Scheduler) removeRunning(i int) {
	copy(s.running[i:], s.running[i+1:])
	s.running[len(s.running)-1] = nil
	s.running = s.running[:len(s.running)-1]
}

// preempt frees running[i]'s blocks and puts it back at the front of the waiting queue, to
// be recomputed from scratch (prompt and generated tokens alike). Its children waiting to
// fork stay with it.
func (s *Scheduler) preempt(i int) {
	q := s.running[i]
	s.removeRunning(i)
	s.pool.Free(q.ID)
	q.status = StatusWaiting
	q.numComputed = 0
	q.numPreemptions++
	s.stats.Preemptions++
	s.numAwaiting -= len(q.awaiting)
	s.numWaitingSeqs += 1 + len(q.awaiting)
	s.waiting.insert(0, q)
	s.plan.Preempted = append(s.plan.Preempted, q)
}

// RecomputeAll preempts every running sequence, to be recomputed from scratch, and
// returns how many it preempted: for a KV cache whose contents were lost (a runner on a
// GPU replaced, with the device memory the blocks lived in). It must not be called while
// a plan is pending (between Schedule and Update).
func (s *Scheduler) RecomputeAll() (int, error) {
	if s.pending {
		return 0, fmt.Errorf("%w: RecomputeAll while a plan is pending", ErrInvalid)
	}
	n := len(s.running)
	for i := n - 1; i >= 0; i-- { // the first running ends up first in the queue
		s.preempt(i)
	}
	return n, nil
}

// fail ends q, which is in neither the running batch nor the queue, and its waiting
// children with FinishNoCapacity.
func (s *Scheduler) fail(q *Sequence) {
	children := q.awaiting
	q.awaiting = nil
	if q.status == StatusRunning {
		s.numAwaiting -= len(children)
	} else {
		s.numWaitingSeqs -= len(children)
	}
	for _, c := range append(children, q) {
		s.finishSeq(c, FinishNoCapacity)
		s.plan.Failed = append(s.plan.Failed, c)
		s.stats.Failed++
	}
}

// formBatch starts the next static (or sequential) batch from the front of the queue when
// the policy allows it.
func (s *Scheduler) formBatch() {
	if s.waiting.len() == 0 {
		return
	}
	if s.cfg.Policy == Static && s.numWaitingSeqs < s.cfg.MaxBatchSize &&
		s.now.Sub(s.waiting.front().enqueued) < s.cfg.MaxBatchDelay {
		return
	}
	s.curBatch++
	members := 0
	for i := 0; i < s.waiting.len(); i++ {
		q := s.waiting.at(i)
		k := 1 + len(q.awaiting)
		if i > 0 && (s.cfg.Policy == Sequential || members+k > s.cfg.MaxBatchSize) {
			break
		}
		q.batch = s.curBatch
		for _, c := range q.awaiting {
			c.batch = s.curBatch
		}
		members += k
	}
	s.batchRemaining = members
}

// admit moves waiting sequences into the running batch, in queue order, and returns the
// budget left. The first sequence that does not fit stops admission (first come, first
// served), except one that cannot fit even into an empty pool, which fails.
func (s *Scheduler) admit(budget int) int {
	static := s.cfg.Policy != Continuous
	if static && s.batchRemaining <= 0 {
		s.formBatch()
	}
	for budget > 0 && s.waiting.len() > 0 {
		q := s.waiting.front()
		if static && (q.batch == 0 || q.batch != s.curBatch) {
			break
		}
		if len(s.running)+s.numAwaiting+1+len(q.awaiting) > s.cfg.MaxNumSeqs {
			break
		}
		// A pure lookup: nothing to undo when q does not fit. The pool counts the query
		// and takes the cached blocks only in AllocateSlots, when q is admitted.
		hit := &s.hit
		hit.Reset()
		if s.cfg.EnablePrefixCaching {
			s.pool.FindPrefix(hit, q.Tokens, q.PrefixKey)
		}
		cached := hit.NumTokens()
		forkNow := len(q.awaiting) > 0 && cached >= q.numPrompt-1
		n := len(q.Tokens) - cached
		if !forkNow {
			n = q.wantTokensFrom(cached)
		}
		if !s.cfg.EnableChunkedPrefill && n > budget {
			break
		}
		n = min(n, budget)
		if n > 1 && s.cfg.EnableChunkedPrefill {
			n = s.prefillTokens(cached, n)
		}
		if n <= 0 {
			break
		}
		// All or nothing; a new sequence's cached blocks are full, so no copy-on-write.
		blocks, _, ok := s.pool.AllocateSlots(q.ID, hit, n)
		if !ok {
			if len(s.running) == 0 && s.numAwaiting == 0 {
				// Nothing else holds blocks: q cannot fit even alone.
				s.waiting.popFront()
				s.numWaitingSeqs--
				s.fail(q)
				continue
			}
			break
		}
		// Children share only the cached prefix: each attaches the same hit (counted once).
		if forkNow && cached > 0 {
			s.attachChildren(q, hit)
		}
		s.waiting.popFront()
		s.numWaitingSeqs -= 1 + len(q.awaiting)
		s.startRunning(q, cached)
		s.addItem(q, n, blocks)
		budget -= n
		if !forkNow {
			s.numAwaiting += len(q.awaiting)
			continue
		}
		children := q.awaiting
		q.awaiting = nil
		for _, c := range children {
			s.startRunning(c, cached)
		}
		// Each child computes the last prompt token itself, budget and blocks permitting;
		// otherwise it runs from the next step on.
		for _, c := range children {
			if budget == 0 {
				break
			}
			blocks, cow, ok := s.pool.AllocateSlots(c.ID, nil, 1)
			if !ok {
				break
			}
			s.plan.Copies = append(s.plan.Copies, cow...)
			s.addItem(c, 1, blocks)
			budget--
		}
	}
	return budget
}

// attachChildren gives each child waiting on q (q is at the front of the queue and was just
// admitted with hit) the cached prefix q got, as a fork of q before it grew would. A child
// the pool refuses becomes an ordinary waiting sequence right behind q, served by the
// prefix cache instead.
func (s *Scheduler) attachChildren(q *Sequence, hit *kvcache.PrefixHit) {
	kept := q.awaiting[:0]
	var refused []*Sequence
	for _, c := range q.awaiting {
		if _, _, ok := s.pool.AllocateSlots(c.ID, hit, 0); !ok {
			refused = append(refused, c)
			continue
		}
		kept = append(kept, c)
	}
	clear(q.awaiting[len(kept):])
	q.awaiting = kept
	if len(refused) > 0 {
		s.waiting.insert(1, refused...)
	}
}

// Update applies the outcome of the forward pass planned by the last Schedule: results[i]
// belongs to plan.Items[i]. For each item it commits the computed tokens to the KV pool
// (registering full blocks for prefix caching), advances the sequence's computed count,
// appends the sampled token when the item sampled, and ends the sequence when the result
// says so or it reached MaxModelLen. Items whose sequence was aborted meanwhile are
// skipped. It returns the sequences that finished (blocks freed); the slice is reused by the
// next Update.
func (s *Scheduler) Update(plan *Plan, results []Result) ([]*Sequence, error) {
	if plan != &s.plan || plan.step != s.step {
		return nil, fmt.Errorf("%w: plan is not the scheduler's latest", ErrInvalid)
	}
	if !s.pending {
		if len(plan.Items) == 0 && len(results) == 0 {
			return nil, nil
		}
		return nil, fmt.Errorf("%w: plan already applied", ErrInvalid)
	}
	if len(results) != len(plan.Items) {
		return nil, fmt.Errorf("%w: %d results for %d plan items", ErrInvalid, len(results), len(plan.Items))
	}
	clear(s.finished)
	s.finished = s.finished[:0]
	var firstErr error
	for i := range plan.Items {
		it := &plan.Items[i]
		q := it.Seq
		if q.status != StatusRunning {
			continue
		}
		end := it.StartPos + it.NumNewTokens
		if len(it.Draft) > 0 && len(results[i].Tokens) > 0 {
			if err := s.applyDraft(q, it, results[i].Tokens); err != nil && firstErr == nil {
				firstErr = err
			}
		} else {
			if err := s.pool.Commit(q.ID, it.StartPos, q.Tokens[it.StartPos:end], q.PrefixKey); err != nil && firstErr == nil {
				firstErr = fmt.Errorf("scheduler: commit sequence %d: %w", q.ID, err)
			}
			if it.draftSlots > 0 { // no proposal verified or kept: give their slots back
				if err := s.pool.Truncate(q.ID, end); err != nil && firstErr == nil {
					firstErr = fmt.Errorf("scheduler: truncate sequence %d: %w", q.ID, err)
				}
			}
			q.numComputed = end
			if it.Sample {
				q.Tokens = append(q.Tokens, results[i].Token)
				s.stats.GeneratedTokens++
			}
		}
		switch {
		case results[i].Finished:
			s.endRunning(q, FinishEngine)
		case it.Sample && len(q.Tokens) >= s.cfg.MaxModelLen:
			s.endRunning(q, FinishLength)
		}
	}
	if len(s.finished) > 0 {
		kept := s.running[:0]
		for _, q := range s.running {
			if q.status == StatusRunning {
				kept = append(kept, q)
			}
		}
		clear(s.running[len(kept):])
		s.running = kept
	}
	s.pending = false
	return s.finished, firstErr
}

// applyDraft applies a speculating item's sampled tokens: the proposals that match them
// keep their KV (committed with the item's token), the others give their slots back, and
// the sampled tokens extend the sequence.
func (s *Scheduler) applyDraft(q *Sequence, it *Item, sampled []int32) error {
	var err error
	if len(sampled) > len(it.Draft)+1 {
		err = fmt.Errorf("%w: %d tokens sampled for a draft of %d", ErrInvalid, len(sampled), len(it.Draft))
		sampled = sampled[:len(it.Draft)+1]
	}
	accepted := 0
	for accepted < len(it.Draft) && accepted < len(sampled) && sampled[accepted] == it.Draft[accepted] {
		accepted++
	}
	s.countDraft(len(it.Draft), accepted)
	end := it.StartPos + it.NumNewTokens + accepted
	if terr := s.pool.Truncate(q.ID, end); terr != nil && err == nil {
		err = fmt.Errorf("scheduler: truncate sequence %d: %w", q.ID, terr)
	}
	q.Tokens = append(q.Tokens, sampled...)
	s.stats.GeneratedTokens += int64(len(sampled))
	if cerr := s.pool.Commit(q.ID, it.StartPos, q.Tokens[it.StartPos:end], q.PrefixKey); cerr != nil && err == nil {
		err = fmt.Errorf("scheduler: commit sequence %d: %w", q.ID, cerr)
	}
	q.numComputed = end
	return err
}

// countDraft counts a verified draft of n proposals of which the first accepted matched.
func (s *Scheduler) countDraft(n, accepted int) {
	s.stats.Drafts++
	s.stats.DraftTokens += int64(n)
	s.stats.AcceptedTokens += int64(accepted)
	for len(s.stats.AcceptedAt) < n {
		s.stats.AcceptedAt = append(s.stats.AcceptedAt, 0)
	}
	for j := range accepted {
		s.stats.AcceptedAt[j]++
	}
}

// endRunning finishes a running sequence during Update; the caller compacts s.running.
func (s *Scheduler) endRunning(q *Sequence, reason FinishReason) {
	s.detachChildren(q, 0)
	s.finishSeq(q, reason)
	s.finished = append(s.finished, q)
}

// stepLimit bounds one step's prompt work while sequences decode (Config.TargetStepTime).
type stepLimit struct {
	active    bool
	remaining time.Duration // predicted time left for prompt chunks
	floor     int           // prompt tokens allowed whatever the time (progress)
	tokens    int           // prompt tokens the cost model's prediction is trusted for
}

// ObserveStep records how long the forward pass of the latest plan took; the cost model
// that sizes prompt chunks learns from it.
func (s *Scheduler) ObserveStep(d time.Duration) {
	s.cost.Observe(s.lastShape, d)
}

// planStepLimit sets this step's prompt-work bound: with sequences decoding and a learned
// cost model, prompt chunks may add what the target leaves after the decode rows, within
// the token count the model's prediction is trusted for (StepCost.TrustedTokens). Before
// the model has seen enough steps, prompt chunks next to decoding rows are held to
// coldPrefillChunkTokens, so a burst of arrivals at start-up does not stall the first
// streams while the model learns.
func (s *Scheduler) planStepLimit() {
	s.limit = stepLimit{}
	if s.cfg.Policy != Continuous || s.cfg.TargetStepTime < 0 {
		return
	}
	var decode StepShape
	for _, q := range s.running {
		if q.wantTokens() == 1 {
			decode.add(q.numComputed, 1)
		}
	}
	if decode.Rows == 0 {
		return // nothing decoding: prompts run at full efficiency
	}
	if !s.cost.Ready() {
		s.limit = stepLimit{active: true, floor: coldPrefillChunkTokens, tokens: coldPrefillChunkTokens}
		return
	}
	base := s.cost.Predict(decode)
	target := s.cfg.TargetStepTime
	if target == 0 {
		target = max(AutoStepTimeFactor*base, MinAutoStepTime)
	}
	trusted := max(s.cost.TrustedTokens()-decode.Tokens, coldPrefillChunkTokens)
	s.limit = stepLimit{active: true, remaining: target - base, floor: minPrefillChunkTokens, tokens: trusted}
}

// prefillTokens returns how many of n prompt tokens after past this step may compute
// under the step limit, and charges them to it.
func (s *Scheduler) prefillTokens(past, n int) int {
	l := &s.limit
	if !l.active {
		return n
	}
	fit := max(s.cost.maxTokens(past, n, l.remaining), min(n, l.floor))
	fit = min(fit, l.tokens)
	l.remaining -= s.cost.marginal(past, fit)
	l.floor = max(l.floor-fit, 0)
	l.tokens -= fit
	return fit
}
