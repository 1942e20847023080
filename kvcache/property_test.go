package kvcache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// choices supplies the decisions of a random operation sequence: from a PRNG for the property
// test, from the fuzzer's bytes for FuzzPoolOps.
type choices interface {
	// intn returns a value in [0, n); n > 0.
	intn(n int) int
	done() bool
}

type rngChoices struct {
	r    *rand.Rand
	left int
}

func (c *rngChoices) intn(n int) int { return c.r.IntN(n) }
func (c *rngChoices) done() bool {
	c.left--
	return c.left < 0
}

type byteChoices struct{ b []byte }

func (c *byteChoices) intn(n int) int {
	if len(c.b) == 0 {
		return 0
	}
	v := int(c.b[0])
	c.b = c.b[1:]
	return v % n
}
func (c *byteChoices) done() bool { return len(c.b) == 0 }

// refSeq is the reference model of one sequence: every token it holds, in order.
type refSeq struct {
	hist  []int32
	extra uint64
}

// poolModel drives a Pool with random operations and checks it against a reference model.
// It simulates the K/V storage as one (token id, extra key) pair per slot: each sequence
// "writes" its tokens into the slots of its own blocks, copy-on-write copies slots, and every
// live sequence must read back exactly its own history through its block table at all times.
// Prefix-cache hits therefore must attach blocks that hold exactly the prompt's tokens, and no
// write may ever land in a block another sequence can see.
type poolModel struct {
	t       testing.TB
	p       *Pool
	bs      int
	slotTok []int32
	slotKey []uint64
	seqs    map[SeqID]*refSeq
	live    []SeqID // sorted, for deterministic choices
	nextID  SeqID
	bases   [][]int32 // shared prompt prefixes
	ops     map[string]int
}

func newPoolModel(t testing.TB, cfg PoolConfig, degenerateHash bool) *poolModel {
	p, err := NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if degenerateHash {
		p.hash = func(parent uint64, tokens []int32, _ uint64) uint64 { return parent*31 + uint64(tokens[0]&1) }
	}
	m := &poolModel{
		t: t, p: p, bs: cfg.BlockSizeTokens,
		slotTok: make([]int32, cfg.NumBlocks*cfg.BlockSizeTokens),
		slotKey: make([]uint64, cfg.NumBlocks*cfg.BlockSizeTokens),
		seqs:    map[SeqID]*refSeq{},
		nextID:  1,
		ops:     map[string]int{},
	}
	for i := range 3 {
		m.bases = append(m.bases, seqTokens(1000*(i+1), 3*cfg.BlockSizeTokens+2))
	}
	return m
}

func (m *poolModel) fail(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("%s\nstats %+v", fmt.Sprintf(format, args...), m.p.Stats())
}

// write stores seq's tokens at positions [from, from+len(tokens)) in the simulated storage,
// in every group's block. Every written block must be held by seq alone.
func (m *poolModel) write(seq SeqID, from int, tokens []int32, extra uint64) {
	for g := range m.p.NumGroups() {
		table := m.p.GroupTable(seq, g)
		for i, tok := range tokens {
			pos := from + i
			b := table[pos/m.bs]
			if b == NoBlock || m.p.meta[b].ref != 1 {
				m.fail("sequence %d writes position %d into group %d block %d held by %d", seq, pos, g, b, m.p.meta[max(b, 0)].ref)
			}
			m.slotTok[int(b)*m.bs+pos%m.bs] = tok
			m.slotKey[int(b)*m.bs+pos%m.bs] = extra
		}
	}
}

func (m *poolModel) applyCOW(cow []CopyOp) {
	for _, op := range cow {
		copy(m.slotTok[int(op.Dst)*m.bs:(int(op.Dst)+1)*m.bs], m.slotTok[int(op.Src)*m.bs:])
		copy(m.slotKey[int(op.Dst)*m.bs:(int(op.Dst)+1)*m.bs], m.slotKey[int(op.Src)*m.bs:])
	}
}

