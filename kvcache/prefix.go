package kvcache

import (
	"fmt"
	"slices"
)

// groupRoot is the parent key of group g's first block: each group's keys are its own.
func groupRoot(g int) uint64 { return hashRoot + uint64(g)*hashK1 }

// PrefixHit is what FindPrefix found: the cached full blocks that hold the start of a
// prompt, and the prompt's length for the query counters. The zero value is an empty hit
// (nothing cached, nothing to count). FindPrefix refills a hit in place, so one hit can be
// reused for every lookup without allocating.
type PrefixHit struct {
	groups  []hitGroup
	tokens  int  // cached tokens: a multiple of the block size
	queried int  // prompt tokens looked up
	counted bool // the query and hit were counted by an AllocateSlots
}

// NumTokens returns the number of prompt tokens the hit covers, a multiple of the block size.
func (h *PrefixHit) NumTokens() int { return h.tokens }

// hitGroup is one group's part of a hit: its blocks (NoBlock before a window group's
// window) and their registrations.
type hitGroup struct {
	blocks []BlockID
	regs   []uint64 // each block's registration id at lookup, to detect a stale hit
}

// Reset empties the hit: no cached blocks, nothing to count.
func (h *PrefixHit) Reset() {
	for g := range h.groups {
		h.groups[g].blocks, h.groups[g].regs = h.groups[g].blocks[:0], h.groups[g].regs[:0]
	}
	h.tokens, h.queried, h.counted = 0, 0, false
}

// FindPrefix finds the longest run of cached full blocks matching the start of tokens and
// records it in hit (reset first). It only looks: no reference count, free-queue position or
// counter changes, so a caller that cannot admit the sequence has nothing to undo. Only
// whole blocks are found, and never the whole prompt: at least one token is left to compute,
// so hit.NumTokens() is at most len(tokens)-1 rounded down to a multiple of the block size.
// With prefix caching off the hit is empty and counts no query. AllocateSlots attaches the
// blocks and counts the query.
//
// A hit of k blocks needs every full group's first k blocks, and of each window group only
// the blocks the first position after the hit reads; the longest k that every group
// has is the hit. A window group's block is found by its key (which chains every token
// before it) and its own tokens: its parent may be long gone.
func (p *Pool) FindPrefix(hit *PrefixHit, tokens []int32, extraKey uint64) {
	hit.Reset()
	if p.cache == nil {
		return
	}
	hit.queried = len(tokens)
	if len(tokens) <= 1 {
		return
	}
	for len(hit.groups) < len(p.windows) {
		hit.groups = append(hit.groups, hitGroup{})
	}
	hit.groups = hit.groups[:len(p.windows)]
	k := (len(tokens) - 1) / p.bs
	// Full groups: the chain from the first block, as far as it goes.
	for g, w := range p.windows {
		if w > 0 {
			continue
		}
		hg := &hit.groups[g]
		parentHash, parentReg := groupRoot(g), uint64(0)
		for n := 0; n < k; n++ {
			blk := tokens[n*p.bs : (n+1)*p.bs]
			h := p.hash(parentHash, blk, extraKey)
			b, ok := p.cache[h]
			if !ok || !p.matches(b, parentReg, blk, extraKey) {
				break
			}
			parentHash, parentReg = h, p.meta[b].regID
			hg.blocks = append(hg.blocks, b)
			hg.regs = append(hg.regs, parentReg)
		}
		k = len(hg.blocks)
	}
	// Window groups: every block found by key (NoBlock where missing); then the longest k
	// whose window is all there.
	for g, w := range p.windows {
		if w == 0 {
			continue
		}
		hg := &hit.groups[g]
		parentHash := groupRoot(g)
		for n := 0; n < k; n++ {
			blk := tokens[n*p.bs : (n+1)*p.bs]
			h := p.hash(parentHash, blk, extraKey)
			parentHash = h
			b, ok := p.cache[h]
			if !ok || !p.sameBlock(b, blk, extraKey) {
				hg.blocks, hg.regs = append(hg.blocks, NoBlock), append(hg.regs, 0)
				continue
			}
			hg.blocks, hg.regs = append(hg.blocks, b), append(hg.regs, p.meta[b].regID)
		}
	}
	for ; k > 0; k-- {
		if p.windowsPresent(hit, k) {
			break
		}
	}
	for g, w := range p.windows {
		hg := &hit.groups[g]
		hg.blocks, hg.regs = hg.blocks[:k], hg.regs[:k]
		if w > 0 {
			for n := range p.windowStart(g, k*p.bs) {
				hg.blocks[n], hg.regs[n] = NoBlock, 0
			}
		}
	}
	hit.tokens = k * p.bs
}

// windowsPresent reports whether every window group of hit has the blocks a query right
// after its first k blocks reads.
func (p *Pool) windowsPresent(hit *PrefixHit, k int) bool {
	for g, w := range p.windows {
		if w == 0 {
			continue
		}
		for n := p.windowStart(g, k*p.bs); n < k; n++ {
			if hit.groups[g].blocks[n] == NoBlock {
				return false
			}
		}
	}
	return true
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
	b := st.tables[0].blocks
	return b[:len(b):len(b)], cow, true
}

