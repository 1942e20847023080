package kvcache

import (
	"fmt"
	"math"
	"runtime"
	"sync"
)

// parallelMinBytes is the amount of data a gather or scatter must move before it is split
// across goroutines; below it, starting goroutines costs more than it saves.
const parallelMinBytes = 256 << 10

// StorageConfig describes the K/V arenas.
type StorageConfig struct {
	NumBlocks       int   // same as the pool's
	BlockSizeTokens int   // same as the pool's
	Layers          int   // transformer layers
	KVHeads         int   // key/value heads per layer
	HeadDim         int   // values per head
	DType           DType // element type
	Parallelism     int   // goroutines for large gathers/scatters; 0 = GOMAXPROCS, 1 = never split

	// LayerGroups, when set, names each layer's group in the pool (PoolConfig.Windows);
	// every group must have the same number of layers, and a block holds that many layers
	// (the block of a group stores its layers, in order). nil: one group of every layer.
	LayerGroups []int

	// TokenMajor lays every block out [blockSizeTokens][kvHead][headDim] instead of
	// [kvHead][blockSizeTokens][headDim]: the layout of ONNX Runtime's PagedAttention
	// cache, [num_blocks, block_size, kv_heads, head_dim], which the step graph reads and
	// writes in place. Gather and Scatter take the head-major layout only.
	TokenMajor bool

	// NoArenas allocates nothing: the blocks live on a device (a GPU) that the model owns,
	// and the storage only describes them. LayerK and LayerV return nil, and CopyBlock,
	// Gather and Scatter fail.
	NoArenas bool
}

// slots returns the layers a block holds and each layer's place among them.
func (c StorageConfig) slots() (n int, slot []int, err error) {
	slot = make([]int, c.Layers)
	if c.LayerGroups == nil {
		for l := range slot {
			slot[l] = l
		}
		return c.Layers, slot, nil
	}
	if len(c.LayerGroups) != c.Layers {
		return 0, nil, fmt.Errorf("%w: %d layer groups for %d layers", ErrInvalid, len(c.LayerGroups), c.Layers)
	}
	var count []int
	for l, g := range c.LayerGroups {
		if g < 0 || g >= maxGroups {
			return 0, nil, fmt.Errorf("%w: layer %d in group %d", ErrInvalid, l, g)
		}
		for len(count) <= g {
			count = append(count, 0)
		}
		slot[l] = count[g]
		count[g]++
	}
	for g, k := range count {
		if k != count[0] {
			return 0, nil, fmt.Errorf("%w: group %d has %d layers, group 0 has %d: groups must be equal", ErrInvalid, g, k, count[0])
		}
	}
	return count[0], slot, nil
}

// NumGroups returns the number of layer groups (1 without LayerGroups).
func (c StorageConfig) NumGroups() int {
	n := 1
	for _, g := range c.LayerGroups {
		n = max(n, g+1)
	}
	return n
}

// Validate reports whether the configuration can build a Storage.
func (c StorageConfig) Validate() error {
	if c.NumBlocks <= 0 || c.NumBlocks > maxBlocks {
		return fmt.Errorf("%w: NumBlocks %d must be in [1, %d]", ErrInvalid, c.NumBlocks, maxBlocks)
	}
	if c.BlockSizeTokens <= 0 || c.Layers <= 0 || c.KVHeads <= 0 || c.HeadDim <= 0 {
		return fmt.Errorf("%w: BlockSizeTokens %d, Layers %d, KVHeads %d, HeadDim %d must be positive",
			ErrInvalid, c.BlockSizeTokens, c.Layers, c.KVHeads, c.HeadDim)
	}
	if c.DType.Size() == 0 {
		return fmt.Errorf("%w: unknown dtype %v", ErrInvalid, c.DType)
	}
	if c.Parallelism < 0 {
		return fmt.Errorf("%w: Parallelism %d must be >= 0", ErrInvalid, c.Parallelism)
	}
	slots, _, err := c.slots()
	if err != nil {
		return err
	}
	if all, ok := mulPositive(2, slots, c.NumBlocks, c.KVHeads, c.BlockSizeTokens, c.HeadDim, c.DType.Size()); !ok || all > math.MaxInt {
		return fmt.Errorf("%w: %d layers of %d blocks of %d heads x %d tokens x %d values do not fit in memory",
			ErrInvalid, c.Layers, c.NumBlocks, c.KVHeads, c.BlockSizeTokens, c.HeadDim)
	}
	return nil
}