// allocate calls Allocate and counts the cached blocks it evicted.
func (m *poolModel) allocate(seq SeqID, n int) ([]CopyOp, bool) {
	before := m.p.Stats().CachedBlocks
	cow, ok := m.p.Allocate(seq, n)
	if after := m.p.Stats().CachedBlocks; after < before {
		if !ok {
			m.fail("failed allocation evicted %d cached blocks", before-after)
		}
		m.ops["evicted"] += before - after
	}
	return cow, ok
}

func (m *poolModel) addLive(seq SeqID, r *refSeq) {
	m.seqs[seq] = r
	i, _ := slices.BinarySearch(m.live, seq)
	m.live = slices.Insert(m.live, i, seq)
}

func (m *poolModel) removeLive(seq SeqID) {
	delete(m.seqs, seq)
	if i, ok := slices.BinarySearch(m.live, seq); ok {
		m.live = slices.Delete(m.live, i, i+1)
	}
}

// randomTokens returns n tokens from a small alphabet, so that equal blocks happen.
func randomTokens(c choices, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(c.intn(4))
	}
	return out
}

func (m *poolModel) step(c choices) {
	switch op := c.intn(10); {
	case op < 3 || len(m.live) == 0:
		m.start(c)
	case op < 6:
		m.append(c)
	case op < 7:
		m.fork(c)
	case op < 9:
		m.free(c)
	default:
		m.pressure(c)
	}
	m.verify()
}

// start admits a new sequence: prefix lookup, allocation of the rest, compute, commit.
func (m *poolModel) start(c choices) {
	m.ops["start"]++
	base := m.bases[c.intn(len(m.bases))]
	prompt := slices.Concat(base[:c.intn(len(base)+1)], randomTokens(c, c.intn(2*m.bs)))
	if len(prompt) == 0 {
		prompt = []int32{5}
	}
	extra := uint64(c.intn(2))
	seq := m.nextID
	m.nextID++
	before := m.p.Stats()
	var hit PrefixHit
	m.p.FindPrefix(&hit, prompt, extra)
	cached := hit.NumTokens()
	if cached < 0 || cached%m.bs != 0 || cached > (len(prompt)-1)/m.bs*m.bs {
		m.fail("lookup of %d tokens returned %d", len(prompt), cached)
	}
	if !m.p.cfg.EnablePrefixCaching && cached != 0 {
		m.fail("lookup hit with caching off")
	}
	if st := m.p.Stats(); st != before {
		m.fail("FindPrefix changed the stats: %+v -> %+v", before, st)
	}
	// The allocation fits when the fresh blocks plus the cached blocks it revives from the
	// free queue are free.
	revive := 0
	for _, hg := range hit.groups {
		for _, b := range hg.blocks {
			if b != NoBlock && m.p.meta[b].ref == 0 {
				revive++
			}
		}
	}
	need := m.p.NumGroups()*((len(prompt)+m.bs-1)/m.bs-cached/m.bs) + revive
	_, cow, ok := m.p.AllocateSlots(seq, &hit, len(prompt)-cached)
	if ok != (need <= before.FreeBlocks) {
		m.fail("AllocateSlots = %v needing %d blocks with %d free", ok, need, before.FreeBlocks)
	}
	if !ok {
		m.ops["start rejected"]++
		if st := m.p.Stats(); st != before || m.p.BlockTable(seq) != nil {
			m.fail("rejected start changed the pool: %+v -> %+v, table %v", before, st, m.p.BlockTable(seq))
		}
		return
	}
	if got := m.p.Stats().PrefixHitsTokens - before.PrefixHitsTokens; got != int64(cached) {
		m.fail("hits counter moved by %d for %d cached tokens", got, cached)
	}
	m.ops["evicted"] += before.CachedBlocks - revive - m.p.Stats().CachedBlocks
	if m.p.cfg.EnablePrefixCaching {
		if got := m.p.Stats().PrefixQueriesTokens - before.PrefixQueriesTokens; got != int64(len(prompt)) {
			m.fail("queries counter moved by %d for a %d-token prompt", got, len(prompt))
		}
	}
	for g := range m.p.NumGroups() {
		table := m.p.GroupTable(seq, g)
		for i := range cached {
			if table[i/m.bs] == NoBlock {
				if i >= m.windowFrom(g, cached) {
					m.fail("prefix hit of %d tokens: group %d has no block for position %d, in the window", cached, g, i)
				}
				continue
			}
			slot := int(table[i/m.bs])*m.bs + i%m.bs
			if m.slotTok[slot] != prompt[i] || m.slotKey[slot] != extra {
				m.fail("prefix hit of %d tokens: group %d position %d holds (%d, %d), prompt has (%d, %d)",
					cached, g, i, m.slotTok[slot], m.slotKey[slot], prompt[i], extra)
			}
		}
	}
	m.ops["hit tokens"] += cached
	if len(cow) != 0 {
		m.fail("new sequence got copy-on-write %v", cow)
	}
	m.write(seq, cached, prompt[cached:], extra)
	if err := m.p.Commit(seq, cached, prompt[cached:], extra); err != nil {
		m.fail("commit: %v", err)
	}
	m.addLive(seq, &refSeq{hist: prompt, extra: extra})
}