// attach is AllocateSlots with a hit.
func (p *Pool) attach(seq SeqID, hit *PrefixHit, n int) (*seqState, bool) {
	if n < 0 {
		return nil, false
	}
	st := p.seqs[seq]
	if st != nil && st.numTokens > 0 {
		return nil, false
	}
	k := hit.tokens / p.bs
	if k > 0 && len(hit.groups) != len(p.windows) {
		return nil, false
	}
	revive := 0
	for g := range hit.groups[:min(len(hit.groups), len(p.windows))] {
		hg := &hit.groups[g]
		for i, b := range hg.blocks[:k] {
			if b == NoBlock {
				continue
			}
			m := &p.meta[b]
			if m.regID != hg.regs[i] {
				return nil, false // evicted (and maybe reused) since the lookup
			}
			if m.ref == 0 {
				revive++
			}
		}
	}
	if revive+len(p.windows)*(p.blocksFor(hit.tokens+n)-k) > p.free.n {
		return nil, false
	}
	if st == nil {
		st = p.newSeq()
		p.seqs[seq] = st
	}
	// Cached blocks leave the free queue before any fresh block is taken, so taking fresh
	// blocks cannot evict them.
	if k > 0 {
		for g := range st.tables {
			t, hg := &st.tables[g], &hit.groups[g]
			for _, b := range hg.blocks[:k] {
				if b == NoBlock {
					t.from++
				} else {
					p.acquire(b)
				}
				t.blocks = append(t.blocks, b)
			}
			if last := hg.blocks[k-1]; last != NoBlock {
				t.parentHash, t.parentReg, t.chainOK = p.meta[last].hash, p.meta[last].regID, true
			} else {
				t.chainOK = false // a one-token window: nothing of the hit is kept to chain from
			}
		}
		st.numTokens, st.committed = hit.tokens, hit.tokens
		st.pending = st.pending[:0]
	}
	want := p.blocksFor(st.numTokens + n)
	for g := range st.tables {
		t := &st.tables[g]
		for len(t.blocks) < want {
			t.blocks = append(t.blocks, p.takeFresh())
		}
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
	return p.sameBlock(b, tokens, extraKey) && p.meta[b].parentReg == parentReg
}

// sameBlock reports whether block b is registered with this content and extra key.
func (p *Pool) sameBlock(b BlockID, tokens []int32, extraKey uint64) bool {
	m := &p.meta[b]
	return m.regID != 0 && m.extraKey == extraKey && slices.Equal(p.tokens[int(b)*p.bs:(int(b)+1)*p.bs], tokens)
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
		p.slide(st)
		return nil
	}
	for len(tokens) > 0 {
		take := min(p.bs-len(st.pending), len(tokens))
		st.pending = append(st.pending, tokens[:take]...)
		tokens = tokens[take:]
		st.committed += take
		if len(st.pending) == p.bs {
			for g := range st.tables {
				p.registerFull(&st.tables[g], st.committed/p.bs-1, st.pending, extraKey)
			}
			st.pending = st.pending[:0]
		}
	}
	p.slide(st)
	return nil
}

// registerFull registers block idx of table t, whose token ids are tokens, and advances
// the table's chain.
func (p *Pool) registerFull(t *groupTable, idx int, tokens []int32, extraKey uint64) {
	if !t.chainOK {
		return
	}
	b := t.blocks[idx]
	h := p.hash(t.parentHash, tokens, extraKey)
	if p.meta[b].regID != 0 {
		// Already registered: b came from the cache or is shared with a sequence that
		// committed it first. Continue from it if the content agrees.
		if !p.matches(b, t.parentReg, tokens, extraKey) {
			t.chainOK = false
			return
		}
		t.parentHash, t.parentReg = p.meta[b].hash, p.meta[b].regID
		return
	}
	if cur, ok := p.cache[h]; ok {
		if p.matches(cur, t.parentReg, tokens, extraKey) {
			// An identical block is registered: keep that mapping, chain through it.
			t.parentHash, t.parentReg = h, p.meta[cur].regID
			return
		}
		// A collision or a stale entry whose parent is gone: the newer block replaces it.
		p.dropRegistration(cur)
	}
	m := &p.meta[b]
	m.regID, m.parentReg, m.hash, m.extraKey = p.nextReg, t.parentReg, h, extraKey
	p.nextReg++
	copy(p.tokens[int(b)*p.bs:], tokens)
	p.cache[h] = b
	t.parentHash, t.parentReg = h, m.regID
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

// unregister drops b's prefix-cache entry.
// DropPrefixCache forgets every cached prefix: FindPrefix finds no block until blocks are
// registered anew. It is for a cache whose contents were lost (a runner on a GPU
// replaced, with the device memory the blocks lived in): the blocks stay allocated to the
// sequences that hold them, which must recompute them, and register no further blocks of
// their chains.
func (p *Pool) DropPrefixCache() {
	if p.cache == nil {
		return
	}
	for b := range p.meta {
		if m := &p.meta[b]; m.regID != 0 {
			if m.ref == 0 {
				p.cachedFree--
			}
			p.unregister(BlockID(b))
		}
	}
	for _, st := range p.seqs {
		for g := range st.tables {
			st.tables[g].chainOK = false
		}
	}
}

func (p *Pool) unregister(b BlockID) {
	m := &p.meta[b]
	if cur, ok := p.cache[m.hash]; ok && cur == b {
		delete(p.cache, m.hash)
	}
	m.regID, m.parentReg, m.hash, m.extraKey = 0, 0, 0, 0
}
