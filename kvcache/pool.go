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

// PoolConfig configures a Pool.
type PoolConfig struct {
	NumBlocks           int  // blocks in the pool (see NumBlocksForBudget)
	BlockSizeTokens     int  // tokens per block
	EnablePrefixCaching bool // register full blocks by content and reuse them across sequences
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

// seqState is one sequence's block table and prefix-cache chain.
type seqState struct {
	blocks    []BlockID
	numTokens int // token slots allocated
	committed int // tokens recorded by Commit (or attached by AllocateSlots)

	// Chain state for registering the next full block. chainOK turns false when a block
	// could not be registered consistently; later blocks of the sequence are then not cached.
	parentHash uint64
	parentReg  uint64
	chainOK    bool
	pending    []int32 // committed token ids of the current partial block
}

// Pool is the block allocator: per-sequence block tables, reference counts, the free-block
// queue and the prefix cache. It holds no K/V data (see Storage). A Pool is not safe for
// concurrent use: one goroutine owns it.
type Pool struct {
	cfg  PoolConfig
	bs   int // tokens per block
	meta []blockMeta
	free freeQueue

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
	p := &Pool{
		cfg:     cfg,
		bs:      cfg.BlockSizeTokens,
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

// BlockSizeTokens returns the number of tokens per block.
func (p *Pool) BlockSizeTokens() int { return p.bs }

// NumBlocks returns the number of blocks in the pool.
func (p *Pool) NumBlocks() int { return len(p.meta) }

// blocksFor returns the blocks needed to hold n tokens.
func (p *Pool) blocksFor(n int) int { return (n + p.bs - 1) / p.bs }

func (p *Pool) newSeq() *seqState {
	if n := len(p.spare); n > 0 {
		st := p.spare[n-1]
		p.spare = p.spare[:n-1]
		return st
	}
	return &seqState{chainOK: true, parentHash: hashRoot, pending: make([]int32, 0, p.bs)}
}

func (p *Pool) recycle(st *seqState) {
	st.blocks = st.blocks[:0]
	st.numTokens, st.committed = 0, 0
	st.parentHash, st.parentReg, st.chainOK = hashRoot, 0, true
	st.pending = st.pending[:0]
	p.spare = append(p.spare, st)
}

// PrefixHit is what FindPrefix found: the cached full blocks that hold the start of a
// prompt, and the prompt's length for the query counters. The zero value is an empty hit
// (nothing cached, nothing to count). FindPrefix refills a hit in place, so one hit can be
// reused for every lookup without allocating.
type PrefixHit struct {
	blocks  []BlockID
	regs    []uint64 // each block's registration id at lookup, to detect a stale hit
	tokens  int      // cached tokens: len(blocks) * block size
	queried int      // prompt tokens looked up
	counted bool     // the query and hit were counted by an AllocateSlots
}

// NumTokens returns the number of prompt tokens the hit covers, a multiple of the block size.
func (h *PrefixHit) NumTokens() int { return h.tokens }

// Reset empties the hit: no cached blocks, nothing to count.
func (h *PrefixHit) Reset() {
	h.blocks, h.regs = h.blocks[:0], h.regs[:0]
	h.tokens, h.queried, h.counted = 0, 0, false
}

// FindPrefix finds the longest run of cached full blocks matching the start of tokens and
// records it in hit (reset first). It only looks: no reference count, free-queue position or
// counter changes, so a caller that cannot admit the sequence has nothing to undo. Only
// whole blocks are found, and never the whole prompt: at least one token is left to compute,
// so hit.NumTokens() is at most len(tokens)-1 rounded down to a multiple of the block size.
// With prefix caching off the hit is empty and counts no query. AllocateSlots attaches the
// blocks and counts the query.
func (p *Pool) FindPrefix(hit *PrefixHit, tokens []int32, extraKey uint64) {
	hit.Reset()
	if p.cache == nil {
		return
	}
	hit.queried = len(tokens)
	if len(tokens) <= 1 {
		return
	}
	maxFull := (len(tokens) - 1) / p.bs
	parentHash, parentReg := uint64(hashRoot), uint64(0)
	for n := 0; n < maxFull; n++ {
		blk := tokens[n*p.bs : (n+1)*p.bs]
		h := p.hash(parentHash, blk, extraKey)
		b, ok := p.cache[h]
		if !ok || !p.matches(b, parentReg, blk, extraKey) {
			break
		}
		parentHash, parentReg = h, p.meta[b].regID
		hit.blocks = append(hit.blocks, b)
		hit.regs = append(hit.regs, parentReg)
	}
	hit.tokens = len(hit.blocks) * p.bs
}

// AllocateSlots grows seq by n tokens like Allocate, first attaching a prefix-cache hit
// when hit is not nil, all or nothing, and returns seq's block table after it (a view like
// BlockTable's). With a hit it admits a new sequence: it attaches hit's blocks (reference
// counts up, revived from the free queue if they were free) as seq's first hit.NumTokens()
// tokens, allocated and committed, then allocates the n more. The blocks revived from the
// free queue count against the free blocks like fresh ones. When it does not fit (or n < 0)
// it returns ok=false and changes nothing, counters included.
//
// With a hit, seq must hold no blocks yet, and hit must come from FindPrefix with no block
// of it evicted since (the registrations are checked); otherwise ok is false and nothing
// changes. A new sequence never needs copy-on-write, so cow is nil then.
//
// The first successful AllocateSlots with a hit counts its query and hit tokens (Stats);
// later ones with the same hit (the other sequences of an n > 1 request sharing the prompt)
// attach the same blocks without counting again.
func (p *Pool) AllocateSlots(seq SeqID, hit *PrefixHit, n int) (blocks []BlockID, cow []CopyOp, ok bool) {
	var st *seqState
	if hit == nil {
		st, cow, ok = p.grow(seq, n)
	} else {
		st, ok = p.attach(seq, hit, n)
	}
	if !ok {
		return nil, nil, false
	}
	return st.blocks[:len(st.blocks):len(st.blocks)], cow, true
}

// attach is AllocateSlots with a hit.
func (p *Pool) attach(seq SeqID, hit *PrefixHit, n int) (*seqState, bool) {
	if n < 0 {
		return nil, false
	}
	st := p.seqs[seq]
	if st != nil && len(st.blocks) > 0 {
		return nil, false
	}
	revive := 0
	for i, b := range hit.blocks {
		m := &p.meta[b]
		if m.regID != hit.regs[i] {
			return nil, false // evicted (and maybe reused) since the lookup
		}
		if m.ref == 0 {
			revive++
		}
	}
	if revive+p.blocksFor(hit.tokens+n)-len(hit.blocks) > p.free.n {
		return nil, false
	}
	if st == nil {
		st = p.newSeq()
		p.seqs[seq] = st
	}
	// Cached blocks leave the free queue before any fresh block is taken, so taking fresh
	// blocks cannot evict them.
	for _, b := range hit.blocks {
		p.acquire(b)
		st.blocks = append(st.blocks, b)
	}
	if k := len(hit.blocks); k > 0 {
		last := &p.meta[hit.blocks[k-1]]
		st.numTokens, st.committed = hit.tokens, hit.tokens
		st.parentHash, st.parentReg, st.chainOK = last.hash, last.regID, true
		st.pending = st.pending[:0]
	}
	for range p.blocksFor(st.numTokens+n) - len(st.blocks) {
		st.blocks = append(st.blocks, p.takeFresh())
	}
	st.numTokens += n
	if !hit.counted {
		hit.counted = true
		p.queriesTokens += int64(hit.queried)
		p.hitsTokens += int64(hit.tokens)
	}
	return st, true
}

// matches reports whether block b is registered with exactly this parent, content and extra key.
func (p *Pool) matches(b BlockID, parentReg uint64, tokens []int32, extraKey uint64) bool {
	m := &p.meta[b]
	return m.regID != 0 && m.parentReg == parentReg && m.extraKey == extraKey &&
		slices.Equal(p.tokens[int(b)*p.bs:(int(b)+1)*p.bs], tokens)
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

// unregister drops b's prefix-cache entry.
func (p *Pool) unregister(b BlockID) {
	m := &p.meta[b]
	if cur, ok := p.cache[m.hash]; ok && cur == b {
		delete(p.cache, m.hash)
	}
	m.regID, m.parentReg, m.hash, m.extraKey = 0, 0, 0, 0
}

// growth returns the fresh blocks seq needs to grow by n tokens, and whether the last block
// must be copied first (it is partial, about to be written, and shared).
func (p *Pool) growth(st *seqState, n int) (fresh int, cow bool) {
	if st == nil {
		return p.blocksFor(n), false
	}
	fresh = p.blocksFor(st.numTokens+n) - len(st.blocks)
	if n > 0 && st.numTokens%p.bs != 0 {
		last := st.blocks[len(st.blocks)-1]
		cow = p.meta[last].ref > 1
	}
	return fresh, cow
}

// CanAllocate reports whether seq can grow by n tokens (including any copy-on-write block).
// An unknown seq is treated as empty.
func (p *Pool) CanAllocate(seq SeqID, n int) bool {
	if n < 0 {
		return false
	}
	fresh, cow := p.growth(p.seqs[seq], n)
	if cow {
		fresh++
	}
	return fresh <= p.free.n
}

// Allocate grows seq's block table so it holds NumTokens(seq)+n tokens, creating seq if it
// is new. When it does not fit (or n < 0) it returns ok=false and changes nothing. cow lists
// copy-on-write copies the caller must apply to storage before writing the new tokens: when
// seq's last block is partial and shared with another sequence, seq gets a private copy. The
// cow slice is reused by the next call to Allocate.
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
	fresh, needCopy := p.growth(st, n)
	need := fresh
	if needCopy {
		need++
	}
	if need > p.free.n {
		return nil, nil, false
	}
	if st == nil {
		st = p.newSeq()
		p.seqs[seq] = st
	}
	cow = p.cowBuf[:0]
	if needCopy {
		i := len(st.blocks) - 1
		src := st.blocks[i]
		dst := p.takeFresh()
		p.meta[src].ref-- // still > 0: it was shared
		st.blocks[i] = dst
		cow = append(cow, CopyOp{Src: src, Dst: dst})
	}
	for range fresh {
		st.blocks = append(st.blocks, p.takeFresh())
	}
	st.numTokens += n
	p.cowBuf = cow
	if len(cow) == 0 {
		return st, nil, true
	}
	return st, cow, true
}

// Commit records the token ids of seq's positions [from, from+len(tokens)) as computed (their
// K/V are written). Every block that becomes full is registered in the prefix cache under its
// chained key (parent key, token ids, extraKey); if an identical block is already registered,
// that registration is kept and seq's chain continues from it. Commits must be contiguous:
// from must not exceed the number of tokens committed so far (an overlap with committed tokens
// is skipped), and from+len(tokens) must not exceed NumTokens(seq). A bad call returns an
// error wrapping ErrInvalid and changes nothing.
func (p *Pool) Commit(seq SeqID, from int, tokens []int32, extraKey uint64) error {
	st := p.seqs[seq]
	if st == nil {
		return fmt.Errorf("%w: commit to unknown sequence %d", ErrInvalid, seq)
	}
	end := from + len(tokens)
	if from < 0 || from > st.committed || end > st.numTokens {
		return fmt.Errorf("%w: commit of positions [%d, %d) to sequence %d with %d committed of %d allocated",
			ErrInvalid, from, end, seq, st.committed, st.numTokens)
	}
	if end <= st.committed {
		return nil
	}
	tokens = tokens[st.committed-from:]
	if p.cache == nil {
		st.committed = end
		return nil
	}
	for len(tokens) > 0 {
		take := min(p.bs-len(st.pending), len(tokens))
		st.pending = append(st.pending, tokens[:take]...)
		tokens = tokens[take:]
		st.committed += take
		if len(st.pending) == p.bs {
			p.registerFull(st, st.committed/p.bs-1, extraKey)
			st.pending = st.pending[:0]
		}
	}
	return nil
}

// registerFull registers seq's block idx, whose token ids are st.pending, and advances the chain.
func (p *Pool) registerFull(st *seqState, idx int, extraKey uint64) {
	if !st.chainOK {
		return
	}
	b := st.blocks[idx]
	h := p.hash(st.parentHash, st.pending, extraKey)
	if p.meta[b].regID != 0 {
		// Already registered: b came from the cache or is shared with a sequence that
		// committed it first. Continue from it if the content agrees.
		if !p.matches(b, st.parentReg, st.pending, extraKey) {
			st.chainOK = false
			return
		}
		st.parentHash, st.parentReg = p.meta[b].hash, p.meta[b].regID
		return
	}
	if cur, ok := p.cache[h]; ok {
		if p.matches(cur, st.parentReg, st.pending, extraKey) {
			// An identical block is registered: keep that mapping, chain through it.
			st.parentHash, st.parentReg = h, p.meta[cur].regID
			return
		}
		// A collision or a stale entry whose parent is gone: the newer block replaces it.
		p.dropRegistration(cur)
	}
	m := &p.meta[b]
	m.regID, m.parentReg, m.hash, m.extraKey = p.nextReg, st.parentReg, h, extraKey
	p.nextReg++
	copy(p.tokens[int(b)*p.bs:], st.pending)
	p.cache[h] = b
	st.parentHash, st.parentReg = h, m.regID
}

// dropRegistration unregisters b; a free b moves to the front of the free queue.
func (p *Pool) dropRegistration(b BlockID) {
	if p.meta[b].ref == 0 {
		p.free.remove(int32(b))
		p.free.pushFront(int32(b))
		p.cachedFree--
	}
	p.unregister(b)
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
	if cs != nil && len(cs.blocks) > 0 {
		return fmt.Errorf("%w: fork target %d already holds blocks", ErrInvalid, child)
	}
	if cs == nil {
		cs = p.newSeq()
		p.seqs[child] = cs
	}
	for _, b := range ps.blocks {
		p.meta[b].ref++
	}
	cs.blocks = append(cs.blocks[:0], ps.blocks...)
	cs.numTokens, cs.committed = ps.numTokens, ps.committed
	cs.parentHash, cs.parentReg, cs.chainOK = ps.parentHash, ps.parentReg, ps.chainOK
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
	for i := len(st.blocks) - 1; i >= 0; i-- {
		p.release(st.blocks[i])
	}
	delete(p.seqs, seq)
	p.recycle(st)
}

// BlockTable returns seq's block table, entry i holding positions [i*B, (i+1)*B) for block
// size B. The slice is a read-only view, valid until the next call that changes seq.
func (p *Pool) BlockTable(seq SeqID) []BlockID {
	st := p.seqs[seq]
	if st == nil {
		return nil
	}
	return st.blocks[:len(st.blocks):len(st.blocks)]
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