// append decodes a few tokens for a live sequence.
func (m *poolModel) append(c choices) {
	if len(m.live) == 0 {
		return
	}
	seq := m.live[c.intn(len(m.live))]
	r := m.seqs[seq]
	n := 1 + c.intn(m.bs+2)
	before := slices.Clone(m.p.BlockTable(seq))
	can := m.p.CanAllocate(seq, n)
	cow, ok := m.allocate(seq, n)
	if ok != can {
		m.fail("CanAllocate = %v but Allocate = %v", can, ok)
	}
	if !ok {
		m.ops["append rejected"]++
		if !slices.Equal(before, m.p.BlockTable(seq)) || m.p.NumTokens(seq) != len(r.hist) {
			m.fail("rejected append changed sequence %d", seq)
		}
		return
	}
	m.ops["append"]++
	m.ops["cow"] += len(cow)
	m.applyCOW(cow)
	toks := randomTokens(c, n)
	from := len(r.hist)
	m.write(seq, from, toks, r.extra)
	if err := m.p.Commit(seq, from, toks, r.extra); err != nil {
		m.fail("commit: %v", err)
	}
	r.hist = append(r.hist, toks...)
}

func (m *poolModel) fork(c choices) {
	if len(m.live) == 0 {
		return
	}
	m.ops["fork"]++
	parent := m.live[c.intn(len(m.live))]
	child := m.nextID
	m.nextID++
	if err := m.p.Fork(parent, child); err != nil {
		m.fail("fork: %v", err)
	}
	r := m.seqs[parent]
	m.addLive(child, &refSeq{hist: slices.Clone(r.hist), extra: r.extra})
}

func (m *poolModel) free(c choices) {
	if len(m.live) == 0 {
		return
	}
	m.ops["free"]++
	seq := m.live[c.intn(len(m.live))]
	m.p.Free(seq)
	if c.intn(2) == 0 {
		m.p.Free(seq) // idempotent
	}
	m.removeLive(seq)
}

// pressure allocates a large unshared sequence, forcing eviction of cached blocks.
func (m *poolModel) pressure(c choices) {
	m.ops["pressure"]++
	seq := m.nextID
	m.nextID++
	toks := randomTokens(c, 1+c.intn(6*m.bs))
	if _, ok := m.allocate(seq, len(toks)); !ok {
		return
	}
	m.write(seq, 0, toks, 9)
	if err := m.p.Commit(seq, 0, toks, 9); err != nil {
		m.fail("commit: %v", err)
	}
	m.addLive(seq, &refSeq{hist: toks, extra: 9})
}

