package kvcache

import (
	"fmt"
	"math"
	"slices"
)

// SeqID identifies a sequence in the pool. The caller chooses the ids.
type SeqID uint64

// BlockID is the index of a block in the pool, in [0, NumBlocks).
type BlockID int32

// maxBlocks bounds the pool size so block ids and the free queue's sentinel fit in an int32.
const maxBlocks = math.MaxInt32 - 1

// NoBlock is a block-table entry of a sliding-window group for positions every window
// ahead has passed: the block was given back and nothing may read it.
const NoBlock BlockID = -1

// maxGroups bounds PoolConfig.Windows.
const maxGroups = 256

// PoolConfig configures a Pool.
type PoolConfig struct {
	NumBlocks           int  // blocks in the pool (see NumBlocksForBudget)
	BlockSizeTokens     int  // tokens per block
	EnablePrefixCaching bool // register full blocks by content and reuse them across sequences

	// Windows has one entry per layer group, the group's sliding window in tokens (0 for
	// full attention); nil is one full group. Each sequence has one block table per
	// group, all drawn from the one pool, so memory goes wherever it is needed. A
	// window group gives back the blocks its window has passed (NoBlock in its table):
	// a query at position p reads positions p-W+1..p, and positions only grow. See
	// Storage's GroupLayers for how a model's layers map onto groups.
	Windows []int
}

// Validate reports whether the configuration can build a pool.
func (c PoolConfig) Validate() error {
	if c.NumBlocks <= 0 || c.NumBlocks > maxBlocks {
		return fmt.Errorf("%w: NumBlocks %d must be in [1, %d]", ErrInvalid, c.NumBlocks, maxBlocks)
	}
	if c.BlockSizeTokens <= 0 || c.BlockSizeTokens > 1<<16 {
		return fmt.Errorf("%w: BlockSizeTokens %d must be in [1, 65536]", ErrInvalid, c.BlockSizeTokens)
	}
	if len(c.Windows) > maxGroups {
		return fmt.Errorf("%w: %d layer groups, at most %d", ErrInvalid, len(c.Windows), maxGroups)
	}
	for g, w := range c.Windows {
		if w < 0 {
			return fmt.Errorf("%w: group %d has window %d", ErrInvalid, g, w)
		}
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
	FreeBlocks   int     // blocks no sequence holds (includes CachedBlocks); all allocatable
	CachedBlocks int     // free blocks still holding a registered prefix; evicted LRU first when needed
	UsedBlocks   int     // blocks held by at least one sequence; FreeBlocks + UsedBlocks == TotalBlocks
	UsedFraction float64 // UsedBlocks / TotalBlocks

	PrefixQueriesTokens int64 // prompt tokens of the sequences admitted with a prefix lookup (AllocateSlots)
	PrefixHitsTokens    int64 // of those, tokens served from cached blocks
}

// blockMeta is the pool's bookkeeping for one block.
type blockMeta struct {
	ref int32 // sequences holding the block

	// Prefix-cache registration; regID == 0 means not registered. regIDs are never reused,
	// so a child's parentReg names exactly one registration of its parent, ever.
	regID     uint64
	parentReg uint64 // regID of the parent block at registration; 0 for a first block
	hash      uint64 // key in Pool.cache
	extraKey  uint64
}

// seqState is one sequence's block tables (one per group) and token counts.
type seqState struct {
	tables    []groupTable
	numTokens int     // token slots allocated
	committed int     // tokens recorded by Commit (or attached by AllocateSlots)
	pending   []int32 // committed token ids of the current partial block
}

// groupTable is one group's block table of a sequence and its prefix-cache chain.
type groupTable struct {
	blocks []BlockID
	from   int // blocks[:from] are NoBlock (window groups: passed by the window)

	// Chain state for registering the next full block. chainOK turns false when a block
	// could not be registered consistently; later blocks of the sequence are then not cached.
	parentHash uint64
	parentReg  uint64
	chainOK    bool
}

// Pool is the block allocator: per-sequence block tables, reference counts, the free-block
// queue and the prefix cache. It holds no K/V data (see Storage). A Pool is not safe for
// concurrent use: one goroutine owns it.
type Pool struct {
	cfg     PoolConfig
	bs      int   // tokens per block
	windows []int // per group; 0 = full attention
	meta    []blockMeta
	free    freeQueue

	seqs  map[SeqID]*seqState
	spare []*seqState // recycled seqStates, to keep the steady state allocation-free

	// Prefix cache: key -> block. tokens[b*bs:(b+1)*bs] holds a registered block's token ids.
	cache      map[uint64]BlockID
	tokens     []int32
	hash       blockHashFunc
	nextReg    uint64
	cachedFree int // free blocks with a registration

	used          int // blocks with ref > 0
	queriesTokens int64
	hitsTokens    int64

	cowBuf []CopyOp
}

// NewPool returns a pool with every block free.
func NewPool(cfg PoolConfig) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	windows := slices.Clone(cfg.Windows)
	if len(windows) == 0 {
		windows = []int{0}
	}
	p := &Pool{
		cfg:     cfg,
		bs:      cfg.BlockSizeTokens,
		windows: windows,
		meta:    make([]blockMeta, cfg.NumBlocks),
		free:    newFreeQueue(cfg.NumBlocks),
		seqs:    make(map[SeqID]*seqState),
		hash:    hashBlock,
		nextReg: 1,
	}
	if cfg.EnablePrefixCaching {
		p.cache = make(map[uint64]BlockID)
		p.tokens = make([]int32, cfg.NumBlocks*cfg.BlockSizeTokens)
	}
	return p, nil
}