// Storage holds the K and V arenas of every layer. Each arena is laid out
// [block][kvHead][blockSizeTokens][headDim], so one (block, kv head) pair is one contiguous
// run of blockSizeTokens*headDim values and a whole block is one contiguous run per layer
// (or, with StorageConfig.TokenMajor, [block][blockSizeTokens][kvHead][headDim]).
// With layer groups (StorageConfig.LayerGroups) a block belongs to one group at a time and
// holds its layers: the layers in the same place of every group share one arena.
// Gather and Scatter may use several goroutines internally, but a Storage must not be used
// from two goroutines at once.
type Storage struct {
	cfg   StorageConfig
	k     [][]byte       // per slot (a layer's place in its group)
	v     [][]byte       // per slot
	slot  []int          // per layer
	group []int          // per layer
	ngrp  int            // cfg.NumGroups()
	one   [1][][]BlockID // Gather's and Scatter's tables as one group, without allocating

	release *arenaRelease

	elem      int // bytes per element
	tokBytes  int // bytes of one token of one head: headDim * elem
	headBytes int // bytes of one (block, head) run: blockSizeTokens * tokBytes
	blkBytes  int // bytes of one block in one layer's arena: kvHeads * headBytes
	par       int // goroutines for large jobs

	wg sync.WaitGroup
	// The running job, read by the worker goroutines.
	job storageJob
}

// storageJob holds one Gather or Scatter call's arguments for the worker goroutines.
type storageJob struct {
	scatter   bool
	tables    [][][]BlockID // [group][row]
	lens      []int         // gather: pastLens; scatter: counts
	startPos  []int         // scatter only
	tokens    int           // gather: maxPast; scatter: srcTokens
	srcOffset int           // scatter only
	k, v      [][]byte
}

// NewStorage allocates the arenas: NumBlocks * BlockBytes(...) bytes in all.
func NewStorage(cfg StorageConfig) (*Storage, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	slots, slot, _ := cfg.slots()
	s := &Storage{cfg: cfg, elem: cfg.DType.Size(), slot: slot, group: make([]int, cfg.Layers)}
	copy(s.group, cfg.LayerGroups)
	s.ngrp = cfg.NumGroups()
	s.tokBytes = cfg.HeadDim * s.elem
	s.headBytes = cfg.BlockSizeTokens * s.tokBytes
	s.blkBytes = cfg.KVHeads * s.headBytes
	s.par = cfg.Parallelism
	if s.par == 0 {
		s.par = runtime.GOMAXPROCS(0)
	}
	if cfg.NoArenas {
		s.release = &arenaRelease{f: func() {}}
		return s, nil
	}
	s.k = make([][]byte, slots)
	s.v = make([][]byte, slots)
	arena := cfg.NumBlocks * s.blkBytes
	mem, release := allocArena(2 * slots * arena)
	for l := range slots {
		s.k[l] = mem[2*l*arena : (2*l+1)*arena : (2*l+1)*arena]
		s.v[l] = mem[(2*l+1)*arena : (2*l+2)*arena : (2*l+2)*arena]
	}
	// The arenas live until Close, or as long as the Storage if it is never closed:
	// LayerK and LayerV hand them out for one step at a time, never to be kept.
	s.release = &arenaRelease{f: release}
	runtime.AddCleanup(s, func(r *arenaRelease) { r.do() }, s.release)
	return s, nil
}

// arenaRelease unmaps the arenas once, whether Close or the cleanup comes first.
type arenaRelease struct {
	once sync.Once
	f    func()
}

func (r *arenaRelease) do() { r.once.Do(r.f) }

// Close gives the arenas' memory back now, rather than when the garbage collector finds
// the Storage unreachable (it does not see the arenas, which are outside its heap, so a
// process that makes storages one after another would hold them all until it ran). The
// Storage must not be used after Close; a later Gather, Scatter or CopyBlock fails.
func (s *Storage) Close() {
	s.k, s.v = nil, nil
	s.release.do()
}

// Config returns the storage's configuration.
func (s *Storage) Config() StorageConfig { return s.cfg }

// LayerK returns layer l's K arena, laid out [block][kvHead][blockSizeTokens][headDim]. It is
// the storage itself, not a copy: for attention kernels that read blocks in place. It is
// valid while the Storage is reachable.
func (s *Storage) LayerK(l int) []byte {
	if s.k == nil {
		return nil // closed
	}
	return s.k[s.slot[l]]
}

