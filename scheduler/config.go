package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Returned errors wrap one of these; test with errors.Is.
var (
	// ErrQueueFull means the waiting queue already holds Config.MaxQueue requests.
	ErrQueueFull = errors.New("scheduler: waiting queue full")
	// ErrTooLong means a prompt is longer than Config.MaxModelLen tokens or needs more KV
	// blocks than the whole pool has.
	ErrTooLong = errors.New("scheduler: prompt too long")
	// ErrInvalid means an argument is out of range: a bad configuration, an empty prompt, a
	// duplicate sequence id, a stale plan or results that do not match the plan.
	ErrInvalid = errors.New("scheduler: invalid argument")
)

// Policy is the admission policy: which waiting sequences may join the running batch.
// Everything else (token budget, chunked prefill, prefix caching, preemption) is shared.
type Policy int

// Policies.
const (
	// Continuous admits waiting sequences at every step, in arrival order, while the
	// sequence cap, the token budget and free KV blocks allow (iteration-level batching).
	Continuous Policy = iota
	// Static forms a batch when MaxBatchSize sequences wait or the oldest has waited
	// MaxBatchDelay; the batch runs until its last sequence finishes, and only then does the
	// next batch form. Finished sequences leave their slot idle.
	Static
	// Sequential runs one request (all n sequences of it) at a time.
	Sequential
)

