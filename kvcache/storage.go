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
	if all, ok := mulPositive(2, c.Layers, c.NumBlocks, c.KVHeads, c.BlockSizeTokens, c.HeadDim, c.DType.Size()); !ok || all > math.MaxInt {
		return fmt.Errorf("%w: %d layers of %d blocks of %d heads x %d tokens x %d values do not fit in memory",
			ErrInvalid, c.Layers, c.NumBlocks, c.KVHeads, c.BlockSizeTokens, c.HeadDim)
	}
	return nil
}

// Storage holds the K and V arenas of every layer. Each arena is laid out
// [block][kvHead][blockSizeTokens][headDim], so one (block, kv head) pair is one contiguous
// run of blockSizeTokens*headDim values and a whole block is one contiguous run per layer.
// Gather and Scatter may use several goroutines internally, but a Storage must not be used
// from two goroutines at once.
type Storage struct {
	cfg StorageConfig
	k   [][]byte // per layer
	v   [][]byte // per layer

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
	tables    [][]BlockID
	lens      []int // gather: pastLens; scatter: counts
	startPos  []int // scatter only
	tokens    int   // gather: maxPast; scatter: srcTokens
	srcOffset int   // scatter only
	k, v      [][]byte
}

// NewStorage allocates the arenas: NumBlocks * BlockBytes(...) bytes in all.
func NewStorage(cfg StorageConfig) (*Storage, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Storage{cfg: cfg, elem: cfg.DType.Size()}
	s.tokBytes = cfg.HeadDim * s.elem
	s.headBytes = cfg.BlockSizeTokens * s.tokBytes
	s.blkBytes = cfg.KVHeads * s.headBytes
	s.par = cfg.Parallelism
	if s.par == 0 {
		s.par = runtime.GOMAXPROCS(0)
	}
	s.k = make([][]byte, cfg.Layers)
	s.v = make([][]byte, cfg.Layers)
	arena := cfg.NumBlocks * s.blkBytes
	mem, release := allocArena(2 * cfg.Layers * arena)
	for l := range cfg.Layers {
		s.k[l] = mem[2*l*arena : (2*l+1)*arena : (2*l+1)*arena]
		s.v[l] = mem[(2*l+1)*arena : (2*l+2)*arena : (2*l+2)*arena]
	}
	// The arenas live as long as the Storage: LayerK and LayerV hand them out for one
	// step at a time, never to be kept.
	runtime.AddCleanup(s, func(release func()) { release() }, release)
	return s, nil
}

// Config returns the storage's configuration.
func (s *Storage) Config() StorageConfig { return s.cfg }

// LayerK returns layer l's K arena, laid out [block][kvHead][blockSizeTokens][headDim]. It is
// the storage itself, not a copy: for attention kernels that read blocks in place. It is
// valid while the Storage is reachable.
func (s *Storage) LayerK(l int) []byte { return s.k[l] }

// LayerV returns layer l's V arena; see LayerK.
func (s *Storage) LayerV(l int) []byte { return s.v[l] }

func (s *Storage) validBlock(b BlockID) bool { return b >= 0 && int(b) < s.cfg.NumBlocks }