// blocksFor returns the blocks needed to hold n tokens.
func (p *Pool) blocksFor(n int) int { return (n + p.bs - 1) / p.bs }

func (p *Pool) newSeq() *seqState {
	if n := len(p.spare); n > 0 {
		st := p.spare[n-1]
		p.spare = p.spare[:n-1]
		return st
	}
	st := &seqState{tables: make([]groupTable, len(p.windows)), pending: make([]int32, 0, p.bs)}
	for g := range st.tables {
		st.tables[g].reset(g)
	}
	return st
}

func (t *groupTable) reset(g int) {
	t.blocks, t.from = t.blocks[:0], 0
	t.parentHash, t.parentReg, t.chainOK = groupRoot(g), 0, true
}

func (p *Pool) recycle(st *seqState) {
	for g := range st.tables {
		st.tables[g].reset(g)
	}
	st.numTokens, st.committed = 0, 0
	st.pending = st.pending[:0]
	p.spare = append(p.spare, st)
}

// acquire adds a reference to a block that is registered or already held, taking it off the
// free queue if it was free.
func (p *Pool) acquire(b BlockID) {
	m := &p.meta[b]
	if m.ref == 0 {
		p.free.remove(int32(b))
		if m.regID != 0 {
			p.cachedFree--
		}
		p.used++
	}
	m.ref++
}

// release drops a reference; a block no one holds joins the free queue: at the back when it
// holds a cached prefix (LRU order), at the front otherwise (nothing worth keeping).
func (p *Pool) release(b BlockID) {
	m := &p.meta[b]
	m.ref--
	if m.ref > 0 {
		return
	}
	p.used--
	if m.regID != 0 {
		p.free.pushBack(int32(b))
		p.cachedFree++
	} else {
		p.free.pushFront(int32(b))
	}
}

// takeFresh pops the first free block, evicting its cached prefix if it has one, and returns
// it with one reference. REQUIRES: a free block exists.
func (p *Pool) takeFresh() BlockID {
	b := BlockID(p.free.popFront())
	if p.meta[b].regID != 0 {
		p.cachedFree--
		p.unregister(b)
	}
	p.meta[b].ref = 1
	p.used++
	return b
}

