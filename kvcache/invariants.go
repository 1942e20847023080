package kvcache

import "fmt"

// CheckInvariants verifies the pool's internal consistency and returns an error wrapping
// ErrCorrupt that describes the first broken invariant, or nil. It costs O(blocks + table
// entries) and is meant for tests and debug builds. Checked:
//   - every reference count equals the number of block-table entries naming the block (so
//     counts are never negative and a block sits in two tables only when its count is > 1),
//     and no table names a block twice;
//   - the free queue is a well-formed ring holding exactly the blocks with count 0;
//     free + used == total, and the counters agree;
//   - every cache entry points to a block registered under that key, registered blocks are
//     in the cache, and a registered block in a table is full;
//   - every table is exactly as long as its token count needs, and a window group's table
//     has given back exactly the blocks its window has passed (NoBlock entries);
//   - a block is in one group's tables only.
func (p *Pool) CheckInvariants() error {
	n := len(p.meta)
	refs := make([]int32, n)
	lastSeen := make([]SeqID, n)
	seen := make([]bool, n)
	group := make([]int, n)
	for id, st := range p.seqs {
		if st.numTokens < 0 || st.committed < 0 || st.committed > st.numTokens {
			return fmt.Errorf("%w: sequence %d has %d committed of %d tokens", ErrCorrupt, id, st.committed, st.numTokens)
		}
		if p.cache != nil && len(st.pending) != st.committed%p.bs {
			return fmt.Errorf("%w: sequence %d has %d pending tokens with %d committed", ErrCorrupt, id, len(st.pending), st.committed)
		}
		if len(st.tables) != len(p.windows) {
			return fmt.Errorf("%w: sequence %d has %d block tables for %d groups", ErrCorrupt, id, len(st.tables), len(p.windows))
		}
		for g := range st.tables {
			t := &st.tables[g]
			if want := p.blocksFor(st.numTokens); len(t.blocks) != want {
				return fmt.Errorf("%w: sequence %d holds %d blocks of group %d for %d tokens, want %d", ErrCorrupt, id, len(t.blocks), g, st.numTokens, want)
			}
			if want := p.windowStart(g, st.committed); t.from != want {
				return fmt.Errorf("%w: sequence %d group %d gave back %d blocks with %d committed, want %d", ErrCorrupt, id, g, t.from, st.committed, want)
			}
			for i, b := range t.blocks {
				if i < t.from {
					if b != NoBlock {
						return fmt.Errorf("%w: sequence %d group %d entry %d before its window is block %d", ErrCorrupt, id, g, i, b)
					}
					continue
				}
				if b < 0 || int(b) >= n {
					return fmt.Errorf("%w: sequence %d names block %d outside the pool", ErrCorrupt, id, b)
				}
				if seen[b] && lastSeen[b] == id {
					return fmt.Errorf("%w: sequence %d names block %d twice", ErrCorrupt, id, b)
				}
				if seen[b] && group[b] != g {
					return fmt.Errorf("%w: block %d is in groups %d and %d", ErrCorrupt, b, group[b], g)
				}
				seen[b], lastSeen[b], group[b] = true, id, g
				refs[b]++
				if p.meta[b].regID != 0 && (i+1)*p.bs > st.numTokens {
					return fmt.Errorf("%w: registered block %d is partial in sequence %d", ErrCorrupt, b, id)
				}
			}
		}
	}
	used, cachedFree, registered := 0, 0, 0
	for b := range n {
		m := &p.meta[b]
		if m.ref < 0 {
			return fmt.Errorf("%w: block %d has reference count %d", ErrCorrupt, b, m.ref)
		}
		if m.ref != refs[b] {
			return fmt.Errorf("%w: block %d has reference count %d but %d table entries", ErrCorrupt, b, m.ref, refs[b])
		}
		if m.ref > 0 {
			used++
		}
		if (m.ref == 0) != p.free.in[b] {
			return fmt.Errorf("%w: block %d with reference count %d has queued=%v", ErrCorrupt, b, m.ref, p.free.in[b])
		}
		if m.regID != 0 {
			registered++
			if p.cache == nil {
				return fmt.Errorf("%w: block %d registered with prefix caching off", ErrCorrupt, b)
			}
			if cur, ok := p.cache[m.hash]; !ok || int(cur) != b {
				return fmt.Errorf("%w: registered block %d is not the cache entry for its key", ErrCorrupt, b)
			}
			if m.parentReg >= m.regID {
				return fmt.Errorf("%w: block %d registered before its parent", ErrCorrupt, b)
			}
			if m.ref == 0 {
				cachedFree++
			}
		}
	}
	if registered != len(p.cache) {
		return fmt.Errorf("%w: %d registered blocks but %d cache entries", ErrCorrupt, registered, len(p.cache))
	}
	for h, b := range p.cache {
		if b < 0 || int(b) >= n || p.meta[b].hash != h || p.meta[b].regID == 0 {
			return fmt.Errorf("%w: cache entry %#x names block %d registered otherwise", ErrCorrupt, h, b)
		}
	}
	if err := p.checkFreeQueue(); err != nil {
		return err
	}
	if used != p.used || p.free.n+used != n {
		return fmt.Errorf("%w: %d free + %d used (counter %d) != %d total", ErrCorrupt, p.free.n, used, p.used, n)
	}
	if cachedFree != p.cachedFree {
		return fmt.Errorf("%w: %d cached free blocks, counter says %d", ErrCorrupt, cachedFree, p.cachedFree)
	}
	return nil
}

// checkFreeQueue walks the ring both ways and checks its links and length.
func (p *Pool) checkFreeQueue() error {
	q := &p.free
	s := q.sentinel()
	count := 0
	for at := q.next[s]; at != s; at = q.next[at] {
		if at < 0 || at >= s {
			return fmt.Errorf("%w: free queue links to %d", ErrCorrupt, at)
		}
		if !q.in[at] || q.prev[q.next[at]] != at {
			return fmt.Errorf("%w: free queue broken at block %d", ErrCorrupt, at)
		}
		count++
		if count > len(q.in) {
			return fmt.Errorf("%w: free queue has a cycle", ErrCorrupt)
		}
	}
	if q.next[q.prev[s]] != s {
		return fmt.Errorf("%w: free queue tail broken", ErrCorrupt)
	}
	queued := 0
	for _, in := range q.in {
		if in {
			queued++
		}
	}
	if count != q.n || queued != q.n {
		return fmt.Errorf("%w: free queue holds %d blocks (%d flagged), counter says %d", ErrCorrupt, count, queued, q.n)
	}
	return nil
}
