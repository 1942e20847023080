package kvcache

import (
	"slices"
	"testing"
)

func TestLookupPrefix(t *testing.T) {
	const bs = 4
	base := seqTokens(1000, 22) // 5 full blocks + 2
	changed := func(i int) []int32 {
		c := slices.Clone(base)
		c[i] = -c[i]
		return c
	}
	tests := []struct {
		name   string
		prompt []int32
		extra  uint64
		want   int
	}{
		{"same prompt", base, 0, 20},
		{"longer prompt", append(slices.Clone(base), 1, 2, 3, 4, 5), 0, 20},
		{"ends on a block boundary leaves a token", base[:20], 0, 16},
		{"one past a boundary", base[:21], 0, 20},
		{"shorter than a block", base[:3], 0, 0},
		{"one block plus one", base[:5], 0, 4},
		{"exactly one block", base[:4], 0, 0},
		{"single token", base[:1], 0, 0},
		{"empty", nil, 0, 0},
		{"differs in block 2", changed(9), 0, 8},
		{"differs in first token", changed(0), 0, 0},
		{"differs in last cached token", changed(19), 0, 16},
		{"differs after the cached blocks", changed(21), 0, 20},
		{"other extra key", base, 7, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, 32, bs, true)
			startSeq(t, p, 1, base, 0)
			q0 := p.Stats().PrefixQueriesTokens
			got := lookupPrefix(p, 2, tc.prompt, tc.extra)
			if got != tc.want {
				t.Fatalf("LookupPrefix = %d, want %d", got, tc.want)
			}
			check(t, p)
			if n := len(p.BlockTable(2)); n != tc.want/bs || p.NumTokens(2) != tc.want || p.NumCommittedTokens(2) != tc.want {
				t.Errorf("attached %d blocks, %d tokens, %d committed", n, p.NumTokens(2), p.NumCommittedTokens(2))
			}
			if !slices.Equal(p.BlockTable(2), p.BlockTable(1)[:tc.want/bs]) {
				t.Errorf("attached %v, want prefix of %v", p.BlockTable(2), p.BlockTable(1))
			}
			st := p.Stats()
			if st.PrefixQueriesTokens-q0 != int64(len(tc.prompt)) || st.PrefixHitsTokens != int64(tc.want) {
				t.Errorf("queries %d hits %d", st.PrefixQueriesTokens, st.PrefixHitsTokens)
			}
			// The sequence continues normally and its new full blocks are registered too.
			rest := tc.prompt[got:]
			if len(rest) > 0 {
				mustAlloc(t, p, 2, len(rest))
				if err := p.Commit(2, got, rest, tc.extra); err != nil {
					t.Fatal(err)
				}
				check(t, p)
				want := (len(tc.prompt) - 1) / bs * bs
				if len(tc.prompt) == 0 {
					want = 0
				}
				if again := lookupPrefix(p, 3, tc.prompt, tc.extra); again != want {
					t.Errorf("second lookup = %d, want %d", again, want)
				}
			}
		})
	}
}

func TestLookupPrefixRevivesFreedBlocks(t *testing.T) {
	p := newTestPool(t, 8, 4, true)
	prompt := seqTokens(5, 10)
	startSeq(t, p, 1, prompt, 3)
	p.Free(1)
	if st := p.Stats(); st.CachedBlocks != 2 || st.FreeBlocks != 8 {
		t.Fatalf("after free: %+v", st)
	}
	if got := startSeq(t, p, 2, prompt, 3); got != 8 {
		t.Fatalf("lookup = %d, want 8", got)
	}
	if st := p.Stats(); st.CachedBlocks != 0 || st.UsedBlocks != 3 || st.FreeBlocks != 5 {
		t.Errorf("after revival: %+v", st)
	}
	// A sequence that already holds blocks gets nothing and counts nothing.
	q := p.Stats().PrefixQueriesTokens
	if got := lookupPrefix(p, 2, prompt, 3); got != 0 || p.Stats().PrefixQueriesTokens != q {
		t.Errorf("lookup on a non-empty sequence = %d", got)
	}
}