// String returns the policy's name as ParsePolicy accepts it.
func (p Policy) String() string {
	switch p {
	case Continuous:
		return "continuous"
	case Static:
		return "static"
	case Sequential:
		return "sequential"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ParsePolicy parses "continuous", "static" or "sequential" (case-insensitive).
func ParsePolicy(s string) (Policy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "continuous":
		return Continuous, nil
	case "static":
		return Static, nil
	case "sequential":
		return Sequential, nil
	}
	return 0, fmt.Errorf("%w: unknown policy %q (want continuous, static or sequential)", ErrInvalid, s)
}

// Config configures a Scheduler.
type Config struct {
	Policy Policy
	// MaxNumSeqs caps the sequences in the running batch (children of an n > 1 request
	// waiting for their fork count too).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the per-step token budget: new tokens fed to the model in one
	// forward pass, summed over the batch. It must be >= MaxNumSeqs so that every running
	// sequence can decode in every step.
	MaxNumBatchedTokens int
	// MaxModelLen is the model's context in tokens. A prompt may hold at most MaxModelLen
	// tokens; a sequence ends (FinishLength) once it holds MaxModelLen tokens or more, so no
	// position >= MaxModelLen is ever computed.
	MaxModelLen int
	// MaxBatchSize is the static batch size in sequences (Static only).
	MaxBatchSize int
	// MaxBatchDelay is how long the oldest waiting request waits for a static batch to fill
	// before a smaller batch forms (Static only).
	MaxBatchDelay time.Duration
	// MaxQueue caps the waiting requests Add accepts. Preempted sequences return to the
	// queue whatever its length.
	MaxQueue int
	// EnableChunkedPrefill lets a prompt be computed over several steps in chunks that fit
	// the token budget. When false, a prompt is admitted only when all of it fits the step's
	// remaining budget, and MaxNumBatchedTokens must be >= MaxModelLen.
	EnableChunkedPrefill bool
	// TargetStepTime bounds a step's duration while sequences are decoding (Continuous
	// only): prompt chunks are sized from a cost model learned online from measured steps
	// (ObserveStep) so that the step's predicted time stays within the target, and every
	// decoding stream's inter-token latency with it. 0 means auto: AutoStepTimeFactor times the
	// predicted time of the step's decode rows alone, at least MinAutoStepTime. A negative value turns the
	// bound off. With nothing decoding, prompts are prefilled as fast as the token budget
	// allows whatever the target.
	TargetStepTime time.Duration
	// EnablePrefixCaching looks up each admitted sequence's prefix in the pool's prefix cache
	// so cached tokens are not recomputed. The pool must be built with prefix caching too.
	EnablePrefixCaching bool
	// Speculation, when on, has decoding sequences that allow it (Sequence.Speculate)
	// propose tokens verified in the same step (speculative decoding, speculate.go).
	// Proposals count in MaxNumBatchedTokens.
	Speculation Speculation
}

// DefaultConfig returns continuous batching with 256 sequences, a 2048-token step budget,
// a 2048-token context, chunked prefill and prefix caching; static batches of 8 with a
// 50 ms delay; and a queue of 1024 requests.
func DefaultConfig() Config {
	return Config{
		Policy:               Continuous,
		MaxNumSeqs:           256,
		MaxNumBatchedTokens:  2048,
		MaxModelLen:          2048,
		MaxBatchSize:         8,
		MaxBatchDelay:        50 * time.Millisecond,
		MaxQueue:             1024,
		EnableChunkedPrefill: true,
		EnablePrefixCaching:  true,
	}
}

// AutoStepTimeFactor is the auto step-time target in decode steps: a step carrying prompt
// work may take this many times what its decode rows alone take. Measured on a 2-core EPYC,
// 50M config, a closed loop of 32 streams of 128 → 128 tokens: at 3 a decoding stream's
// slowest tokens (p99) came 3.1-3.2× its typical ones; at 2, 2.05×, with the same throughput
// and median time to first token (the slowest first tokens come about a third later).
const AutoStepTimeFactor = 2

// MinAutoStepTime is the smallest step-time target the auto setting picks, so that tiny
// models still prefill in chunks large enough to keep the matrix kernels efficient.
const MinAutoStepTime = 20 * time.Millisecond

// minPrefillChunkTokens is the prompt work every step may do whatever the target, so
// that prompts always progress.
const minPrefillChunkTokens = 16

// coldPrefillChunkTokens bounds the prompt tokens of a step with decoding rows before
// the step-cost model is ready (its first minCostObservations steps), and is the least
// the model's trusted range allows after.
const coldPrefillChunkTokens = 64

// Validate reports whether the configuration can build a scheduler.
func (c Config) Validate() error {
	switch {
	case c.Policy != Continuous && c.Policy != Static && c.Policy != Sequential:
		return fmt.Errorf("%w: unknown policy %d", ErrInvalid, int(c.Policy))
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("%w: MaxNumSeqs %d must be >= 1", ErrInvalid, c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < c.MaxNumSeqs:
		return fmt.Errorf("%w: MaxNumBatchedTokens %d must be >= MaxNumSeqs %d", ErrInvalid,
			c.MaxNumBatchedTokens, c.MaxNumSeqs)
	case c.MaxModelLen < 1:
		return fmt.Errorf("%w: MaxModelLen %d must be >= 1", ErrInvalid, c.MaxModelLen)
	case !c.EnableChunkedPrefill && c.MaxNumBatchedTokens < c.MaxModelLen:
		return fmt.Errorf("%w: without chunked prefill MaxNumBatchedTokens %d must be >= MaxModelLen %d",
			ErrInvalid, c.MaxNumBatchedTokens, c.MaxModelLen)
	case c.MaxQueue < 1:
		return fmt.Errorf("%w: MaxQueue %d must be >= 1", ErrInvalid, c.MaxQueue)
	}
	if err := c.Speculation.validate(); err != nil {
		return err
	}
	if c.Policy == Static {
		if c.MaxBatchSize < 1 || c.MaxBatchSize > c.MaxNumSeqs {
			return fmt.Errorf("%w: MaxBatchSize %d must be in [1, MaxNumSeqs %d]", ErrInvalid,
				c.MaxBatchSize, c.MaxNumSeqs)
		}
		if c.MaxBatchDelay < 0 {
			return fmt.Errorf("%w: MaxBatchDelay %v must be >= 0", ErrInvalid, c.MaxBatchDelay)
		}
	}
	return nil
}

// clock tells the time. The scheduler reads it to time arrivals, admissions and static
// batch delays.
type clock interface {
	Now() time.Time
}

// systemClock is the wall clock.
type systemClock struct{}

// Now returns time.Now().
func (systemClock) Now() time.Time { return time.Now() }