// LayerV returns layer l's V arena; see LayerK.
func (s *Storage) LayerV(l int) []byte {
	if s.v == nil {
		return nil
	}
	return s.v[s.slot[l]]
}

// NumGroups returns the number of layer groups (StorageConfig.NumGroups).
func (s *Storage) NumGroups() int { return s.ngrp }

// LayerGroup returns layer l's group: the block table its blocks are named by.
func (s *Storage) LayerGroup(l int) int { return s.group[l] }

func (s *Storage) validBlock(b BlockID) bool { return b >= 0 && int(b) < s.cfg.NumBlocks && s.k != nil }

// CopyBlock copies block src's K and V, all the layers it holds, into block dst.
func (s *Storage) CopyBlock(src, dst BlockID) error {
	if !s.validBlock(src) || !s.validBlock(dst) {
		return fmt.Errorf("%w: copy block %d to %d in a pool of %d", ErrInvalid, src, dst, s.cfg.NumBlocks)
	}
	if src == dst {
		return nil
	}
	so, do := int(src)*s.blkBytes, int(dst)*s.blkBytes
	for l := range s.k {
		copy(s.k[l][do:do+s.blkBytes], s.k[l][so:so+s.blkBytes])
		copy(s.v[l][do:do+s.blkBytes], s.v[l][so:so+s.blkBytes])
	}
	return nil
}

// ApplyCopies performs the copy-on-write copies returned by Pool.Allocate, in order.
func (s *Storage) ApplyCopies(ops []CopyOp) error {
	for _, op := range ops {
		if err := s.CopyBlock(op.Src, op.Dst); err != nil {
			return err
		}
	}
	return nil
}

// checkDense validates per-layer dense buffers of rows*kvHeads*tokens*headDim elements.
func (s *Storage) checkDense(what string, k, v [][]byte, rows, tokens int) error {
	if s.k == nil {
		return fmt.Errorf("%w: %s on a closed storage", ErrInvalid, what)
	}
	if len(k) != s.cfg.Layers || len(v) != s.cfg.Layers {
		return fmt.Errorf("%w: %s got %d K and %d V layers, want %d", ErrInvalid, what, len(k), len(v), s.cfg.Layers)
	}
	want := rows * s.cfg.KVHeads * tokens * s.tokBytes
	for l := range s.cfg.Layers {
		if len(k[l]) != want || len(v[l]) != want {
			return fmt.Errorf("%w: %s layer %d buffers hold %d and %d bytes, want %d", ErrInvalid, what, l, len(k[l]), len(v[l]), want)
		}
	}
	return nil
}

// checkSpan validates that table covers positions [from, from+n) with blocks inside the
// pool (or NoBlock, when noBlockOK).
func (s *Storage) checkSpan(what string, row int, table []BlockID, from, n int, noBlockOK bool) error {
	if n == 0 {
		return nil
	}
	bs := s.cfg.BlockSizeTokens
	if from < 0 || n < 0 || from+n > len(table)*bs {
		return fmt.Errorf("%w: %s row %d positions [%d, %d) beyond its %d blocks", ErrInvalid, what, row, from, from+n, len(table))
	}
	for j := from / bs; j <= (from+n-1)/bs; j++ {
		if !s.validBlock(table[j]) && !(noBlockOK && table[j] == NoBlock) {
			return fmt.Errorf("%w: %s row %d names block %d outside the pool", ErrInvalid, what, row, table[j])
		}
	}
	return nil
}

// Gather writes each row's past into dense [batch, kvHeads, maxPast, headDim] buffers, one per
// layer: row b takes positions [0, pastLens[b]) from tables[b]; positions at or beyond
// pastLens[b] are zeroed. len(k) == len(v) == Layers and each buffer holds exactly
// batch*kvHeads*maxPast*headDim elements, batch = len(tables). It allocates no buffers; large
// gathers are split across goroutines, all finished before it returns. A bad call returns an
// error wrapping ErrInvalid and writes nothing. With layer groups, see GatherGroups.
func (s *Storage) Gather(tables [][]BlockID, pastLens []int, maxPast int, k, v [][]byte) error {
	s.one[0] = tables
	defer func() { s.one[0] = nil }()
	return s.GatherGroups(s.one[:], pastLens, maxPast, k, v)
}

