package engine

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/conveyor-llm/conveyor/scheduler"
)

// request is the engine's state of one submitted Request.
type request struct {
	id      string
	params  SamplingParams
	prompt  []int32
	ch      chan Event
	arrival time.Time
	bestOf  bool // generate BestOf sequences, return the N best at the end

	// Set under Engine.mu.
	stopWatch func() bool // stops the context watch
	accepted  bool
	ended     bool
	queued    bool // counted in Engine.queued (not yet admitted)
	fit       bool // accepted into free batch slots: counted in Engine.queuedFit
	running   bool // admitted: nseq counted in Engine.runningSeqs
	nseq      int  // sequences the request runs (max of n and best_of)

	// Owned by the engine goroutine.
	admitted bool // some sequence was scheduled (no longer counted against MaxQueue)
	seqs     []*seqState
	live     int            // sequences not finished
	promptLP []TokenLogprob // prompt logprobs so far; nil unless requested
	pending  []*Event       // per sequence: events merged while the channel was full
	reserve  int            // channel slots kept free for the final events still to come
}

// eventBuffer is how many non-final events a request's channel holds before a slow
// reader's events are merged.
const eventBuffer = 64

// seqState is the engine's state of one sequence of a request.
type seqState struct {
	req        *request
	index      int
	seq        scheduler.Sequence
	sampler    *sampler
	stop       *stopChecker
	numOut     int
	cumLogprob float64
	firstToken time.Time
	done       bool
	sentFirst  bool
	result     Event // best_of: everything the sequence produced, merged
}

// takeInbox moves newly submitted requests into the scheduler and applies aborts. It
// returns the shutdown flags.
func (e *Engine) takeInbox() (draining, stopNow bool) {
	e.mu.Lock()
	inbox, aborts := e.inbox, e.aborts
	e.inbox, e.aborts = nil, nil
	draining, stopNow = e.draining, e.stopNow
	e.mu.Unlock()
	for _, r := range inbox {
		e.addRequest(r)
	}
	for _, r := range aborts {
		if _, ok := e.live[r]; ok {
			e.endRequest(r, FinishAbort, nil)
		}
	}
	return draining, stopNow
}

// addRequest creates r's sequences and queues them in the scheduler.
func (e *Engine) addRequest(r *request) {
	p := &r.params
	nseq := p.BestOf
	r.seqs = make([]*seqState, nseq)
	group := make([]*scheduler.Sequence, nseq)
	var prefixKey uint64
	if p.PromptLogprobs >= 0 {
		// Prompt logprobs need the logits of every prompt position: a key of its own keeps
		// the prefix cache from serving any of them.
		prefixKey = 1<<63 | uint64(e.nextSeq)
		r.promptLP = make([]TokenLogprob, 1, len(r.prompt))
		r.promptLP[0] = TokenLogprob{ID: r.prompt[0], Text: e.tokenText(r.prompt[0]), Logprob: float32(math.NaN())}
	}
	for i := range nseq {
		st := &seqState{req: r, index: i}
		st.seq = scheduler.Sequence{
			ID:          e.nextSeq,
			Tokens:      append(make([]int32, 0, len(r.prompt)+p.MaxTokens), r.prompt...),
			PrefixKey:   prefixKey,
			ArrivalTime: r.arrival,
			Data:        st,
			// Speculative decoding samples a row's tokens one after another from several
			// positions' logits, as decoding would; a grammar's rows do not speculate (their
			// proposals are not checked against the grammar).
			Speculate: p.Constraint == nil && p.LazyConstraint == nil,
		}
		e.nextSeq++
		st.sampler = newSampler(p, r.prompt, e.eos, i)
		var stream textStream
		if e.text != nil {
			stream = e.text.newStream(r.prompt, p.KeepSpecialTokens)
		}
		st.stop = newStopChecker(p, e.eos, stream)
		r.seqs[i] = st
		group[i] = &st.seq
	}
	r.live = nseq
	e.live[r] = struct{}{}
	if err := e.sched.AddGroup(group); err != nil {
		switch {
		case errors.Is(err, scheduler.ErrTooLong):
			err = fmt.Errorf("%w: %w", ErrPromptTooLong, err)
		case errors.Is(err, scheduler.ErrQueueFull):
			err = fmt.Errorf("%w: %w", ErrOverloaded, err)
		default:
			err = fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		e.endRequest(r, FinishError, err)
	}
}

func (e *Engine) tokenText(id int32) string {
	if e.text == nil {
		return ""
	}
	return e.text.tokenText(id)
}

// endRequest ends every unfinished sequence of r with reason (abort or error).
func (e *Engine) endRequest(r *request, reason FinishReason, err error) {
	now := time.Now()
	for _, st := range r.seqs {
		if st.done {
			continue
		}
		e.sched.Abort(st.seq.ID)
		e.emit(st, Event{FinishReason: reason, Err: err}, now)
	}
}

// abortAll aborts every live request and refuses new ones.
func (e *Engine) abortAll() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.takeInbox() // requests that arrived before closed was set
	for r := range e.live {
		e.endRequest(r, FinishAbort, nil)
	}
}

// failNoCapacity ends sequences that cannot fit the KV cache even alone: they stop with
// FinishLength, like a sequence that reached the end of the context.
func (e *Engine) failNoCapacity(failed []*scheduler.Sequence) {
	now := time.Now()
	for _, q := range failed {
		st := q.Data.(*seqState)
		if !st.done {
			e.emit(st, Event{Text: st.stop.finish(), FinishReason: FinishLength}, now)
		}
	}
}