func TestSharedPrefixIsCounted(t *testing.T) {
	p := newTestPool(t, 16, 4, true)
	prompt := seqTokens(0, 12)
	startSeq(t, p, 1, prompt, 0)
	startSeq(t, p, 2, prompt, 0)
	startSeq(t, p, 3, prompt, 0)
	t1, t2, t3 := p.BlockTable(1), p.BlockTable(2), p.BlockTable(3)
	if !slices.Equal(t1[:2], t2[:2]) || !slices.Equal(t1[:2], t3[:2]) || t1[2] == t2[2] || t2[2] == t3[2] {
		t.Fatalf("tables %v %v %v", t1, t2, t3)
	}
	if got := p.Stats().UsedBlocks; got != 5 {
		t.Errorf("used = %d, want 5", got)
	}
	// Sequence 2's last block duplicates sequence 1's: the existing registration is kept.
	h := p.meta[t1[2]].hash
	if p.cache[h] != t1[2] || p.meta[t2[2]].regID != 0 {
		t.Errorf("duplicate block registered: cache %d, seq 2 regID %d", p.cache[h], p.meta[t2[2]].regID)
	}
	p.Free(1)
	check(t, p)
	if got := lookupPrefix(p, 4, append(slices.Clone(prompt), 99), 0); got != 12 {
		t.Errorf("lookup after freeing the registering sequence = %d, want 12", got)
	}
}

func TestPrefixCachingDisabled(t *testing.T) {
	p := newTestPool(t, 8, 4, false)
	prompt := seqTokens(0, 10)
	if got := startSeq(t, p, 1, prompt, 0); got != 0 {
		t.Fatal(got)
	}
	if got := lookupPrefix(p, 2, prompt, 0); got != 0 {
		t.Errorf("lookup hit %d with caching off", got)
	}
	p.Free(1)
	if st := p.Stats(); st.CachedBlocks != 0 || st.PrefixQueriesTokens != 0 || st.FreeBlocks != 8 {
		t.Errorf("stats %+v", st)
	}
}

// TestHashCollisionsNeverShareWrongBlocks makes the key depend on the chain depth only, so
// block i of every prompt collides with block i of every other: lookups must verify content
// and parents and never return another prompt's blocks.
func TestHashCollisionsNeverShareWrongBlocks(t *testing.T) {
	p := newTestPool(t, 32, 4, true)
	p.hash = func(parent uint64, _ []int32, _ uint64) uint64 { return parent*31 + 1 }
	x, y, z := seqTokens(0, 4), seqTokens(100, 4), seqTokens(200, 4)
	xy := slices.Concat(x, y, []int32{7})
	zy := slices.Concat(z, y, []int32{7})
	startSeq(t, p, 1, xy, 0)
	if got := lookupPrefix(p, 2, zy, 0); got != 0 {
		t.Fatalf("prompt zy hit %d tokens of prompt xy", got)
	}
	if got := lookupPrefix(p, 3, xy, 0); got != 8 || !slices.Equal(p.BlockTable(3), p.BlockTable(1)[:2]) {
		t.Fatalf("prompt xy hit %d tokens, table %v", got, p.BlockTable(3))
	}
	// Register z as a first block: it replaces x under the colliding key. zy's second block
	// then finds xy's y block, whose content matches but whose K/V were computed after x:
	// the parent check must reject it.
	mustAlloc(t, p, 4, 4)
	if err := p.Commit(4, 0, z, 0); err != nil {
		t.Fatal(err)
	}
	check(t, p)
	if got := lookupPrefix(p, 5, zy, 0); got != 4 || p.BlockTable(5)[0] != p.BlockTable(4)[0] {
		t.Fatalf("prompt zy hit %d tokens, table %v (z block %d)", got, p.BlockTable(5), p.BlockTable(4)[0])
	}
	if got := lookupPrefix(p, 6, xy, 0); got != 0 {
		t.Fatalf("prompt xy hit %d tokens after its first block was replaced", got)
	}
	for s := SeqID(1); s <= 6; s++ {
		p.Free(s)
		check(t, p)
	}
	if st := p.Stats(); st.FreeBlocks != 32 {
		t.Errorf("leak: %+v", st)
	}
}