// GatherGroups is Gather with one set of row tables per layer group: tables[g][b] is row
// b's block table of group g. A NoBlock entry (a window group's position its window has
// passed) reads as zeros.
func (s *Storage) GatherGroups(tables [][][]BlockID, pastLens []int, maxPast int, k, v [][]byte) error {
	if err := s.checkGroups(tables); err != nil {
		return err
	}
	rows := len(tables[0])
	if len(pastLens) != rows || maxPast < 0 {
		return fmt.Errorf("%w: gather of %d tables with %d past lengths, maxPast %d", ErrInvalid, rows, len(pastLens), maxPast)
	}
	if err := s.checkDense("gather", k, v, rows, maxPast); err != nil {
		return err
	}
	for _, gt := range tables {
		for b, t := range gt {
			if pastLens[b] < 0 || pastLens[b] > maxPast {
				return fmt.Errorf("%w: gather row %d past %d outside [0, %d]", ErrInvalid, b, pastLens[b], maxPast)
			}
			if err := s.checkSpan("gather", b, t, 0, pastLens[b], true); err != nil {
				return err
			}
		}
	}
	s.job = storageJob{tables: tables, lens: pastLens, tokens: maxPast, k: k, v: v}
	// Every destination byte is written once (copied or zeroed) and most are read once.
	s.run(rows, 2*s.cfg.Layers*rows*s.cfg.KVHeads*maxPast*s.tokBytes)
	return nil
}

// checkGroups validates that tables has one set of row tables per group, all as many.
func (s *Storage) checkGroups(tables [][][]BlockID) error {
	if s.cfg.TokenMajor {
		return fmt.Errorf("%w: a token-major storage is read and written in place by the step graph, not gathered or scattered", ErrInvalid)
	}
	if len(tables) != s.ngrp {
		return fmt.Errorf("%w: %d groups of tables for a storage of %d groups", ErrInvalid, len(tables), s.ngrp)
	}
	for g := range tables {
		if len(tables[g]) != len(tables[0]) {
			return fmt.Errorf("%w: group %d has %d row tables, group 0 has %d", ErrInvalid, g, len(tables[g]), len(tables[0]))
		}
	}
	return nil
}

// Scatter stores row b's new K/V for all layers: the dense [batch, kvHeads, srcTokens, headDim]
// buffers k[l], v[l] hold them at token columns [srcOffset, srcOffset+counts[b]); they go to
// positions [startPos[b], startPos[b]+counts[b]) of tables[b]. Rows with counts[b] == 0 are
// skipped. Rows must not write to the same block (the pool's copy-on-write guarantees this
// for blocks being appended to). A bad call returns an error wrapping ErrInvalid and writes
// nothing. With layer groups, see ScatterGroups.
func (s *Storage) Scatter(tables [][]BlockID, startPos, counts []int, srcTokens, srcOffset int, k, v [][]byte) error {
	s.one[0] = tables
	defer func() { s.one[0] = nil }()
	return s.ScatterGroups(s.one[:], startPos, counts, srcTokens, srcOffset, k, v)
}

// ScatterGroups is Scatter with one set of row tables per layer group (see GatherGroups).
func (s *Storage) ScatterGroups(tables [][][]BlockID, startPos, counts []int, srcTokens, srcOffset int, k, v [][]byte) error {
	if err := s.checkGroups(tables); err != nil {
		return err
	}
	rows := len(tables[0])
	if len(startPos) != rows || len(counts) != rows || srcTokens < 0 || srcOffset < 0 {
		return fmt.Errorf("%w: scatter of %d tables with %d start positions, %d counts, srcTokens %d, srcOffset %d",
			ErrInvalid, rows, len(startPos), len(counts), srcTokens, srcOffset)
	}
	if err := s.checkDense("scatter", k, v, rows, srcTokens); err != nil {
		return err
	}
	total := 0
	for b := range rows {
		if counts[b] < 0 || srcOffset+counts[b] > srcTokens {
			return fmt.Errorf("%w: scatter row %d columns [%d, %d) outside %d", ErrInvalid, b, srcOffset, srcOffset+counts[b], srcTokens)
		}
		for _, gt := range tables {
			if err := s.checkSpan("scatter", b, gt[b], startPos[b], counts[b], false); err != nil {
				return err
			}
		}
		total += counts[b]
	}
	s.job = storageJob{scatter: true, tables: tables, lens: counts, startPos: startPos, tokens: srcTokens, srcOffset: srcOffset, k: k, v: v}
	s.run(rows, 2*s.cfg.Layers*s.cfg.KVHeads*total*s.tokBytes)
	return nil
}

