package engine

import (
	"fmt"
	"time"

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

// Config configures an Engine.
type Config struct {
	// MaxNumSeqs caps the sequences in one forward pass.
	MaxNumSeqs int
	// MaxNumBatchedTokens is the per-step token budget (new tokens fed to the model in one
	// forward pass); long prompts are prefilled in chunks under it. Must be >= MaxNumSeqs.
	MaxNumBatchedTokens int
	// KVCacheBytes is the memory budget of the paged KV cache (keys and values of every
	// layer); the pool gets as many blocks as fit.
	KVCacheBytes int64
	// BlockSizeTokens is the number of tokens per KV block.
	BlockSizeTokens int
	// MaxModelLen caps a sequence's length in tokens (prompt + generated); 0 = the model's
	// context (Spec.MaxPositions). Larger values are clipped to the model's context.
	MaxModelLen int
	// Policy is the batching policy.
	Policy Policy
	// MaxBatchSize is the static batch size in sequences (PolicyStatic only).
	MaxBatchSize int
	// MaxBatchDelay is how long the oldest request waits for a static batch to fill
	// (PolicyStatic only).
	MaxBatchDelay time.Duration
	// MaxQueue caps the requests accepted but not yet running; Submit returns
	// ErrOverloaded beyond it.
	MaxQueue int
	// EnablePrefixCaching reuses the KV blocks of identical prompt prefixes.
	EnablePrefixCaching bool
	// TargetStepTime bounds each step's duration while sequences decode: prompt chunks
	// are sized from step times measured online (scheduler.Config.TargetStepTime). 0 =
	// auto (scheduler.AutoStepTimeFactor × the decode rows' own time, at least scheduler.MinAutoStepTime); a
	// negative value turns the bound off.
	TargetStepTime time.Duration
	// StorageParallelism is the number of goroutines the KV gather/scatter may use;
	// 0 = GOMAXPROCS.
	StorageParallelism int
	// OnStep, when set, is called on the engine goroutine after every forward pass. It
	// must return quickly.
	OnStep func(StepInfo)
}

// DefaultConfig returns continuous batching of up to 256 sequences with a 2048-token step
// budget, a 1 GiB KV cache in 16-token blocks with prefix caching, static batches of 8
// with a 50 ms delay, and a queue of 1024 requests.
func DefaultConfig() Config {
	return Config{
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 2048,
		KVCacheBytes:        1 << 30,
		BlockSizeTokens:     16,
		Policy:              PolicyContinuous,
		MaxBatchSize:        8,
		MaxBatchDelay:       50 * time.Millisecond,
		MaxQueue:            1024,
		EnablePrefixCaching: true,
	}
}

// Validate reports whether the configuration is usable (independently of the model).
func (c Config) Validate() error {
	switch {
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("%w: MaxNumSeqs %d must be >= 1", ErrInvalidConfig, c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < c.MaxNumSeqs:
		return fmt.Errorf("%w: MaxNumBatchedTokens %d must be >= MaxNumSeqs %d", ErrInvalidConfig, c.MaxNumBatchedTokens, c.MaxNumSeqs)
	case c.KVCacheBytes <= 0:
		return fmt.Errorf("%w: KVCacheBytes %d must be > 0", ErrInvalidConfig, c.KVCacheBytes)
	case c.BlockSizeTokens < 1 || c.BlockSizeTokens > 1<<16:
		return fmt.Errorf("%w: BlockSizeTokens %d must be in [1, 65536]", ErrInvalidConfig, c.BlockSizeTokens)
	case c.MaxModelLen < 0:
		return fmt.Errorf("%w: MaxModelLen %d must be >= 0", ErrInvalidConfig, c.MaxModelLen)
	case c.Policy != PolicyContinuous && c.Policy != PolicyStatic && c.Policy != PolicySequential:
		return fmt.Errorf("%w: unknown policy %v", ErrInvalidConfig, c.Policy)
	case c.MaxQueue < 1:
		return fmt.Errorf("%w: MaxQueue %d must be >= 1", ErrInvalidConfig, c.MaxQueue)
	case c.StorageParallelism < 0:
		return fmt.Errorf("%w: StorageParallelism %d must be >= 0", ErrInvalidConfig, c.StorageParallelism)
	}
	if c.Policy == PolicyStatic {
		if c.MaxBatchSize < 1 || c.MaxBatchSize > c.MaxNumSeqs {
			return fmt.Errorf("%w: MaxBatchSize %d must be in [1, MaxNumSeqs %d]", ErrInvalidConfig, c.MaxBatchSize, c.MaxNumSeqs)
		}
		if c.MaxBatchDelay < 0 {
			return fmt.Errorf("%w: MaxBatchDelay %v must be >= 0", ErrInvalidConfig, c.MaxBatchDelay)
		}
	}
	return nil
}
