package engine

import (
	"fmt"
	"math"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/scheduler"
)

// step runs one planned forward pass and everything around it: copy-on-write block
// copies, the batch (the storage, and each row's tokens, past length and block table),
// ONE Forward, sampling and stop checks for every sequence that computed its last known
// token, the scheduler's Update, events.
// start is when the step began, before Schedule planned it (StepInfo.Duration).
func (e *Engine) step(plan *scheduler.Plan, start time.Time) {
	items := plan.Items
	e.phases = StepInfo{Schedule: time.Since(start)}
	if cap(e.results) < len(items) {
		e.results = make([]scheduler.Result, len(items))
	}
	e.results = e.results[:len(items)]
	clear(e.results)

	err := e.copyBlocks(plan.Copies)
	if err == nil {
		e.timeDraft(items)
	}

	e.batch.Seqs = e.batch.Seqs[:0]
	e.draftToks = e.draftToks[:0]
	e.sampledToks = e.sampledToks[:0]
	e.groupBuf = e.groupBuf[:0]
	e.dequeue = e.dequeue[:0]
	numTokens := 0
	for _, it := range items {
		st := it.Seq.Data.(*seqState)
		if !st.req.admitted {
			st.req.admitted = true
			e.dequeue = append(e.dequeue, st.req)
		}
		toks := it.Tokens()
		if len(it.Draft) > 0 {
			// The row's last token and its proposals, in a buffer of the step's own (the
			// sequence's tokens must not grow in place).
			from := len(e.draftToks)
			e.draftToks = append(append(e.draftToks, toks...), it.Draft...)
			toks = e.draftToks[from:]
		}
		e.batch.Seqs = append(e.batch.Seqs, models.SeqInput{
			Tokens:      toks,
			PastLen:     it.StartPos,
			Blocks:      it.Blocks,
			GroupBlocks: e.groupTables(it.Seq.ID),
			AllLogits:   st.wantsPromptLogits(it) || len(it.Draft) > 0,
		})
		if row := &e.batch.Seqs[len(e.batch.Seqs)-1]; !row.AllLogits {
			row.ArgmaxOnly = !it.Sample || st.done || st.sampler.argmaxOnly()
		}
		numTokens += it.NumNewTokens + len(it.Draft)
		e.phases.PastTokens += it.StartPos
		e.phases.MaxPast = max(e.phases.MaxPast, it.StartPos)
		if np := it.Seq.NumPromptTokens(); it.StartPos < np && it.Seq.NumPreemptions() == 0 {
			e.counts.promptTokens += int64(min(it.StartPos+it.NumNewTokens, np) - it.StartPos)
		}
	}
	e.markAdmitted(e.dequeue)

	var out *models.Output
	if err == nil {
		fwdStart := time.Now()
		out, err = e.model.Forward(&e.batch)
		e.phases.Forward = time.Since(fwdStart)
		e.sched.ObserveStep(e.phases.Forward)
		if err == nil && (out == nil || len(out.Logits) != len(items)) {
			err = fmt.Errorf("forward returned %d logit rows for %d sequences", lenLogits(out), len(items))
		}
	}
	now := time.Now()
	if err != nil {
		// Every request with a sequence in the batch fails; the engine goes on.
		err = fmt.Errorf("%w: %w", ErrModel, err)
		for _, it := range items {
			if st := it.Seq.Data.(*seqState); !st.done {
				e.endRequest(st.req, FinishError, err)
			}
		}
		// Every item was aborted: nothing to apply, nothing finishes in the scheduler.
		e.endFinished(e.update(plan), now)
		e.stepFailed(err)
		e.finishStep(len(items), numTokens, start)
		return
	}
	e.stepSucceeded()

	emitStart := time.Now()
	e.presample(items, out)
	for i, it := range items {
		e.handleRow(i, it, out, now)
	}

	e.endFinished(e.update(plan), now)
	e.phases.Emit = time.Since(emitStart) - e.phases.Sample
	e.finishStep(len(items), numTokens, start)
}