// run executes s.job over layers x rows units, on several goroutines when it moves more than
// parallelMinBytes, and returns when every unit is done.
func (s *Storage) run(rows, bytes int) {
	units := s.cfg.Layers * rows
	workers := min(s.par, units)
	if bytes < parallelMinBytes || workers <= 1 {
		s.runUnits(0, units)
		s.job = storageJob{}
		return
	}
	s.wg.Add(workers - 1)
	for w := 1; w < workers; w++ {
		go s.worker(w*units/workers, (w+1)*units/workers)
	}
	s.runUnits(0, units/workers)
	s.wg.Wait()
	s.job = storageJob{}
}

func (s *Storage) worker(lo, hi int) {
	defer s.wg.Done()
	s.runUnits(lo, hi)
}

// runUnits does units [lo, hi) of s.job; unit u is layer u/rows, row u%rows.
func (s *Storage) runUnits(lo, hi int) {
	rows := len(s.job.tables[0])
	for u := lo; u < hi; u++ {
		l, b := u/rows, u%rows
		if s.job.scatter {
			s.scatterRow(l, b)
		} else {
			s.gatherRow(l, b)
		}
	}
}

// gatherRow copies row b's past of layer l, K and V, and zeroes the padding after it.
func (s *Storage) gatherRow(l, b int) {
	j := &s.job
	past, maxPast := j.lens[b], j.tokens
	table := j.tables[s.group[l]][b]
	rowBytes := maxPast * s.tokBytes // one head of one row in the dense buffer
	lo := b * s.cfg.KVHeads * rowBytes
	s.gatherHeads(j.k[l][lo:lo+s.cfg.KVHeads*rowBytes], s.LayerK(l), table, past, rowBytes)
	s.gatherHeads(j.v[l][lo:lo+s.cfg.KVHeads*rowBytes], s.LayerV(l), table, past, rowBytes)
}

// gatherHeads copies positions [0, past) of every head from arena into dst, one head after
// another rowBytes apart, and zeroes the rest of each head's row.
func (s *Storage) gatherHeads(dst, arena []byte, table []BlockID, past, rowBytes int) {
	pastBytes := past * s.tokBytes
	// Block by block, every head of a block in turn: the block's bytes are read in order
	// (one run of KVHeads*headBytes), which keeps the reads sequential within a page.
	for i, off := 0, 0; off < pastBytes; i++ {
		n := min(s.headBytes, pastBytes-off)
		if table[i] == NoBlock {
			for h := range s.cfg.KVHeads {
				clear(dst[h*rowBytes+off : h*rowBytes+off+n])
			}
			off += n
			continue
		}
		so := int(table[i]) * s.blkBytes
		for h := range s.cfg.KVHeads {
			d := h*rowBytes + off
			copy(dst[d:d+n], arena[so+h*s.headBytes:so+h*s.headBytes+n])
		}
		off += n
	}
	for h := range s.cfg.KVHeads {
		clear(dst[h*rowBytes+pastBytes : (h+1)*rowBytes])
	}
}

// scatterRow stores row b's new tokens of layer l, K and V.
func (s *Storage) scatterRow(l, b int) {
	j := &s.job
	n := j.lens[b]
	if n == 0 {
		return
	}
	rowBytes := j.tokens * s.tokBytes
	lo := b*s.cfg.KVHeads*rowBytes + j.srcOffset*s.tokBytes
	table := j.tables[s.group[l]][b]
	s.scatterHeads(s.LayerK(l), j.k[l], lo, rowBytes, table, j.startPos[b], n)
	s.scatterHeads(s.LayerV(l), j.v[l], lo, rowBytes, table, j.startPos[b], n)
}

// scatterHeads copies n tokens of every head from src (head h's first token at lo+h*rowBytes)
// into arena at positions [start, start+n) of table, splitting at block boundaries.
func (s *Storage) scatterHeads(arena, src []byte, lo, rowBytes int, table []BlockID, start, n int) {
	bs := s.cfg.BlockSizeTokens
	for h := range s.cfg.KVHeads {
		sp := lo + h*rowBytes
		for pos, end := start, start+n; pos < end; {
			i, in := pos/bs, pos%bs
			cnt := min(bs-in, end-pos)
			do := int(table[i])*s.blkBytes + h*s.headBytes + in*s.tokBytes
			copy(arena[do:do+cnt*s.tokBytes], src[sp:sp+cnt*s.tokBytes])
			sp += cnt * s.tokBytes
			pos += cnt
		}
	}
}