// CopyBlock copies block src's K and V, all layers, into block dst.
func (s *Storage) CopyBlock(src, dst BlockID) error {
	if !s.validBlock(src) || !s.validBlock(dst) {
		return fmt.Errorf("%w: copy block %d to %d in a pool of %d", ErrInvalid, src, dst, s.cfg.NumBlocks)
	}
	if src == dst {
		return nil
	}
	so, do := int(src)*s.blkBytes, int(dst)*s.blkBytes
	for l := range s.cfg.Layers {
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

// checkSpan validates that table covers positions [from, from+n) with blocks inside the pool.
func (s *Storage) checkSpan(what string, row int, table []BlockID, from, n int) error {
	if n == 0 {
		return nil
	}
	bs := s.cfg.BlockSizeTokens
	if from < 0 || n < 0 || from+n > len(table)*bs {
		return fmt.Errorf("%w: %s row %d positions [%d, %d) beyond its %d blocks", ErrInvalid, what, row, from, from+n, len(table))
	}
	for j := from / bs; j <= (from+n-1)/bs; j++ {
		if !s.validBlock(table[j]) {
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
// error wrapping ErrInvalid and writes nothing.
func (s *Storage) Gather(tables [][]BlockID, pastLens []int, maxPast int, k, v [][]byte) error {
	if len(pastLens) != len(tables) || maxPast < 0 {
		return fmt.Errorf("%w: gather of %d tables with %d past lengths, maxPast %d", ErrInvalid, len(tables), len(pastLens), maxPast)
	}
	if err := s.checkDense("gather", k, v, len(tables), maxPast); err != nil {
		return err
	}
	for b, t := range tables {
		if pastLens[b] < 0 || pastLens[b] > maxPast {
			return fmt.Errorf("%w: gather row %d past %d outside [0, %d]", ErrInvalid, b, pastLens[b], maxPast)
		}
		if err := s.checkSpan("gather", b, t, 0, pastLens[b]); err != nil {
			return err
		}
	}
	s.job = storageJob{tables: tables, lens: pastLens, tokens: maxPast, k: k, v: v}
	// Every destination byte is written once (copied or zeroed) and most are read once.
	s.run(len(tables), 2*s.cfg.Layers*len(tables)*s.cfg.KVHeads*maxPast*s.tokBytes)
	return nil
}

// Scatter stores row b's new K/V for all layers: the dense [batch, kvHeads, srcTokens, headDim]
// buffers k[l], v[l] hold them at token columns [srcOffset, srcOffset+counts[b]); they go to
// positions [startPos[b], startPos[b]+counts[b]) of tables[b]. Rows with counts[b] == 0 are
// skipped. Rows must not write to the same block (the pool's copy-on-write guarantees this
// for blocks being appended to). A bad call returns an error wrapping ErrInvalid and writes
// nothing.
func (s *Storage) Scatter(tables [][]BlockID, startPos, counts []int, srcTokens, srcOffset int, k, v [][]byte) error {
	if len(startPos) != len(tables) || len(counts) != len(tables) || srcTokens < 0 || srcOffset < 0 {
		return fmt.Errorf("%w: scatter of %d tables with %d start positions, %d counts, srcTokens %d, srcOffset %d",
			ErrInvalid, len(tables), len(startPos), len(counts), srcTokens, srcOffset)
	}
	if err := s.checkDense("scatter", k, v, len(tables), srcTokens); err != nil {
		return err
	}
	total := 0
	for b, t := range tables {
		if counts[b] < 0 || srcOffset+counts[b] > srcTokens {
			return fmt.Errorf("%w: scatter row %d columns [%d, %d) outside %d", ErrInvalid, b, srcOffset, srcOffset+counts[b], srcTokens)
		}
		if err := s.checkSpan("scatter", b, t, startPos[b], counts[b]); err != nil {
			return err
		}
		total += counts[b]
	}
	s.job = storageJob{scatter: true, tables: tables, lens: counts, startPos: startPos, tokens: srcTokens, srcOffset: srcOffset, k: k, v: v}
	s.run(len(tables), 2*s.cfg.Layers*s.cfg.KVHeads*total*s.tokBytes)
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
	rows := len(s.job.tables)
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
	table := j.tables[b]
	rowBytes := maxPast * s.tokBytes // one head of one row in the dense buffer
	lo := b * s.cfg.KVHeads * rowBytes
	s.gatherHeads(j.k[l][lo:lo+s.cfg.KVHeads*rowBytes], s.k[l], table, past, rowBytes)
	s.gatherHeads(j.v[l][lo:lo+s.cfg.KVHeads*rowBytes], s.v[l], table, past, rowBytes)
}

// gatherHeads copies positions [0, past) of every head from arena into dst, one head after
// another rowBytes apart, and zeroes the rest of each head's row.
func (s *Storage) gatherHeads(dst, arena []byte, table []BlockID, past, rowBytes int) {
	pastBytes := past * s.tokBytes
	// Block by block, every head of a block in turn: the block's bytes are read in order
	// (one run of KVHeads*headBytes), which keeps the reads sequential within a page.
	for i, off := 0, 0; off < pastBytes; i++ {
		n := min(s.headBytes, pastBytes-off)
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
	s.scatterHeads(s.k[l], j.k[l], lo, rowBytes, j.tables[b], j.startPos[b], n)
	s.scatterHeads(s.v[l], j.v[l], lo, rowBytes, j.tables[b], j.startPos[b], n)
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
