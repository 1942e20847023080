package engine

import (
	"fmt"
	"log/slog"
	"math"

	"github.com/conveyor-llm/conveyor/scheduler"
)

// Policy is the batching policy (see package scheduler): which waiting requests may join
// the running batch.
type Policy = scheduler.Policy

// Batching policies.
const (
	// PolicyContinuous re-forms the batch at every step (iteration-level batching).
	PolicyContinuous = scheduler.Continuous
	// PolicyStatic forms a batch of MaxBatchSize requests (or whatever waited MaxBatchDelay)
	// and runs it until its last sequence finishes.
	PolicyStatic = scheduler.Static
	// PolicySequential runs one request at a time.
	PolicySequential = scheduler.Sequential
)

// ParsePolicy parses "continuous", "static" or "sequential".
func ParsePolicy(s string) (Policy, error) { return scheduler.ParsePolicy(s) }

// SchedulerConfig is the scheduler's configuration as the engine takes it (see Config).
type SchedulerConfig = scheduler.Config

// Config configures an Engine.
type Config struct {
	// SchedulerConfig is the batching configuration, handed to the scheduler (its fields
	// are promoted: cfg.MaxNumSeqs, cfg.Policy, ...). The engine reads three of them its own
	// way:
	//   - MaxModelLen caps a sequence's length in tokens (prompt + generated); 0 means the
	//     model's context (Spec.MaxPositions); a larger value is refused, as vLLM refuses it.
	//   - MaxQueue caps the requests accepted that wait for a batch slot; Submit returns
	//     ErrOverloaded beyond it. Under PolicyContinuous a request that fits in the free
	//     slots (MaxNumSeqs) does not wait and is not counted. (The scheduler's own queue
	//     gets room for what the engine lets through.)
	//   - MaxBatchSize and MaxBatchDelay apply to PolicyStatic only.
	// TargetStepTime bounds each step's duration while sequences decode (0 = auto, negative
	// = off), and EnableChunkedPrefill (on by default) lets long prompts be prefilled in
	// chunks under MaxNumBatchedTokens; see scheduler.Config.
	SchedulerConfig
	// KVCacheBytes is the memory budget of the paged KV cache (keys and values of every
	// layer); the pool gets as many blocks as fit.
	KVCacheBytes int64
	// BlockSizeTokens is the number of tokens per KV block; 0 = the model's default
	// (models.Spec.BlockSize: 16 tokens, or the smallest its attention takes when larger).
	// A size the model's attention cannot take is refused.
	BlockSizeTokens int
	// StorageParallelism is the number of goroutines the KV gather/scatter may use;
	// 0 = GOMAXPROCS.
	StorageParallelism int
	// Logger receives the engine's own error reports (errors that end no request, such as
	// a scheduler bookkeeping error); nil = slog.Default().
	Logger *slog.Logger
	// OnStep, when set, is called on the engine goroutine after every forward pass. It
	// must return quickly.
	OnStep func(StepInfo)
	// MaxStepFailures is how many forward passes in a row may fail before the engine
	// reports itself unhealthy (Stats.Unhealthy) and restarts its runner through
	// ReopenModel; 0 means DefaultMaxStepFailures. A single failed pass only fails the
	// requests in it.
	MaxStepFailures int
	// ReopenModel, when set, opens a fresh runner for the same model; the engine calls it
	// on its own goroutine after MaxStepFailures failed passes in a row and serves on with
	// what it returns (its Spec must match the first model's: the KV cache is kept). The
	// engine closes the model it replaces, so Close must be safe to call twice
	// (models.DenseRunner's is), and closes a model it reopened when its loop stops. Nil: the
	// engine reports itself unhealthy and keeps the model it has.
	ReopenModel func() (Model, error)
	// DraftModel, with Speculation.External, proposes the tokens of speculative decoding
	// (the draft_model method): a smaller model with the same vocabulary, run before each
	// step over the speculating rows with a KV cache of its own (Speculation.MaxBatch
	// sequences of the full context, never more tokens than the model's cache; see
	// draft.go).
	// The engine does not close it.
	DraftModel Model
}

// DefaultMaxStepFailures is Config.MaxStepFailures when it is 0.
const DefaultMaxStepFailures = 3

// DefaultConfig returns the scheduler's defaults (scheduler.DefaultConfig: continuous
// batching of up to 256 sequences with a 2048-token step budget and chunked prefill, static
// batches of 8 with a 50 ms delay, a queue of 1024 requests, prefix caching) with the
// model's whole context, and a 1 GiB KV cache in blocks of the model's default size.
func DefaultConfig() Config {
	sc := scheduler.DefaultConfig()
	sc.MaxModelLen = 0 // the model's context
	return Config{
		SchedulerConfig: sc,
		KVCacheBytes:    1 << 30,
	}
}

// Validate reports whether the configuration is usable (independently of the model). The
// batching fields are checked by scheduler.Config.Validate; New checks them again with the
// model's context.
func (c Config) Validate() error {
	switch {
	case c.KVCacheBytes <= 0:
		return fmt.Errorf("%w: KVCacheBytes %d must be > 0", ErrInvalidConfig, c.KVCacheBytes)
	case c.BlockSizeTokens < 0 || c.BlockSizeTokens > 1<<16:
		return fmt.Errorf("%w: BlockSizeTokens %d must be in [1, 65536] (0: the model's default)", ErrInvalidConfig, c.BlockSizeTokens)
	case c.MaxModelLen < 0:
		return fmt.Errorf("%w: MaxModelLen %d must be >= 0", ErrInvalidConfig, c.MaxModelLen)
	case c.StorageParallelism < 0:
		return fmt.Errorf("%w: StorageParallelism %d must be >= 0", ErrInvalidConfig, c.StorageParallelism)
	case c.MaxStepFailures < 0:
		return fmt.Errorf("%w: MaxStepFailures %d must be >= 0", ErrInvalidConfig, c.MaxStepFailures)
	}
	// The model's context is not known yet: check the rest with the smallest context
	// that makes sense (1 token) when MaxModelLen is 0.
	if err := c.schedulerConfig(max(c.MaxModelLen, 1)).Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// schedulerConfig returns the scheduler's configuration for a model context of maxLen tokens.
func (c Config) schedulerConfig(maxLen int) scheduler.Config {
	sc := c.SchedulerConfig
	sc.MaxModelLen = maxLen
	// The engine caps the queue itself (synchronously, in Submit); the scheduler's queue
	// only needs room for what the engine lets through.
	if c.MaxQueue >= 1 && c.MaxNumSeqs >= 1 { // else invalid: let the scheduler say so
		sc.MaxQueue = c.MaxQueue + min(c.MaxNumSeqs, math.MaxInt-c.MaxQueue-1) + 1
	}
	if sc.Policy != PolicyStatic {
		sc.MaxBatchSize = 0
	}
	return sc
}