// TestStaleChildReplaced evicts a registered first block while a second block registered
// behind it lives on in another sequence. A new registration of the same first block gets a
// new identity; the old child must not be attached behind it, and is replaced when the same
// second block is committed again.
func TestStaleChildReplaced(t *testing.T) {
	p := newTestPool(t, 12, 4, true)
	x, w, y := seqTokens(0, 4), seqTokens(50, 4), seqTokens(100, 4)
	a := slices.Concat(x, w, []int32{1})
	b := slices.Concat(x, y, []int32{1})
	startSeq(t, p, 1, a, 0)
	// Sequence 2 computes b without a lookup (as if admitted in the same step): its first
	// block duplicates a's and is not registered; its second is, behind a's first.
	mustAlloc(t, p, 2, len(b))
	if err := p.Commit(2, 0, b, 0); err != nil {
		t.Fatal(err)
	}
	a0, b0, b1 := p.BlockTable(1)[0], p.BlockTable(2)[0], p.BlockTable(2)[1]
	if p.meta[b0].regID != 0 || p.meta[b1].parentReg != p.meta[a0].regID {
		t.Fatalf("registrations: b0 %+v b1 %+v a0 %+v", p.meta[b0], p.meta[b1], p.meta[a0])
	}
	p.Free(1)
	for p.meta[a0].regID != 0 {
		mustAlloc(t, p, 9, 4)
		check(t, p)
	}
	if got := lookupPrefix(p, 3, b, 0); got != 0 {
		t.Fatalf("lookup after evicting the first block = %d", got)
	}
	p.Free(9)
	mustAlloc(t, p, 3, 4)
	if err := p.Commit(3, 0, x, 0); err != nil {
		t.Fatal(err)
	}
	if got := lookupPrefix(p, 4, b, 0); got != 4 {
		t.Fatalf("stale child attached: lookup = %d, want 4", got)
	}
	mustAlloc(t, p, 3, 5)
	if err := p.Commit(3, 4, b[4:], 0); err != nil {
		t.Fatal(err)
	}
	check(t, p)
	if p.meta[b1].regID != 0 {
		t.Error("stale child still registered")
	}
	if got := lookupPrefix(p, 5, b, 0); got != 8 || !slices.Equal(p.BlockTable(5), p.BlockTable(3)[:2]) {
		t.Fatalf("lookup = %d, table %v, want sequence 3's %v", got, p.BlockTable(5), p.BlockTable(3))
	}
	check(t, p)
}

// freeOrder returns the free queue, front (taken next) first.
func freeOrder(p *Pool) []BlockID {
	var out []BlockID
	s := p.free.sentinel()
	for b := p.free.next[s]; b != s; b = p.free.next[b] {
		out = append(out, BlockID(b))
	}
	return out
}

func TestFindPrefixHasNoSideEffects(t *testing.T) {
	p := newTestPool(t, 8, 4, true)
	prompt := seqTokens(7, 10)
	startSeq(t, p, 1, prompt, 0)
	p.Free(1) // two cached blocks at the back of the free queue
	before, order := p.Stats(), freeOrder(p)
	var hit PrefixHit
	for range 3 {
		p.FindPrefix(&hit, prompt, 0)
		if hit.NumTokens() != 8 {
			t.Fatalf("hit %d tokens, want 8", hit.NumTokens())
		}
	}
	check(t, p)
	if st := p.Stats(); st != before {
		t.Errorf("FindPrefix changed the stats: %+v -> %+v", before, st)
	}
	if got := freeOrder(p); !slices.Equal(got, order) {
		t.Errorf("FindPrefix moved blocks in the free queue: %v -> %v", order, got)
	}
	for b := range p.meta {
		if p.meta[b].ref != 0 {
			t.Errorf("block %d has reference count %d after a lookup", b, p.meta[b].ref)
		}
	}
	if p.NumTokens(2) != 0 || p.BlockTable(2) != nil {
		t.Error("FindPrefix created a sequence")
	}
}