// update hands the step's results to the scheduler and returns the sequences it finished.
// An error there is a bookkeeping bug (a commit the KV pool refused, a stale plan) that
// ends no request: it is logged and counted, and the sequences Update still reports
// finished are ended as usual.
func (e *Engine) update(plan *scheduler.Plan) []*scheduler.Sequence {
	finished, err := e.sched.Update(plan, e.results)
	if err != nil {
		e.counts.schedulerErrors++
		e.log.Error("engine: scheduler update failed", "err", err, "items", len(plan.Items),
			"errors", e.counts.schedulerErrors)
	}
	return finished
}

// endFinished ends the sequences the scheduler finished that the engine had not (the end
// of the context).
func (e *Engine) endFinished(finished []*scheduler.Sequence, now time.Time) {
	for _, q := range finished {
		if st := q.Data.(*seqState); !st.done {
			e.emit(st, Event{Text: st.stop.finish(), FinishReason: FinishLength}, now)
		}
	}
}

// handleRow takes item i's logits: the prompt logprobs they score, then, when the item
// computed its sequence's last known token, the next token. A panic here ends only this
// sequence's request (recoverRequest).
func (e *Engine) handleRow(i int, it scheduler.Item, out *models.Output, now time.Time) {
	st := it.Seq.Data.(*seqState)
	defer e.recoverRequest(st, i)
	row := out.Logits[i]
	if len(it.Draft) > 0 {
		e.verifyDraft(st, i, it, row, now)
		return
	}
	if e.batch.Seqs[i].AllLogits {
		e.collectPromptLogprobs(st, it, row)
		row = row[len(row)-e.spec.VocabSize:]
	}
	if !it.Sample || st.done {
		return
	}
	argmax := int32(-1) // none: sample from the row
	if row == nil && e.batch.Seqs[i].ArgmaxOnly && i < len(out.Argmax) {
		argmax = out.Argmax[i]
	}
	e.sampleOne(st, i, row, argmax, now)
}

// sampleOne picks sequence st's next token from its logits row (or takes argmax, the
// model's own, when it is not negative: models.SeqInput.ArgmaxOnly), runs the stop checks
// and emits the sequence's event. i is the sequence's plan item.
func (e *Engine) sampleOne(st *seqState, i int, row []float32, argmax int32, now time.Time) {
	t0 := time.Now()
	e.faults.sample(st.req.id)
	var s sampled
	if argmax >= 0 { // the model returned the argmax (models.SeqInput.ArgmaxOnly)
		s = sampled{ID: argmax, Logprob: float32(math.NaN())}
	} else if pre, ok := e.takePresampled(i); ok {
		s = pre
	} else {
		s = st.sampler.sample(row, &e.scratch)
	}
	e.emitToken(st, i, s, t0, now)
}

// emitToken records token s as sequence st's next (sampling having begun at t0), runs
// the stop checks and emits the sequence's event. i is the sequence's plan item.
func (e *Engine) emitToken(st *seqState, i int, s sampled, t0, now time.Time) {
	st.sampler.accept(s.ID)
	e.phases.Sample += time.Since(t0)
	st.numOut++
	e.counts.generationTokens++
	if st.firstToken.IsZero() {
		st.firstToken = now
	}
	if !math.IsNaN(float64(s.Logprob)) {
		st.cumLogprob += float64(s.Logprob)
	}
	text, finish := st.stop.add(s.ID)
	if s.Done && finish == "" {
		finish = FinishStop // the structured value is complete: nothing else may follow
		text += st.stop.finish()
	}
	ev := Event{TokenIDs: []int32{s.ID}, Text: text, FinishReason: finish}
	if st.req.params.Logprobs >= 0 {
		lp := TokenLogprob{ID: s.ID, Text: e.tokenText(s.ID), Logprob: s.Logprob}
		if len(s.Top) > 0 {
			lp.Top = make([]TopLogprob, len(s.Top))
			for j, t := range s.Top {
				lp.Top[j] = TopLogprob{ID: t.ID, Text: e.tokenText(t.ID), Logprob: t.Logprob}
			}
		}
		ev.Logprobs = []TokenLogprob{lp}
	}
	e.results[i] = scheduler.Result{Token: s.ID, Finished: finish != ""}
	e.emit(st, ev, now)
}