// growth returns the blocks seq needs to grow by n tokens: fresh ones in every group, and
// one more per group whose last block must be copied first (it is partial, about to be
// written, and shared).
func (p *Pool) growth(st *seqState, n int) int {
	if st == nil {
		return len(p.windows) * p.blocksFor(n)
	}
	need := len(p.windows) * (p.blocksFor(st.numTokens+n) - p.blocksFor(st.numTokens))
	if n > 0 && st.numTokens%p.bs != 0 {
		for g := range st.tables {
			b := st.tables[g].blocks
			if p.meta[b[len(b)-1]].ref > 1 {
				need++
			}
		}
	}
	return need
}

// CanAllocate reports whether seq can grow by n tokens (including any copy-on-write block).
// An unknown seq is treated as empty.
func (p *Pool) CanAllocate(seq SeqID, n int) bool {
	return n >= 0 && p.growth(p.seqs[seq], n) <= p.free.n
}

// Allocate grows seq's block tables so they hold NumTokens(seq)+n tokens, creating seq if
// it is new. When it does not fit (or n < 0) it returns ok=false and changes nothing. cow
// lists copy-on-write copies the caller must apply to storage before writing the new
// tokens: when a last block of seq is partial and shared with another sequence, seq gets a
// private copy. The cow slice is reused by the next call to Allocate.
func (p *Pool) Allocate(seq SeqID, n int) (cow []CopyOp, ok bool) {
	_, cow, ok = p.grow(seq, n)
	return cow, ok
}

// grow is Allocate; it also returns seq's state (nil when it does not fit).
func (p *Pool) grow(seq SeqID, n int) (st *seqState, cow []CopyOp, ok bool) {
	if n < 0 {
		return nil, nil, false
	}
	st = p.seqs[seq]
	if p.growth(st, n) > p.free.n {
		return nil, nil, false
	}
	if st == nil {
		st = p.newSeq()
		p.seqs[seq] = st
	}
	cow = p.cowBuf[:0]
	want := p.blocksFor(st.numTokens + n)
	for g := range st.tables {
		t := &st.tables[g]
		if i := len(t.blocks) - 1; n > 0 && st.numTokens%p.bs != 0 && p.meta[t.blocks[i]].ref > 1 {
			src := t.blocks[i]
			dst := p.takeFresh()
			p.meta[src].ref-- // still > 0: it was shared
			t.blocks[i] = dst
			cow = append(cow, CopyOp{Src: src, Dst: dst})
		}
		for len(t.blocks) < want {
			t.blocks = append(t.blocks, p.takeFresh())
		}
	}
	st.numTokens += n
	p.cowBuf = cow
	if len(cow) == 0 {
		return st, nil, true
	}
	return st, cow, true
}

// Fork makes child share all of parent's blocks (reference counts up), with the same token
// count, committed tokens and prefix-cache chain. child must be new or hold no blocks. The
// next Allocate of either sequence copies a shared partial last block (copy-on-write).
// Fork parent only when its allocated positions hold its K/V.
func (p *Pool) Fork(parent, child SeqID) error {
	ps := p.seqs[parent]
	if ps == nil {
		return fmt.Errorf("%w: fork of unknown sequence %d", ErrInvalid, parent)
	}
	if parent == child {
		return fmt.Errorf("%w: fork of sequence %d onto itself", ErrInvalid, parent)
	}
	cs := p.seqs[child]
	if cs != nil && cs.numTokens > 0 {
		return fmt.Errorf("%w: fork target %d already holds blocks", ErrInvalid, child)
	}
	if cs == nil {
		cs = p.newSeq()
		p.seqs[child] = cs
	}
	for g := range ps.tables {
		pt, ct := &ps.tables[g], &cs.tables[g]
		for _, b := range pt.blocks[pt.from:] {
			p.meta[b].ref++
		}
		blocks := append(ct.blocks[:0], pt.blocks...)
		*ct = *pt
		ct.blocks = blocks
	}
	cs.numTokens, cs.committed = ps.numTokens, ps.committed
	cs.pending = append(cs.pending[:0], ps.pending...)
	return nil
}