func TestAllocateSlotsIsAllOrNothing(t *testing.T) {
	p := newTestPool(t, 4, 4, true)
	prompt := seqTokens(7, 9) // blocks 0, 1 full and registered, block 2 partial
	startSeq(t, p, 1, prompt, 0)
	p.Free(1)             // free queue: 2, 3, 1, 0
	mustAlloc(t, p, 5, 4) // takes block 2: blocks 3, 1, 0 free, 1 and 0 cached
	var hit PrefixHit
	p.FindPrefix(&hit, prompt, 0)
	if hit.NumTokens() != 8 {
		t.Fatalf("hit %d tokens, want 8", hit.NumTokens())
	}
	// 5 more tokens need 2 fresh blocks besides the 2 cached ones it revives: 4 > 3 free. A
	// check of the fresh blocks alone would pass and then evict the hit's own blocks.
	before, order := p.Stats(), freeOrder(p)
	if table, cow, ok := p.AllocateSlots(2, &hit, 5); ok || cow != nil || table != nil {
		t.Fatalf("AllocateSlots needing 4 of 3 free blocks = %v, %v", cow, ok)
	}
	check(t, p)
	if st := p.Stats(); st != before || !slices.Equal(freeOrder(p), order) || p.BlockTable(2) != nil {
		t.Fatalf("failed AllocateSlots changed the pool: %+v -> %+v, queue %v -> %v", before, st, order, freeOrder(p))
	}
	// One more token fits: the hit's blocks are revived and the fresh block is block 3.
	table, _, ok := p.AllocateSlots(2, &hit, 1)
	if !ok || !slices.Equal(table, p.BlockTable(2)) {
		t.Fatalf("AllocateSlots needing 3 of 3 free blocks: %v, table %v", ok, table)
	}
	check(t, p)
	if got := p.BlockTable(2); !slices.Equal(got, []BlockID{0, 1, 3}) || p.NumTokens(2) != 9 || p.NumCommittedTokens(2) != 8 {
		t.Fatalf("table %v, %d tokens, %d committed", got, p.NumTokens(2), p.NumCommittedTokens(2))
	}
	if st := p.Stats(); st.PrefixQueriesTokens != before.PrefixQueriesTokens+9 || st.PrefixHitsTokens != before.PrefixHitsTokens+8 {
		t.Errorf("counters %+v, before %+v", st, before)
	}
	// The chain continues from the attached blocks.
	if err := p.Commit(2, 8, prompt[8:], 0); err != nil {
		t.Fatal(err)
	}
	check(t, p)
}

func TestAllocateSlotsRejectsStaleHit(t *testing.T) {
	p := newTestPool(t, 4, 4, true)
	prompt := seqTokens(7, 9)
	startSeq(t, p, 1, prompt, 0)
	p.Free(1)
	var hit PrefixHit
	p.FindPrefix(&hit, prompt, 0)
	// Another sequence takes every block, evicting the cached ones, and registers other
	// content in them.
	startSeq(t, p, 9, seqTokens(100, 16), 0)
	p.Free(9)
	before := p.Stats()
	if _, _, ok := p.AllocateSlots(2, &hit, 1); ok {
		t.Fatalf("stale hit attached: table %v", p.BlockTable(2))
	}
	check(t, p)
	if st := p.Stats(); st != before || p.BlockTable(2) != nil {
		t.Fatalf("rejected stale hit changed the pool: %+v -> %+v", before, st)
	}
}

func TestAllocateSlotsCountsAHitOnce(t *testing.T) {
	p := newTestPool(t, 16, 4, true)
	prompt := seqTokens(7, 13)
	startSeq(t, p, 1, prompt, 0)
	before := p.Stats()
	var hit PrefixHit
	p.FindPrefix(&hit, prompt, 0)
	// The sequences of an n > 1 request share one lookup.
	for seq := SeqID(2); seq <= 4; seq++ {
		if _, _, ok := p.AllocateSlots(seq, &hit, 1); !ok {
			t.Fatal("AllocateSlots failed")
		}
		if !slices.Equal(p.BlockTable(seq)[:3], p.BlockTable(1)[:3]) {
			t.Fatalf("sequence %d table %v, want the prefix of %v", seq, p.BlockTable(seq), p.BlockTable(1))
		}
	}
	check(t, p)
	st := p.Stats()
	if st.PrefixQueriesTokens-before.PrefixQueriesTokens != 13 || st.PrefixHitsTokens-before.PrefixHitsTokens != 12 {
		t.Errorf("queries +%d hits +%d, want +13 +12", st.PrefixQueriesTokens-before.PrefixQueriesTokens, st.PrefixHitsTokens-before.PrefixHitsTokens)
	}
	// A sequence that holds blocks cannot take a hit; a nil hit is a plain Allocate.
	if _, _, ok := p.AllocateSlots(2, &hit, 1); ok {
		t.Error("AllocateSlots with a hit on a sequence holding blocks succeeded")
	}
	if table, _, ok := p.AllocateSlots(2, nil, 1); !ok || p.NumTokens(2) != 14 || !slices.Equal(table, p.BlockTable(2)) {
		t.Errorf("AllocateSlots with a nil hit: ok %v, %d tokens", ok, p.NumTokens(2))
	}
	check(t, p)
}

