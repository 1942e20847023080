package kvcache

// NumGroups returns the number of layer groups (block tables per sequence).
func (p *Pool) NumGroups() int { return len(p.windows) }

// Window returns group g's sliding window in tokens, 0 for full attention.
func (p *Pool) Window(g int) int { return p.windows[g] }

// windowStart returns the first block of group g a query at position pos reads.
func (p *Pool) windowStart(g, pos int) int {
	if w := p.windows[g]; w > 0 && pos-w+1 > 0 {
		return (pos - w + 1) / p.bs
	}
	return 0
}

// slide gives back the blocks of st's window groups that no query from position
// st.committed on reads.
func (p *Pool) slide(st *seqState) {
	for g, w := range p.windows {
		if w == 0 {
			continue
		}
		t := &st.tables[g]
		for end := p.windowStart(g, st.committed); t.from < end; t.from++ {
			p.release(t.blocks[t.from])
			t.blocks[t.from] = NoBlock
		}
	}
}

// SeqBlocks returns the most blocks one sequence of n tokens holds at once when it is
// computed in chunks of at most chunk tokens: a full group's table of n tokens, and a
// window group's blocks of its window and a chunk.
func (p *Pool) SeqBlocks(n, chunk int) int {
	need := 0
	for _, w := range p.windows {
		b := p.blocksFor(n)
		if w > 0 {
			b = min(b, p.blocksFor(w-1+max(chunk, 1))+1)
		}
		need += b
	}
	return need
}

// MaxSeqTokens returns the longest sequence the pool holds alone (computed in chunks of
// at most chunk tokens), or 0 when no length is too long (every group is a window group
// whose window fits).
func (p *Pool) MaxSeqTokens(chunk int) int {
	const huge = 1 << 40
	if p.SeqBlocks(huge, chunk) <= len(p.meta) {
		return 0
	}
	lo, hi := 0, huge // SeqBlocks(lo) fits, SeqBlocks(hi) does not
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if p.SeqBlocks(mid, chunk) <= len(p.meta) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}