// Free releases all of seq's blocks, tail first, and forgets seq. Blocks whose reference count
// drops to 0 join the free queue; those holding a cached prefix stay reusable until evicted,
// least recently freed first (so a sequence's tail goes before its shared head). Freeing an
// unknown sequence does nothing.
func (p *Pool) Free(seq SeqID) {
	st := p.seqs[seq]
	if st == nil {
		return
	}
	for g := range st.tables {
		t := &st.tables[g]
		for i := len(t.blocks) - 1; i >= t.from; i-- {
			p.release(t.blocks[i])
		}
	}
	delete(p.seqs, seq)
	p.recycle(st)
}

// Truncate drops seq's token slots beyond its first n — allocated, never committed: the
// positions of proposed tokens that verification rejected (speculative decoding) — and
// gives back the blocks only they held. n must lie between seq's committed tokens and its
// allocated ones. The prefix cache is untouched: only committed full blocks are in it.
func (p *Pool) Truncate(seq SeqID, n int) error {
	st := p.seqs[seq]
	if st == nil {
		return fmt.Errorf("%w: truncate of unknown sequence %d", ErrInvalid, seq)
	}
	if n < st.committed || n > st.numTokens {
		return fmt.Errorf("%w: truncate of sequence %d to %d tokens, with %d committed of %d allocated",
			ErrInvalid, seq, n, st.committed, st.numTokens)
	}
	keep := p.blocksFor(n)
	for g := range st.tables {
		t := &st.tables[g]
		for i := len(t.blocks) - 1; i >= keep && i >= t.from; i-- {
			p.release(t.blocks[i])
		}
		if len(t.blocks) > keep {
			t.blocks = t.blocks[:max(keep, t.from)]
		}
	}
	st.numTokens = n
	return nil
}

// BlockTable returns seq's block table of group 0, entry i holding positions [i*B, (i+1)*B)
// for block size B. The slice is a read-only view, valid until the next call that changes seq.
func (p *Pool) BlockTable(seq SeqID) []BlockID { return p.GroupTable(seq, 0) }

// AppendGroupTables appends seq's block tables of groups from, from+1, ... to dst (views
// like BlockTable's) and returns it: one lookup for all of them.
func (p *Pool) AppendGroupTables(dst [][]BlockID, seq SeqID, from int) [][]BlockID {
	st := p.seqs[seq]
	for g := from; g < len(p.windows); g++ {
		var b []BlockID
		if st != nil {
			b = st.tables[g].blocks
		}
		dst = append(dst, b[:len(b):len(b)])
	}
	return dst
}

// GroupTable returns seq's block table of group g, like BlockTable; a window group's
// entries before its window are NoBlock.
func (p *Pool) GroupTable(seq SeqID, g int) []BlockID {
	st := p.seqs[seq]
	if st == nil {
		return nil
	}
	b := st.tables[g].blocks
	return b[:len(b):len(b)]
}

// NumTokens returns the number of token slots allocated to seq (0 for an unknown sequence).
func (p *Pool) NumTokens(seq SeqID) int {
	if st := p.seqs[seq]; st != nil {
		return st.numTokens
	}
	return 0
}

// NumCommittedTokens returns the number of seq's tokens recorded by Commit or attached from
// the prefix cache by AllocateSlots (0 for an unknown sequence).
func (p *Pool) NumCommittedTokens(seq SeqID) int {
	if st := p.seqs[seq]; st != nil {
		return st.committed
	}
	return 0
}

// NumFreeBlocks returns the number of allocatable blocks (free, cached or not).
func (p *Pool) NumFreeBlocks() int { return p.free.n }

// Stats returns a snapshot of the pool's usage.
func (p *Pool) Stats() Stats {
	total := len(p.meta)
	return Stats{
		TotalBlocks:         total,
		FreeBlocks:          p.free.n,
		CachedBlocks:        p.cachedFree,
		UsedBlocks:          p.used,
		UsedFraction:        float64(p.used) / float64(total),
		PrefixQueriesTokens: p.queriesTokens,
		PrefixHitsTokens:    p.hitsTokens,
	}
}