// TestWindowGroupGivesBackBlocks: a window group holds only the blocks its window reads
// while a sequence grows; a later prompt with the same start finds the whole prefix, its
// window group attaching only the window.
func TestWindowGroupGivesBackBlocks(t *testing.T) {
	p, err := NewPool(PoolConfig{NumBlocks: 100, BlockSizeTokens: 4, EnablePrefixCaching: true, Windows: []int{0, 8}})
	if err != nil {
		t.Fatal(err)
	}
	toks := seqTokens(1, 41)
	if _, ok := p.Allocate(1, 10); !ok {
		t.Fatal("allocate")
	}
	if err := p.Commit(1, 0, toks[:10], 0); err != nil {
		t.Fatal(err)
	}
	for pos := 10; pos < 40; pos++ {
		if _, ok := p.Allocate(1, 1); !ok {
			t.Fatal("allocate")
		}
		if err := p.Commit(1, pos, toks[pos:pos+1], 0); err != nil {
			t.Fatal(err)
		}
	}
	// The next query (position 40) reads 33..40: blocks 8 and 9 of 10 in the window group.
	win := p.GroupTable(1, 1)
	for i, b := range win {
		if (b == NoBlock) != (i < 8) {
			t.Fatalf("window table %v: want NoBlock exactly before entry 8", win)
		}
	}
	if st := p.Stats(); st.UsedBlocks != 12 {
		t.Fatalf("%d blocks in use, want 10 full + 2 window", st.UsedBlocks)
	}
	if err := p.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	p.Free(1)
	var hit PrefixHit
	p.FindPrefix(&hit, toks, 0)
	if hit.NumTokens() != 40 {
		t.Fatalf("hit of %d tokens, want 40", hit.NumTokens())
	}
	if _, _, ok := p.AllocateSlots(2, &hit, 1); !ok {
		t.Fatal("attach")
	}
	if st := p.Stats(); st.UsedBlocks != 10+2+2 {
		t.Fatalf("%d blocks in use after the hit, want 10 + 1 full, 2 + 1 window", st.UsedBlocks)
	}
	if err := p.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestDropPrefixCache: after DropPrefixCache no prompt finds a cached block — neither the
// blocks of a freed sequence nor those of one still holding its blocks, which keeps them
// but registers no more of its chain — and the pool's invariants hold; blocks computed
// afterwards are cached again.
func TestDropPrefixCache(t *testing.T) {
	p := newTestPool(t, 16, 4, true)
	freed, held := seqTokens(5, 10), seqTokens(9, 10)
	startSeq(t, p, 1, freed, 0)
	p.Free(1)
	startSeq(t, p, 2, held, 0)
	if st := p.Stats(); st.CachedBlocks != 2 {
		t.Fatalf("before: %+v", st)
	}
	p.DropPrefixCache()
	check(t, p)
	if st := p.Stats(); st.CachedBlocks != 0 || st.UsedBlocks != 3 || st.FreeBlocks != 13 {
		t.Fatalf("after the drop: %+v", st)
	}
	for _, prompt := range [][]int32{freed, held} {
		if got := lookupPrefix(p, 3, prompt, 0); got != 0 {
			t.Fatalf("a prefix found after the drop: %d tokens", got)
		}
		p.Free(3)
	}
	// The held sequence grows past a block: its chain is not registered again.
	mustAlloc(t, p, 2, 6)
	if err := p.Commit(2, 10, seqTokens(11, 6), 0); err != nil {
		t.Fatal(err)
	}
	check(t, p)
	if got := lookupPrefix(p, 4, append(slices.Clone(held), seqTokens(11, 6)...), 0); got != 0 {
		t.Fatalf("the held sequence's later blocks were cached on a dropped chain: %d tokens", got)
	}
	p.Free(4)
	// A new sequence is cached as before.
	startSeq(t, p, 5, freed, 0)
	if got := lookupPrefix(p, 6, freed, 0); got != 8 {
		t.Fatalf("a prompt computed after the drop: %d cached tokens, want 8", got)
	}
}
