package kvcache

import (
	"fmt"
	"math"
)

// SeqID identifies a sequence in the pool. The caller chooses the ids.
type SeqID uint64

// BlockID is the index of a block in the pool, in [0, NumBlocks).
type BlockID int32

// maxBlocks bounds the pool size so block ids fit in a BlockID.
const maxBlocks = math.MaxInt32 - 1

// PoolConfig configures a Pool.
type PoolConfig struct {
	NumBlocks           int  // blocks in the pool (see NumBlocksForBudget)
	BlockSizeTokens     int  // tokens per block
	EnablePrefixCaching bool // register full blocks by content hash and reuse them across sequences
}

// DefaultPoolConfig returns 16-token blocks with prefix caching on. NumBlocks is 0 and must
// be set (usually from NumBlocksForBudget).
func DefaultPoolConfig() PoolConfig {
	return PoolConfig{BlockSizeTokens: 16, EnablePrefixCaching: true}
}

// Validate reports whether the configuration can build a pool.
func (c PoolConfig) Validate() error {
	if c.NumBlocks <= 0 || c.NumBlocks > maxBlocks {
		return fmt.Errorf("%w: NumBlocks %d must be in [1, %d]", ErrInvalid, c.NumBlocks, maxBlocks)
	}
	if c.BlockSizeTokens <= 0 || c.BlockSizeTokens > 1<<16 {
		return fmt.Errorf("%w: BlockSizeTokens %d must be in [1, 65536]", ErrInvalid, c.BlockSizeTokens)
	}
	return nil
}

// CopyOp asks the caller to copy block Src's K/V storage into block Dst (copy-on-write)
// before writing new tokens into Dst. See Storage.CopyBlock.
type CopyOp struct {
	Src, Dst BlockID
}

// Stats is a snapshot of the pool's usage.
type Stats struct {
	TotalBlocks  int     // blocks in the pool
	FreeBlocks   int     // blocks no sequence holds (includes CachedBlocks); allocatable
	CachedBlocks int     // free blocks that still hold a registered prefix (evicted LRU first when needed)
	UsedBlocks   int     // blocks held by at least one sequence; FreeBlocks + UsedBlocks == TotalBlocks
	UsedFraction float64 // UsedBlocks / TotalBlocks

	PrefixQueriesTokens int64 // prompt tokens looked up by LookupPrefix
	PrefixHitsTokens    int64 // of those, tokens served from cached blocks
}

// Pool is the block allocator: per-sequence block tables, reference counts, the free-block
// queue and the prefix cache. It holds no K/V data (see Storage). A Pool is not safe for
// concurrent use: one goroutine owns it.
type Pool struct {
	cfg PoolConfig
}

// NewPool returns a pool with every block free.
func NewPool(cfg PoolConfig) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Pool{cfg: cfg}, nil
}

// BlockSizeTokens returns the number of tokens per block.
func (p *Pool) BlockSizeTokens() int { return p.cfg.BlockSizeTokens }

// LookupPrefix finds the longest run of cached full blocks matching the start of tokens and
// attaches them to seq, which must hold no blocks yet. Only whole blocks are attached, and
// never the whole prompt: at least one token is left to compute, so cachedTokens is at most
// len(tokens)-1 rounded down to a multiple of the block size. It returns the number of tokens
// covered (0 when seq already has blocks or prefix caching is off). Queries and hits are
// counted in tokens.
func (p *Pool) LookupPrefix(seq SeqID, tokens []int32, extraKey uint64) (cachedTokens int) {
	return 0
}

// CanAllocate reports whether seq can grow by n tokens (including any copy-on-write block).
func (p *Pool) CanAllocate(seq SeqID, n int) bool { return false }

// Allocate grows seq's block table so it holds NumTokens(seq)+n tokens, creating seq if it
// is new. When it does not fit, it returns ok=false and changes nothing. cow lists
// copy-on-write copies the caller must apply to storage before writing the new tokens: when
// seq's last block is partial and shared with another sequence, seq gets a private copy.
func (p *Pool) Allocate(seq SeqID, n int) (cow []CopyOp, ok bool) { return nil, false }

// Commit records the token ids of seq's positions [from, from+len(tokens)) as computed (their
// K/V are written). Every block that becomes full is registered in the prefix cache under its
// chained key (parent key, token ids, extraKey). Commits must be contiguous: from equals the
// number of tokens committed so far (an overlap with already committed tokens is skipped), and
// from+len(tokens) must not exceed NumTokens(seq).
func (p *Pool) Commit(seq SeqID, from int, tokens []int32, extraKey uint64) error { return nil }

// Fork makes child share all of parent's blocks (reference counts up), with the same token
// count and committed tokens. child must hold no blocks.
func (p *Pool) Fork(parent, child SeqID) error { return nil }

// Free releases all of seq's blocks, tail first, and forgets seq. Blocks whose reference count
// drops to 0 join the free queue; those holding a cached prefix stay reusable until evicted.
// Freeing an unknown sequence does nothing.
func (p *Pool) Free(seq SeqID) {}

// BlockTable returns seq's block table, position i holding tokens [i*B, (i+1)*B). The slice is
// a read-only view, valid until the next call that changes seq.
func (p *Pool) BlockTable(seq SeqID) []BlockID { return nil }

// NumTokens returns the number of token slots allocated to seq (0 for an unknown sequence).
func (p *Pool) NumTokens(seq SeqID) int { return 0 }

// Stats returns a snapshot of the pool's usage.
func (p *Pool) Stats() Stats { return Stats{} }

// CheckInvariants verifies the pool's internal consistency and returns an error wrapping
// ErrCorrupt describing the first broken invariant, or nil.
func (p *Pool) CheckInvariants() error { return nil }