// verifyDraft samples a speculating row's tokens from its positions' logits one after
// another, as decoding would have sampled them one step at a time (the same sampler,
// penalties, stop checks and events, token by token): the logits of position j hold the
// distribution after the row's last token and proposals 0..j-1, so they are right for
// the sequence only while every earlier proposal was accepted. It stops after the first
// token that differs from its proposal, after the token that follows the last proposal,
// or where the sequence finishes.
//
// A proposal made for certain (prompt lookup's, a draft model's greedy one) is accepted
// when the token sampled there is that proposal: greedy rows accept the longest
// agreeing prefix and add the model's next token, and for sampled rows this is
// rejection sampling with a one-point draft distribution (accept a proposal with the
// model's probability of it, else take a sample of the model's distribution without
// it), so a seeded request's very tokens are those it gets without speculation. A
// proposal a draft model drew from its distribution q goes through
// sampler.verifyProposal's rejection sampling. Either way the output is distributed as
// the model's.
func (e *Engine) verifyDraft(st *seqState, i int, it scheduler.Item, logits []float32, now time.Time) {
	vocab := e.spec.VocabSize
	from := len(e.sampledToks) // the step's buffer: Update copies the tokens out
	for j := 0; j <= len(it.Draft) && !st.done; j++ {
		row := logits[j*vocab : (j+1)*vocab]
		var q []float32 // the draft's distribution of a drawn proposal
		if j < len(it.Draft) && e.drafter != nil {
			q = e.drafter.dist(i, j)
		}
		switch {
		case j < len(it.Draft) && e.faults.accept(it.Draft[j], row):
			e.sampleOne(st, i, row, it.Draft[j], now)
		case q != nil:
			t0 := time.Now()
			e.faults.sample(st.req.id)
			s, _ := st.sampler.verifyProposal(row, it.Draft[j], q, &e.scratch)
			e.emitToken(st, i, s, t0, now)
		default:
			e.sampleOne(st, i, row, -1, now)
		}
		tok := e.results[i].Token
		e.sampledToks = append(e.sampledToks, tok)
		if e.results[i].Finished || j == len(it.Draft) || tok != it.Draft[j] {
			break
		}
	}
	e.results[i].Tokens = e.sampledToks[from:]
}

// wantsPromptLogits reports whether item it must return the logits of every position:
// the request wants prompt logprobs and this pass computes prompt positions not yet
// scored.
func (st *seqState) wantsPromptLogits(it scheduler.Item) bool {
	r := st.req
	return st.index == 0 && r.promptLP != nil && len(r.promptLP) < len(r.prompt) && it.StartPos < len(r.prompt)-1
}

// collectPromptLogprobs scores the prompt tokens predicted by the rows of an AllLogits
// pass: row j (position StartPos+j) predicts the token at StartPos+j+1.
func (e *Engine) collectPromptLogprobs(st *seqState, it scheduler.Item, logits []float32) {
	r := st.req
	vocab := e.spec.VocabSize
	k := r.params.PromptLogprobs
	for j := range it.NumNewTokens {
		next := it.StartPos + j + 1
		if next >= len(r.prompt) {
			break
		}
		if next != len(r.promptLP) {
			continue // scored before (a recomputation after preemption)
		}
		row := logits[j*vocab : (j+1)*vocab]
		lse := float32(logSumExp(row))
		tok := r.prompt[next]
		lp := TokenLogprob{ID: tok, Text: e.tokenText(tok), Logprob: row[tok] - lse}
		if k > 0 {
			top := topK(row, k, &e.scratch)
			lp.Top = make([]TopLogprob, len(top))
			for t, id := range top {
				lp.Top[t] = TopLogprob{ID: id, Text: e.tokenText(id), Logprob: row[id] - lse}
			}
		}
		r.promptLP = append(r.promptLP, lp)
	}
}

func lenLogits(out *models.Output) int {
	if out == nil {
		return 0
	}
	return len(out.Logits)
}