// windowFrom returns the first position group g must still hold of a sequence whose next
// query is at position pos: 0 for a full group, else the start of the block holding the
// window's first position.
func (m *poolModel) windowFrom(g, pos int) int {
	w := m.p.Window(g)
	if w == 0 || pos-w+1 <= 0 {
		return 0
	}
	return (pos - w + 1) / m.bs * m.bs
}

// verify checks the pool's own invariants and the model: every live sequence reads back its
// history (a window group: what its window still reads, and it holds nothing before), reference
// counts match table occurrences, free + used = total.
func (m *poolModel) verify() {
	if err := m.p.CheckInvariants(); err != nil {
		m.fail("%v", err)
	}
	holders := map[BlockID]int{}
	for _, seq := range m.live {
		r := m.seqs[seq]
		for g := range m.p.NumGroups() {
			table := m.p.GroupTable(seq, g)
			if m.p.NumTokens(seq) != len(r.hist) || m.p.NumCommittedTokens(seq) != len(r.hist) ||
				len(table) != (len(r.hist)+m.bs-1)/m.bs {
				m.fail("sequence %d: %d tokens, %d committed, %d blocks in group %d; model has %d tokens",
					seq, m.p.NumTokens(seq), m.p.NumCommittedTokens(seq), len(table), g, len(r.hist))
			}
			from := m.windowFrom(g, len(r.hist))
			for pos, tok := range r.hist {
				b := table[pos/m.bs]
				if (b == NoBlock) != (pos < from) {
					m.fail("sequence %d group %d position %d (window from %d) in block %d", seq, g, pos, from, b)
				}
				if b == NoBlock {
					continue
				}
				slot := int(b)*m.bs + pos%m.bs
				if m.slotTok[slot] != tok || m.slotKey[slot] != r.extra {
					m.fail("sequence %d group %d position %d reads (%d, %d), want (%d, %d)", seq, g, pos, m.slotTok[slot], m.slotKey[slot], tok, r.extra)
				}
			}
			for _, b := range table {
				if b != NoBlock {
					holders[b]++
				}
			}
		}
	}
	for b, n := range holders {
		if int(m.p.meta[b].ref) != n {
			m.fail("block %d held by %d sequences, reference count %d", b, n, m.p.meta[b].ref)
		}
	}
	st := m.p.Stats()
	if st.UsedBlocks != len(holders) || st.FreeBlocks+st.UsedBlocks != st.TotalBlocks {
		m.fail("used %d (model %d), free %d, total %d", st.UsedBlocks, len(holders), st.FreeBlocks, st.TotalBlocks)
	}
}

// finish frees everything and checks that no block leaked and every block is reusable.
func (m *poolModel) finish() {
	for _, seq := range slices.Clone(m.live) {
		m.p.Free(seq)
		m.removeLive(seq)
	}
	m.verify()
	st := m.p.Stats()
	if st.FreeBlocks != st.TotalBlocks || st.UsedBlocks != 0 || len(m.p.seqs) != 0 {
		m.fail("leak at end: %d sequences", len(m.p.seqs))
	}
	per := st.TotalBlocks / m.p.NumGroups()
	if _, ok := m.p.Allocate(m.nextID, per*m.bs); !ok {
		m.fail("cannot allocate the whole pool after freeing everything")
	}
	if got := len(m.p.BlockTable(m.nextID)); got != per || m.p.Stats().FreeBlocks != st.TotalBlocks%m.p.NumGroups() {
		m.fail("whole-pool allocation got %d blocks per group, %d free", got, m.p.Stats().FreeBlocks)
	}
	m.p.Free(m.nextID)
	m.verify()
}