// emit completes ev for sequence st and delivers it (or, for best_of, keeps it until
// the request ends). An event with a FinishReason ends the sequence; the request's last
// event carries Usage and closes the channel.
func (e *Engine) emit(st *seqState, ev Event, now time.Time) {
	r := st.req
	ev.Index = st.index
	ev.CumulativeLogprob = st.cumLogprob
	if !st.sentFirst && r.promptLP != nil && len(r.promptLP) == len(r.prompt) {
		ev.PromptLogprobs = r.promptLP
		st.sentFirst = true
	}
	if ev.FinishReason != "" {
		st.done = true
		r.live--
		ev.Timings.Finished = now
	}
	ev.Timings.Arrival = r.arrival
	ev.Timings.Scheduled = st.seq.FirstScheduled()
	ev.Timings.FirstToken = st.firstToken

	if r.bestOf {
		mergeEvent(&st.result, ev)
		if r.live == 0 {
			e.emitBest(r)
			e.finishRequest(r)
		}
		return
	}
	if r.live == 0 {
		ev.Usage = e.usage(r)
	}
	e.send(r, ev)
	if r.live == 0 {
		e.finishRequest(r)
	}
}

// mergeEvent appends ev to acc.
func mergeEvent(acc *Event, ev Event) {
	acc.Index = ev.Index
	acc.TokenIDs = append(acc.TokenIDs, ev.TokenIDs...)
	acc.Text += ev.Text
	acc.Logprobs = append(acc.Logprobs, ev.Logprobs...)
	if ev.PromptLogprobs != nil {
		acc.PromptLogprobs = ev.PromptLogprobs
	}
	acc.FinishReason = ev.FinishReason
	acc.CumulativeLogprob = ev.CumulativeLogprob
	acc.Timings = ev.Timings
	acc.Err = ev.Err
}

// emitBest sends the N sequences of a best_of request with the highest cumulative
// logprob, best first, as indexes 0..N-1.
func (e *Engine) emitBest(r *request) {
	order := slices.Clone(r.seqs)
	sort.SliceStable(order, func(i, j int) bool {
		return order[i].result.CumulativeLogprob > order[j].result.CumulativeLogprob
	})
	usage := e.usage(r)
	for i, st := range order[:r.params.N] {
		ev := st.result
		ev.Index = i
		if ev.PromptLogprobs == nil && r.promptLP != nil && len(r.promptLP) == len(r.prompt) {
			ev.PromptLogprobs = r.promptLP
		}
		if i == r.params.N-1 {
			ev.Usage = usage
		}
		e.send(r, ev)
	}
}

func (e *Engine) usage(r *request) *Usage {
	u := &Usage{PromptTokens: len(r.prompt)}
	for _, st := range r.seqs {
		u.CompletionTokens += st.numOut
	}
	u.CachedTokens = r.seqs[0].seq.NumCachedPromptTokens()
	return u
}

// send delivers ev without blocking. Events of a sequence stay in order: one that finds
// an earlier event of its sequence waiting is merged behind it. A non-final event that
// would take a slot reserved for final events waits, merged with the sequence's later
// events, until the sequence's next event finds room; a final event always has its
// reserved slot. A full channel is therefore a bug, counted rather than allowed to stall
// the engine.
func (e *Engine) send(r *request, ev Event) {
	if i := ev.Index; i < len(r.pending) && r.pending[i] != nil {
		acc := r.pending[i]
		r.pending[i] = nil
		mergeEvent(acc, ev)
		acc.Usage = ev.Usage
		ev = *acc
	}
	final := ev.FinishReason != ""
	if !final && cap(r.ch)-len(r.ch) <= r.reserve {
		if r.pending == nil {
			r.pending = make([]*Event, max(r.params.N, r.params.BestOf))
		}
		if ev.Index >= 0 && ev.Index < len(r.pending) {
			r.pending[ev.Index] = &ev
			return
		}
	}
	select {
	case r.ch <- ev:
		if final {
			r.reserve--
		}
	default:
		e.counts.droppedEvents++
	}
}

// finishRequest forgets r and closes its channel, in that order: a client that sees the
// channel close may submit the same request id again at once.
func (e *Engine) finishRequest(r *request) {
	delete(e.live, r)
	e.mu.Lock()
	r.ended = true
	if r.id != "" && e.ids[r.id] == r {
		delete(e.ids, r.id)
	}
	e.unqueueLocked(r)
	if r.running {
		r.running = false
		e.runningSeqs -= r.nseq
	}
	stop := r.stopWatch
	e.mu.Unlock()
	if stop != nil {
		stop()
	}
	close(r.ch)
}

// markAdmitted stops counting admitted requests against MaxQueue.
func (e *Engine) markAdmitted(rs []*request) {
	if len(rs) == 0 {
		return
	}
	e.mu.Lock()
	for _, r := range rs {
		if r.queued && !r.ended {
			e.unqueueLocked(r)
			r.running = true
			e.runningSeqs += r.nseq
		}
	}
	e.mu.Unlock()
}

// unqueueLocked stops counting r as queued. Called with mu held.
func (e *Engine) unqueueLocked(r *request) {
	if !r.queued {
		return
	}
	r.queued = false
	e.queued--
	e.queuedSeqs -= r.nseq
	if r.fit {
		r.fit = false
		e.queuedFit--
	}
}
