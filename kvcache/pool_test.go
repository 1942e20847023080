package kvcache

import (
	"errors"
	"slices"
	"testing"
)

func newTestPool(t testing.TB, blocks, bs int, prefix bool) *Pool {
	t.Helper()
	p, err := NewPool(PoolConfig{NumBlocks: blocks, BlockSizeTokens: bs, EnablePrefixCaching: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func check(t testing.TB, p *Pool) {
	t.Helper()
	if err := p.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

func mustAlloc(t testing.TB, p *Pool, seq SeqID, n int) []CopyOp {
	t.Helper()
	cow, ok := p.Allocate(seq, n)
	if !ok {
		t.Fatalf("Allocate(%d, %d) did not fit (free %d)", seq, n, p.NumFreeBlocks())
	}
	return slices.Clone(cow)
}

// lookupPrefix finds prompt's cached prefix and attaches it to seq (FindPrefix, then
// AllocateSlots of no more tokens). It returns the tokens attached: 0 when the attach fails.
func lookupPrefix(p *Pool, seq SeqID, prompt []int32, extra uint64) int {
	var hit PrefixHit
	p.FindPrefix(&hit, prompt, extra)
	if _, _, ok := p.AllocateSlots(seq, &hit, 0); !ok {
		return 0
	}
	return hit.NumTokens()
}

// seqTokens returns n distinct-ish token ids starting at base.
func seqTokens(base, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(base + i)
	}
	return out
}

// startSeq runs a prompt through lookup, allocation and commit, as the scheduler does.
func startSeq(t testing.TB, p *Pool, seq SeqID, prompt []int32, extra uint64) (cached int) {
	t.Helper()
	var hit PrefixHit
	p.FindPrefix(&hit, prompt, extra)
	cached = hit.NumTokens()
	table, cow, ok := p.AllocateSlots(seq, &hit, len(prompt)-cached)
	if !ok || cow != nil || !slices.Equal(table, p.BlockTable(seq)) {
		t.Fatalf("AllocateSlots(%d, %d cached, %d) = %v, %v, %v", seq, cached, len(prompt)-cached, table, cow, ok)
	}
	if err := p.Commit(seq, cached, prompt[cached:], extra); err != nil {
		t.Fatal(err)
	}
	check(t, p)
	return cached
}

func TestNumBlocksForBudget(t *testing.T) {
	tests := []struct {
		name                   string
		budget                 int64
		bs, layers, heads, dim int
		dt                     DType
		want                   int
	}{
		{"exact", 2 * 8 * 4 * 16 * 64 * 4 * 10, 16, 8, 4, 64, Float32, 10},
		{"rounds down", 2*8*4*16*64*4*10 - 1, 16, 8, 4, 64, Float32, 9},
		{"float16 doubles", 2 * 8 * 4 * 16 * 64 * 4 * 10, 16, 8, 4, 64, Float16, 20},
		{"too small", 100, 16, 8, 4, 64, Float32, 0},
		{"zero budget", 0, 16, 8, 4, 64, Float32, 0},
		{"negative budget", -5, 16, 8, 4, 64, Float32, 0},
		{"bad shape", 1 << 30, 16, 0, 4, 64, Float32, 0},
		{"bad dtype", 1 << 30, 16, 8, 4, 64, DType(7), 0},
		{"capped", 1 << 62, 1, 1, 1, 1, Float16, maxBlocks},
		{"overflowing shape", 1 << 62, 1 << 20, 1 << 20, 1 << 20, 1 << 20, Float32, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := NumBlocksForBudget(tc.budget, tc.bs, tc.layers, tc.heads, tc.dim, tc.dt); got != tc.want {
				t.Errorf("NumBlocksForBudget = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPoolConfigValidate(t *testing.T) {
	ok := PoolConfig{NumBlocks: 10, BlockSizeTokens: 16, EnablePrefixCaching: true}
	tests := []struct {
		name    string
		mutate  func(*PoolConfig)
		wantErr bool
	}{
		{"valid", func(*PoolConfig) {}, false},
		{"no blocks", func(c *PoolConfig) { c.NumBlocks = 0 }, true},
		{"negative blocks", func(c *PoolConfig) { c.NumBlocks = -1 }, true},
		{"zero block size", func(c *PoolConfig) { c.BlockSizeTokens = 0 }, true},
		{"huge block size", func(c *PoolConfig) { c.BlockSizeTokens = 1 << 20 }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mutate(&c)
			err := c.Validate()
			if (err != nil) != tc.wantErr {
				t.Fatalf("Validate() = %v, wantErr %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if _, err := NewPool(c); (err != nil) != tc.wantErr {
				t.Errorf("NewPool error = %v, wantErr %v", err, tc.wantErr)
			}
		})
	}
}

func TestAllocateGrowth(t *testing.T) {
	tests := []struct {
		name       string
		steps      []int // successive Allocate sizes
		wantBlocks int
		wantTokens int
	}{
		{"empty", []int{0}, 0, 0},
		{"one token", []int{1}, 1, 1},
		{"exactly one block", []int{4}, 1, 4},
		{"one past a block", []int{5}, 2, 5},
		{"decode steps cross a boundary", []int{3, 1, 1}, 2, 5},
		{"prompt then decode", []int{10, 1, 1, 1}, 4, 13},
		{"fills the pool", []int{32}, 8, 32},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, 8, 4, false)
			for _, n := range tc.steps {
				if cow := mustAlloc(t, p, 1, n); len(cow) != 0 {
					t.Fatalf("unexpected copy-on-write %v", cow)
				}
				check(t, p)
			}
			if got := len(p.BlockTable(1)); got != tc.wantBlocks {
				t.Errorf("blocks = %d, want %d", got, tc.wantBlocks)
			}
			if got := p.NumTokens(1); got != tc.wantTokens {
				t.Errorf("tokens = %d, want %d", got, tc.wantTokens)
			}
			if st := p.Stats(); st.UsedBlocks != tc.wantBlocks || st.FreeBlocks != 8-tc.wantBlocks {
				t.Errorf("stats %+v", st)
			}
			p.Free(1)
			check(t, p)
			if st := p.Stats(); st.FreeBlocks != 8 {
				t.Errorf("after free: %+v", st)
			}
		})
	}
}

func TestAllocateDoesNotFitChangesNothing(t *testing.T) {
	p := newTestPool(t, 4, 4, true)
	mustAlloc(t, p, 1, 6) // 2 blocks
	table := slices.Clone(p.BlockTable(1))
	before := p.Stats()
	tests := []struct {
		seq SeqID
		n   int
	}{{1, 11}, {1, 100}, {1, -1}, {2, 9}, {2, -3}}
	for _, tc := range tests {
		if p.CanAllocate(tc.seq, tc.n) {
			t.Errorf("CanAllocate(%d, %d) = true", tc.seq, tc.n)
		}
		if cow, ok := p.Allocate(tc.seq, tc.n); ok || cow != nil {
			t.Errorf("Allocate(%d, %d) = %v, %v; want nil, false", tc.seq, tc.n, cow, ok)
		}
	}
	if !slices.Equal(p.BlockTable(1), table) || p.NumTokens(1) != 6 || p.Stats() != before {
		t.Errorf("failed allocation changed state: table %v tokens %d stats %+v", p.BlockTable(1), p.NumTokens(1), p.Stats())
	}
	if p.BlockTable(2) != nil || p.NumTokens(2) != 0 {
		t.Error("failed allocation created a sequence")
	}
	check(t, p)
	// The largest allocation that fits still does.
	if !p.CanAllocate(1, 10) {
		t.Error("CanAllocate(1, 10) = false with 2 blocks free")
	}
	mustAlloc(t, p, 1, 10)
	check(t, p)
}

func TestFreeIdempotentAndTailFirst(t *testing.T) {
	p := newTestPool(t, 6, 4, true)
	prompt := seqTokens(100, 13) // blocks 0..2 full, block 3 partial
	startSeq(t, p, 1, prompt, 0)
	table := slices.Clone(p.BlockTable(1))
	mustAlloc(t, p, 2, 8) // the two remaining blocks
	p.Free(1)
	p.Free(1)
	p.Free(99)
	check(t, p)
	st := p.Stats()
	if st.FreeBlocks != 4 || st.CachedBlocks != 3 || st.UsedBlocks != 2 {
		t.Fatalf("stats %+v", st)
	}
	// The uncached partial block is reused first, then cached blocks in LRU order: the
	// sequence's tail (freed first) before its head.
	want := []BlockID{table[3], table[2], table[1], table[0]}
	for i, w := range want {
		mustAlloc(t, p, 3, 4)
		if got := p.BlockTable(3)[i]; got != w {
			t.Fatalf("allocation %d took block %d, want %d (table %v)", i, got, w, table)
		}
		check(t, p)
	}
	if st := p.Stats(); st.CachedBlocks != 0 || st.FreeBlocks != 0 {
		t.Fatalf("after evicting everything: %+v", st)
	}
	// Evicted blocks no longer hit.
	if got := lookupPrefix(p, 4, prompt, 0); got != 0 {
		t.Errorf("lookup after eviction hit %d tokens", got)
	}
}

func TestForkCopyOnWrite(t *testing.T) {
	tests := []struct {
		name         string
		prompt       int
		wantCOW      bool
		appendParent bool
	}{
		{"partial last block, child appends", 6, true, false},
		{"partial last block, parent appends", 6, true, true},
		{"full last block", 8, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, 8, 4, true)
			startSeq(t, p, 1, seqTokens(0, tc.prompt), 0)
			if err := p.Fork(1, 2); err != nil {
				t.Fatal(err)
			}
			check(t, p)
			if !slices.Equal(p.BlockTable(1), p.BlockTable(2)) || p.NumTokens(2) != tc.prompt {
				t.Fatalf("fork: parent %v child %v", p.BlockTable(1), p.BlockTable(2))
			}
			writer, other := SeqID(2), SeqID(1)
			if tc.appendParent {
				writer, other = 1, 2
			}
			otherTable := slices.Clone(p.BlockTable(other))
			before := slices.Clone(p.BlockTable(writer))
			cow := mustAlloc(t, p, writer, 1)
			check(t, p)
			if !slices.Equal(p.BlockTable(other), otherTable) {
				t.Errorf("other sequence's table changed: %v -> %v", otherTable, p.BlockTable(other))
			}
			after := p.BlockTable(writer)
			if !tc.wantCOW {
				if len(cow) != 0 || !slices.Equal(after[:len(before)], before) {
					t.Fatalf("unexpected copy %v, table %v", cow, after)
				}
				return
			}
			last := len(before) - 1
			if len(cow) != 1 || cow[0].Src != before[last] || cow[0].Dst != after[last] || after[last] == before[last] {
				t.Fatalf("cow = %v, table %v -> %v", cow, before, after)
			}
			if !slices.Equal(after[:last], before[:last]) {
				t.Errorf("full blocks changed: %v -> %v", before, after)
			}
			// Now private: the next append copies nothing.
			if cow := mustAlloc(t, p, writer, 1); len(cow) != 0 {
				t.Errorf("second append copied %v", cow)
			}
		})
	}
}

func TestForkErrors(t *testing.T) {
	p := newTestPool(t, 8, 4, false)
	mustAlloc(t, p, 1, 5)
	mustAlloc(t, p, 3, 1)
	for _, tc := range []struct {
		parent, child SeqID
	}{{9, 2}, {1, 1}, {1, 3}} {
		if err := p.Fork(tc.parent, tc.child); !errors.Is(err, ErrInvalid) {
			t.Errorf("Fork(%d, %d) = %v, want ErrInvalid", tc.parent, tc.child, err)
		}
	}
	check(t, p)
	if p.NumTokens(3) != 1 {
		t.Error("failed fork changed the target")
	}
}

func TestCommitErrors(t *testing.T) {
	p := newTestPool(t, 8, 4, true)
	mustAlloc(t, p, 1, 6)
	if err := p.Commit(1, 0, seqTokens(0, 3), 0); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		seq     SeqID
		from, n int
		wantErr bool
	}{
		{"unknown sequence", 2, 0, 1, true},
		{"gap", 1, 4, 1, true},
		{"negative from", 1, -1, 2, true},
		{"beyond allocation", 1, 3, 4, true},
		{"fully overlapping", 1, 0, 3, false},
		{"empty", 1, 3, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := p.Commit(tc.seq, tc.from, seqTokens(tc.from, tc.n), 0)
			if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, ErrInvalid)) {
				t.Fatalf("Commit = %v, wantErr %v", err, tc.wantErr)
			}
			if p.NumCommittedTokens(1) != 3 {
				t.Errorf("committed = %d, want 3", p.NumCommittedTokens(1))
			}
			check(t, p)
		})
	}
	// A partly overlapping commit records only the new tokens.
	if err := p.Commit(1, 1, seqTokens(1, 4), 0); err != nil || p.NumCommittedTokens(1) != 5 {
		t.Fatalf("overlapping commit: %v, committed %d", err, p.NumCommittedTokens(1))
	}
	check(t, p)
	if got := lookupPrefix(p, 2, seqTokens(0, 9), 0); got != 4 {
		t.Errorf("lookup after overlapping commit = %d, want 4", got)
	}
}