func TestPoolRandomOps(t *testing.T) {
	ops := 10000
	if testing.Short() {
		ops = 500
	}
	tests := []struct {
		name       string
		cfg        PoolConfig
		degenerate bool
	}{
		{"prefix caching", PoolConfig{NumBlocks: 40, BlockSizeTokens: 4, EnablePrefixCaching: true}, false},
		{"colliding hashes", PoolConfig{NumBlocks: 40, BlockSizeTokens: 4, EnablePrefixCaching: true}, true},
		{"block size 1", PoolConfig{NumBlocks: 64, BlockSizeTokens: 1, EnablePrefixCaching: true}, false},
		{"no prefix caching", PoolConfig{NumBlocks: 30, BlockSizeTokens: 3, EnablePrefixCaching: false}, false},
		{"tight pool", PoolConfig{NumBlocks: 9, BlockSizeTokens: 2, EnablePrefixCaching: true}, false},
		{"full and window groups", PoolConfig{NumBlocks: 60, BlockSizeTokens: 4, EnablePrefixCaching: true, Windows: []int{0, 6}}, false},
		{"window groups only", PoolConfig{NumBlocks: 40, BlockSizeTokens: 3, EnablePrefixCaching: true, Windows: []int{5, 5}}, false},
		{"groups, colliding hashes", PoolConfig{NumBlocks: 60, BlockSizeTokens: 2, EnablePrefixCaching: true, Windows: []int{3, 0, 9}}, true},
		{"groups, no prefix caching", PoolConfig{NumBlocks: 50, BlockSizeTokens: 4, Windows: []int{0, 1}}, false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newPoolModel(t, tc.cfg, tc.degenerate)
			c := &rngChoices{r: rand.New(rand.NewPCG(uint64(i)+1, 7)), left: ops}
			for !c.done() {
				m.step(c)
			}
			m.finish()
			t.Logf("ops %v", m.ops)
			if tc.cfg.EnablePrefixCaching && (m.ops["hit tokens"] == 0 || m.ops["evicted"] == 0) {
				t.Error("no prefix hits or evictions: the test does not exercise the cache")
			}
			if (tc.cfg.BlockSizeTokens > 1 && m.ops["cow"] == 0) || m.ops["start rejected"]+m.ops["append rejected"] == 0 {
				t.Errorf("copy-on-write or rejection not exercised: %v", m.ops)
			}
		})
	}
}

// FuzzPoolOps interprets the input as a configuration and a sequence of operations and checks
// the pool against the reference model after every one. Run with
// go test -fuzz FuzzPoolOps ./kvcache/ ; the seed corpus runs in normal tests.
func FuzzPoolOps(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte{3, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0x41, 0, 5, 3, 3, 3, 4, 1, 1, 1, 6, 0, 9, 9, 9, 2, 2, 2, 7, 7, 0, 0, 0, 5, 5})
	f.Add([]byte("fork, append, free, lookup: all of them, again and again"))
	f.Add([]byte{0xff, 0, 1, 2, 0, 1, 2, 6, 6, 6, 3, 3, 3, 3, 0, 0, 0, 0, 9, 9, 9, 9, 9, 4, 4, 8, 8})
	r := rand.New(rand.NewPCG(3, 3))
	for range 4 {
		b := make([]byte, 300)
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > 4096 {
			return
		}
		h := data[0]
		cfg := PoolConfig{
			NumBlocks:           4 + int(h>>3)%24,
			BlockSizeTokens:     1 + int(h)%4,
			EnablePrefixCaching: h&0x40 == 0,
		}
		if h&0x20 != 0 { // a full group and a window group of 1..8 tokens
			cfg.Windows = []int{0, 1 + int(h>>2)%8}
			cfg.NumBlocks *= 2
		}
		m := newPoolModel(t, cfg, h&0x80 != 0)
		c := &byteChoices{b: data[1:]}
		for !c.done() {
			m.step(c)
		}
		m.finish()
	})
}
