package scheduler

import (
	"fmt"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// Status is where a sequence is in its life.
type Status int

// Statuses.
const (
	// StatusWaiting: in the waiting queue (new, preempted, or a child of an n > 1 request
	// whose parent is waiting). It holds no KV blocks.
	StatusWaiting Status = iota
	// StatusRunning: admitted into the running batch; it holds KV blocks for its computed
	// tokens (a child waiting for its fork holds a batch slot but no blocks yet).
	StatusRunning
	// StatusFinished: done; its blocks are back in the pool and the scheduler forgot it.
	StatusFinished
)

// String returns "waiting", "running" or "finished".
func (s Status) String() string {
	switch s {
	case StatusWaiting:
		return "waiting"
	case StatusRunning:
		return "running"
	case StatusFinished:
		return "finished"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// FinishReason tells who ended a sequence.
type FinishReason int

// Finish reasons.
const (
	// FinishNone: the sequence has not finished.
	FinishNone FinishReason = iota
	// FinishEngine: Update was told the sequence is done (eos, stop, max tokens: the engine
	// knows which).
	FinishEngine
	// FinishAborted: Abort was called.
	FinishAborted
	// FinishLength: the sequence reached Config.MaxModelLen tokens.
	FinishLength
	// FinishNoCapacity: the sequence needs more KV blocks than the whole pool can give it,
	// even with every other sequence out of the way. It is reported in Plan.Failed; the
	// engine usually reports it as a "length" finish.
	FinishNoCapacity
)

// String returns the reason's name.
func (r FinishReason) String() string {
	switch r {
	case FinishNone:
		return "none"
	case FinishEngine:
		return "engine"
	case FinishAborted:
		return "aborted"
	case FinishLength:
		return "length"
	case FinishNoCapacity:
		return "no-capacity"
	}
	return fmt.Sprintf("FinishReason(%d)", int(r))
}

// Sequence is one token sequence the scheduler runs: a prompt and the tokens generated
// after it. The caller sets ID, Tokens and optionally PrefixKey, ArrivalTime and Data before
// Add; from then on the scheduler owns the sequence, and the caller only reads it (the
// methods report the scheduler's bookkeeping) until it is finished.
type Sequence struct {
	// ID identifies the sequence here and in the KV pool; unique among live sequences.
	ID kvcache.SeqID
	// Tokens holds the prompt followed by the generated tokens. Update appends each sampled
	// token. The caller must not modify it after Add.
	Tokens []int32
	// PrefixKey salts the prefix-cache hashes (for example an adapter or model id); sequences
	// share cached blocks only when their keys are equal.
	PrefixKey uint64
	// ArrivalTime is when the request arrived; Add sets it from the clock when it is zero.
	ArrivalTime time.Time
	// Data is the caller's own per-sequence state; the scheduler never touches it.
	Data any
	// Speculate lets the sequence propose tokens when Config.Speculation is on: the caller
	// sets it for sequences whose tokens it can sample one after another from several
	// positions' logits (not, for example, under a grammar).
	Speculate bool

	status         Status
	finish         FinishReason
	numPrompt      int // tokens in the prompt
	numComputed    int // tokens whose K/V are in the sequence's blocks
	numPreemptions int
	numCachedTok   int       // prompt tokens served by the prefix cache at first admission
	admitted       bool      // admitted at least once
	firstScheduled time.Time // first admission
	enqueued       time.Time // last entry into the waiting queue (static batch delay)
	parent         *Sequence // the request's first sequence, for children of an n > 1 request
	awaiting       []*Sequence
	batch          uint64 // static batch the sequence belongs to; 0 = none
}

// Status returns where the sequence is in its life.
func (s *Sequence) Status() Status { return s.status }

// FinishReason returns why the sequence finished (FinishNone while it is live).
func (s *Sequence) FinishReason() FinishReason { return s.finish }

// NumPromptTokens returns the prompt's length in tokens.
func (s *Sequence) NumPromptTokens() int { return s.numPrompt }

// NumGenerated returns the number of tokens generated so far.
func (s *Sequence) NumGenerated() int { return len(s.Tokens) - s.numPrompt }

// NumComputed returns the number of tokens whose K/V are in the sequence's KV blocks
// (computed or served by the prefix cache). Preemption resets it to 0.
func (s *Sequence) NumComputed() int { return s.numComputed }

// NumPreemptions returns how many times the sequence was preempted.
func (s *Sequence) NumPreemptions() int { return s.numPreemptions }

// NumCachedPromptTokens returns the prompt tokens the prefix cache (or a fork from the
// request's first sequence) served when the sequence was first admitted.
func (s *Sequence) NumCachedPromptTokens() int { return s.numCachedTok }

// FirstScheduled returns when the sequence was first admitted into the running batch
// (zero before that).
func (s *Sequence) FirstScheduled() time.Time { return s.firstScheduled }

// seqQueue is a FIFO of sequences with cheap pops at the front and rare middle edits.
type seqQueue struct {
	buf  []*Sequence
	head int
}

func (q *seqQueue) len() int { return len(q.buf) - q.head }

func (q *seqQueue) at(i int) *Sequence { return q.buf[q.head+i] }

func (q *seqQueue) front() *Sequence { return q.buf[q.head] }

func (q *seqQueue) pushBack(s *Sequence) {
	if q.head > 0 && q.head >= len(q.buf)/2 {
		n := copy(q.buf, q.buf[q.head:])
		clear(q.buf[n:])
		q.buf = q.buf[:n]
		q.head = 0
	}
	q.buf = append(q.buf, s)
}

func (q *seqQueue) popFront() *Sequence {
	s := q.buf[q.head]
	q.buf[q.head] = nil
	q.head++
	if q.head == len(q.buf) {
		q.buf = q.buf[:0]
		q.head = 0
	}
	return s
}

// insert puts ss before position i (0 = the front), keeping their order.
func (q *seqQueue) insert(i int, ss ...*Sequence) {
	if len(ss) == 0 {
		return
	}
	if i == 0 && q.head >= len(ss) {
		q.head -= len(ss)
		copy(q.buf[q.head:], ss)
		return
	}
	at := q.head + i
	q.buf = append(q.buf, ss...) // grow
	copy(q.buf[at+len(ss):], q.buf[at:len(q.buf)-len(ss)])
	copy(q.buf[at:], ss)
}

// index returns the position of s in the queue, or -1.
func (q *seqQueue) index(s *Sequence) int {
	for i := q.head; i < len(q.buf); i++ {
		if q.buf[i] == s {
			return i - q.head
		}
	}
	return -1
}

// remove deletes position i.
func (q *seqQueue) remove(i int) {
	at := q.head + i
	copy(q.buf[at:], q.buf[at+1:])
	q.buf[len(q.buf)-1] = nil
	q.buf = q.buf[:len(q.buf)-1]
	if q.head == len(q.buf) {
		q.buf = q.buf[:0]
		q.head = 0
	}
}