func TestStats(t *testing.T) {
	p := newTestPool(t, 10, 4, true)
	startSeq(t, p, 1, seqTokens(0, 9), 0) // 3 blocks, 2 registered
	mustAlloc(t, p, 2, 4)
	want := Stats{TotalBlocks: 10, FreeBlocks: 6, UsedBlocks: 4, UsedFraction: 0.4, PrefixQueriesTokens: 9}
	if got := p.Stats(); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
	p.Free(1)
	want = Stats{TotalBlocks: 10, FreeBlocks: 9, CachedBlocks: 2, UsedBlocks: 1, UsedFraction: 0.1, PrefixQueriesTokens: 9}
	if got := p.Stats(); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
}

func TestCheckInvariantsDetectsCorruption(t *testing.T) {
	tests := []struct {
		name    string
		corrupt func(p *Pool, a, b []BlockID)
	}{
		{"negative ref count", func(p *Pool, a, _ []BlockID) { p.meta[a[0]].ref = -1 }},
		{"ref count too high", func(p *Pool, a, _ []BlockID) { p.meta[a[0]].ref++ }},
		{"block in two tables without sharing", func(p *Pool, a, _ []BlockID) {
			p.seqs[2].tables[0].blocks[0] = a[0]
		}},
		{"free block in a table", func(p *Pool, _, _ []BlockID) {
			st := p.seqs[2]
			st.tables[0].blocks[0] = BlockID(p.free.next[p.free.sentinel()])
		}},
		{"used block on the free queue", func(p *Pool, a, _ []BlockID) { p.free.pushBack(int32(a[1])) }},
		{"free block off the queue", func(p *Pool, _, _ []BlockID) {
			p.free.remove(p.free.next[p.free.sentinel()])
		}},
		{"broken free links", func(p *Pool, _, _ []BlockID) {
			f := p.free.next[p.free.sentinel()]
			p.free.prev[p.free.next[f]] = p.free.sentinel()
		}},
		{"free counter", func(p *Pool, _, _ []BlockID) { p.free.n-- }},
		{"used counter", func(p *Pool, _, _ []BlockID) { p.used++ }},
		{"cache entry to the wrong block", func(p *Pool, a, b []BlockID) {
			p.cache[p.meta[a[0]].hash] = b[1]
		}},
		{"registered block missing from the cache", func(p *Pool, a, _ []BlockID) {
			delete(p.cache, p.meta[a[0]].hash)
		}},
		{"registered partial block", func(p *Pool, a, _ []BlockID) {
			m := &p.meta[a[2]]
			m.regID, m.hash = p.nextReg, 12345
			p.cache[12345] = a[2]
		}},
		{"table too short", func(p *Pool, _, _ []BlockID) { p.seqs[1].numTokens += 8 }},
		{"committed beyond allocation", func(p *Pool, _, _ []BlockID) { p.seqs[1].committed = 100 }},
		{"cached counter", func(p *Pool, _, _ []BlockID) { p.cachedFree++ }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, 16, 4, true)
			startSeq(t, p, 1, seqTokens(0, 10), 0)
			startSeq(t, p, 2, seqTokens(50, 10), 0)
			check(t, p)
			tc.corrupt(p, slices.Clone(p.BlockTable(1)), slices.Clone(p.BlockTable(2)))
			err := p.CheckInvariants()
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("CheckInvariants() = %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestTruncate: dropping uncommitted slots (rejected proposals) gives back the blocks only
// they held, keeps the rest, refuses to cut into committed tokens or past the allocated
// ones, and leaves a pool whose invariants hold and whose sequence grows on as before.
func TestTruncate(t *testing.T) {
	p := newTestPool(t, 8, 4, true)
	toks := seqTokens(3, 6)
	mustAlloc(t, p, 1, 6)
	if err := p.Commit(1, 0, toks, 0); err != nil {
		t.Fatal(err)
	}
	mustAlloc(t, p, 1, 5) // 11 slots: 3 blocks
	if got := p.Stats().UsedBlocks; got != 3 {
		t.Fatalf("%d blocks used, want 3", got)
	}
	if err := p.Truncate(1, 5); !errors.Is(err, ErrInvalid) {
		t.Fatalf("truncating into committed tokens: %v", err)
	}
	if err := p.Truncate(1, 12); !errors.Is(err, ErrInvalid) {
		t.Fatalf("truncating past the allocated slots: %v", err)
	}
	if err := p.Truncate(1, 7); err != nil {
		t.Fatal(err)
	}
	check(t, p)
	if st := p.Stats(); st.UsedBlocks != 2 || p.NumTokens(1) != 7 || len(p.BlockTable(1)) != 2 {
		t.Fatalf("after truncating to 7: %+v, %d tokens, table %v", st, p.NumTokens(1), p.BlockTable(1))
	}
	mustAlloc(t, p, 1, 2)
	if err := p.Commit(1, 6, seqTokens(4, 3), 0); err != nil {
		t.Fatal(err)
	}
	check(t, p)
	if err := p.Truncate(9, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown sequence: %v", err)
	}
}