// finishStep records a step in the counters, publishes Stats and calls OnStep. start is
// when the step began, before Schedule: the duration covers scheduling, the KV copies,
// gather, forward and scatter, sampling, the scheduler's Update and the events.
func (e *Engine) finishStep(numSeqs, numTokens int, start time.Time) {
	d := time.Since(start)
	c := &e.counts
	c.steps++
	c.fedTokens += int64(numTokens)
	c.batchSizes = appendBounded(c.batchSizes, numSeqs)
	c.stepTokens = appendBounded(c.stepTokens, numTokens)
	c.stepDurations = appendBounded(c.stepDurations, d)
	e.publishStats()
	if e.cfg.OnStep != nil {
		info := e.phases
		info.NumSeqs, info.NumTokens, info.Duration = numSeqs, numTokens, d
		e.cfg.OnStep(info)
	}
}

func appendBounded[T any](s []T, v T) []T {
	if len(s) == recentSteps {
		copy(s, s[1:])
		s = s[:recentSteps-1]
	}
	return append(s, v)
}

// publishStats refreshes the snapshot Stats returns.
func (e *Engine) publishStats() {
	ss := e.sched.Stats()
	ps := e.pool.Stats()
	c := &e.counts
	e.statsMu.Lock()
	s := &e.stats
	s.Running, s.Waiting = ss.Running, ss.Waiting
	s.KVTotalBlocks, s.KVFreeBlocks, s.KVCachedBlocks = ps.TotalBlocks, ps.FreeBlocks, ps.CachedBlocks
	s.KVUsage = ps.UsedFraction
	s.BlockSizeTokens = e.blockSize
	s.Preemptions = ss.Preemptions
	s.SchedulerErrors = c.schedulerErrors
	s.PrefixQueryTokens, s.PrefixHitTokens = ps.PrefixQueriesTokens, ps.PrefixHitsTokens
	s.PromptTokens, s.GenerationTokens = c.promptTokens, c.generationTokens
	s.Steps = c.steps
	s.FedTokens = c.fedTokens
	s.RecentBatchSizes = append(s.RecentBatchSizes[:0], c.batchSizes...)
	s.RecentStepTokens = append(s.RecentStepTokens[:0], c.stepTokens...)
	s.RecentStepDurations = append(s.RecentStepDurations[:0], c.stepDurations...)
	s.DroppedEvents = c.droppedEvents
	s.Unhealthy = e.unhealthy
	s.FailedSteps, s.RunnerRestarts, s.RecoveredPanics = c.failedSteps, c.restarts, c.panics
	s.SpecDrafts, s.SpecDraftTokens, s.SpecAcceptedTokens = ss.Drafts, ss.DraftTokens, ss.AcceptedTokens
	s.SpecAcceptedAt = append(s.SpecAcceptedAt[:0], ss.AcceptedAt...)
	e.statsMu.Unlock()
}

// groupTables returns seq's block tables of layer groups 1, 2, ... (nil with one group),
// in e.groupBuf, which the step's batch reuses.
func (e *Engine) groupTables(seq kvcache.SeqID) [][]kvcache.BlockID {
	if e.pool.NumGroups() == 1 {
		return nil
	}
	start := len(e.groupBuf)
	e.groupBuf = e.pool.AppendGroupTables(e.groupBuf, seq, 1)
	return e.groupBuf[start:len(e.groupBuf):len(e.groupBuf)]
}

// copyBlocks applies the plan's block copies (copy-on-write of a shared partial block),
// in the host storage or, for a cache on the model's device, there.
func (e *Engine) copyBlocks(ops []kvcache.CopyOp) error {
	if len(ops) == 0 {
		return nil
	}
	if e.copier != nil {
		if err := e.copier.CopyBlocks(ops); err != nil {
			return fmt.Errorf("copy KV blocks on the device: %w", err)
		}
		return nil
	}
	for _, c := range ops {
		if err := e.storage.CopyBlock(c.Src, c.Dst); err != nil {
			return fmt.Errorf("copy KV block %d to %d: %w", c.Src, c.Dst, err)
		}
	}
	return nil
}
