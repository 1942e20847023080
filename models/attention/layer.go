package attention

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// Cache is one layer's paged KV: K and V arenas laid out
// [NumBlocks][NumKVHeads][BlockSize][HeadDim] (kvcache.Storage's layout), so one
// (block, head) pair is a contiguous run of BlockSize*HeadDim values.
type Cache struct {
	K, V      []byte
	NumBlocks int
	BlockSize int           // tokens per block
	DType     kvcache.DType // float32, or float16 (the kernel widens each block as it reads it)
}

// Seq is one sequence of a step: NumNew new tokens at positions PastLen ..
// PastLen+NumNew-1, whose past lives in the blocks of Table (entry i holds positions
// [i*BlockSize, (i+1)*BlockSize)).
type Seq struct {
	Table   []int32
	PastLen int
	NumNew  int
}

// parallelMinWork is the attention work (query·key pairs × head dim) below which Run
// computes on the calling goroutine alone: about 20 µs of arithmetic, less than waking
// another goroutine and its thread costs.
const parallelMinWork = 1 << 17

// maxItemRows bounds the query rows (tokens × group heads) of one work item: the item
// reads each of its K and V rows once for all of them.
const maxItemRows = 64

// Layer computes one layer's attention over a paged KV cache. A Layer is not safe for
// concurrent use; Run parallelises inside.
type Layer struct {
	p            Params
	maxPositions int
	rope         *ropeTable
	isa          int

	args    kernelArgs
	scratch [][]float32 // per worker
	cs      []float32   // cos|sin of one position beyond the rotary table
}

// NewLayer returns the attention of a layer with params p for sequences of at most
// maxPositions tokens.
func NewLayer(p Params, maxPositions int) (*Layer, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if maxPositions <= 0 {
		return nil, fmt.Errorf("%w: max positions %d must be positive", ErrBadInput, maxPositions)
	}
	l := &Layer{p: p, maxPositions: maxPositions, isa: bestISA}
	if p.Rotary.Dims > 0 {
		l.rope = sharedRopeTable(p.Rotary, maxPositions)
	}
	return l, nil
}

// Params returns the layer's parameters.
func (l *Layer) Params() Params { return l.p }

// Run computes attention for every new token of seqs, packed row after row in qkv
// ([T][QKVCols], T = the seqs' NumNew summed): it applies the rotary embedding to the
// new queries and keys in qkv, stores the new keys and values in their blocks, and
// writes softmax(q·K)·V over each token's visible positions (causal, and within the
// sliding window) to att ([T][OutCols]). The past is read from the blocks in place.
//
// Every length and block id is checked first (a sliding layer's only from its window's
// first block on: the entries before it are never read); input that does not fit is an
// error wrapping ErrBadInput and nothing is written.
func (l *Layer) Run(c Cache, seqs []Seq, qkv, att []float32) error {
	tokens, err := l.check(c, seqs, qkv, att)
	if err != nil {
		return err
	}
	l.rotateAndStore(c, seqs, qkv)
	l.plan(c, seqs, tokens, qkv, att)
	l.runItems()
	return nil
}

// check validates a Run's arguments and returns the token count.
func (l *Layer) check(c Cache, seqs []Seq, qkv, att []float32) (int, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
	}
	p := l.p
	if c.DType.Size() == 0 {
		return 0, bad("KV arenas of unknown type %d", c.DType)
	}
	if c.NumBlocks <= 0 || c.BlockSize <= 0 {
		return 0, bad("%d blocks of %d tokens", c.NumBlocks, c.BlockSize)
	}
	arena := c.NumBlocks * p.NumKVHeads * c.BlockSize * p.HeadDim * c.DType.Size()
	if len(c.K) < arena || len(c.V) < arena {
		return 0, bad("arenas of %d and %d bytes, %d blocks need %d", len(c.K), len(c.V), c.NumBlocks, arena)
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(c.K)))%4 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(c.V)))%4 != 0 {
		return 0, bad("arenas are not 4-byte aligned")
	}
	if len(seqs) == 0 {
		return 0, bad("no sequences")
	}
	tokens := 0
	for i, s := range seqs {
		switch {
		case s.NumNew <= 0:
			return 0, bad("sequence %d has %d new tokens", i, s.NumNew)
		case s.PastLen < 0:
			return 0, bad("sequence %d has past length %d", i, s.PastLen)
		case s.PastLen > l.maxPositions-s.NumNew:
			return 0, bad("sequence %d: %d past + %d new tokens exceed %d positions", i, s.PastLen, s.NumNew, l.maxPositions)
		}
		need := (s.PastLen + s.NumNew + c.BlockSize - 1) / c.BlockSize
		if len(s.Table) < need {
			return 0, bad("sequence %d: block table of %d blocks for %d positions (%d blocks)", i, len(s.Table), s.PastLen+s.NumNew, need)
		}
		// A sliding layer reads nothing before its window: those entries may be
		// kvcache.NoBlock (given back).
		first := 0
		if p.SlidingWindow > 0 {
			first = max(0, s.PastLen-p.SlidingWindow+1) / c.BlockSize
		}
		for j, b := range s.Table[first:need] {
			j += first
			if b < 0 || int(b) >= c.NumBlocks {
				return 0, bad("sequence %d: block table entry %d is block %d of %d", i, j, b, c.NumBlocks)
			}
		}
		tokens += s.NumNew
		if tokens > math.MaxInt32/max(p.QKVCols(), 1) {
			return 0, bad("%d tokens in one step are too many", tokens)
		}
	}
	if len(qkv) < tokens*p.QKVCols() {
		return 0, bad("qkv has %d floats, %d tokens need %d", len(qkv), tokens, tokens*p.QKVCols())
	}
	if len(att) < tokens*p.OutCols() {
		return 0, bad("att has %d floats, %d tokens need %d", len(att), tokens, tokens*p.OutCols())
	}
	return tokens, nil
}

// floats views a byte arena as float32s.
func floats(b []byte) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

// halves views a byte arena as float16 bit patterns.
func halves(b []byte) []uint16 {
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2)
}

// rotateAndStore turns the new queries and keys by their positions and stores the
// new keys and values in their blocks, in the arenas' type.
func (l *Layer) rotateAndStore(c Cache, seqs []Seq, qkv []float32) {
	var k, v []float32
	var kh, vh []uint16
	if c.DType == kvcache.Float16 {
		kh, vh = halves(c.K), halves(c.V)
	} else {
		k, v = floats(c.K), floats(c.V)
	}
	p := l.p
	D, cols := p.HeadDim, p.QKVCols()
	kOff, vOff := p.NumHeads*D, (p.NumHeads+p.NumKVHeads)*D
	t := 0
	for _, s := range seqs {
		for j := range s.NumNew {
			pos := s.PastLen + j
			row := qkv[t*cols : (t+1)*cols]
			if l.rope != nil {
				cos, sin := l.rope.at(pos, &l.cs)
				for h := 0; h < p.NumHeads+p.NumKVHeads; h++ {
					rotate(row[h*D:(h+1)*D], cos, sin)
				}
			}
			blk := int(s.Table[pos/c.BlockSize])
			for h := range p.NumKVHeads {
				o := ((blk*p.NumKVHeads+h)*c.BlockSize + pos%c.BlockSize) * D
				if kh != nil {
					for d := range D {
						kh[o+d] = kvcache.Float32ToFloat16(row[kOff+h*D+d])
						vh[o+d] = kvcache.Float32ToFloat16(row[vOff+h*D+d])
					}
					continue
				}
				copy(k[o:o+D], row[kOff+h*D:kOff+(h+1)*D])
				copy(v[o:o+D], row[vOff+h*D:vOff+(h+1)*D])
			}
			t++
		}
	}
}

// rotate applies rotate-half rotary to one head: x[i], x[i+half] for i < len(cos).
func rotate(x, cos, sin []float32) {
	half := len(cos)
	x1, x2 := x[:half], x[half:2*half]
	for i := range half {
		a, b := x1[i], x2[i]
		x1[i] = a*cos[i] - b*sin[i]
		x2[i] = b*cos[i] + a*sin[i]
	}
}

// plan fills the kernel's arguments: the sequences' tables flattened and one work item
// per (sequence, KV head, run of tokens).
func (l *Layer) plan(c Cache, seqs []Seq, tokens int, qkv, att []float32) {
	p := l.p
	a := &l.args
	a.isa = l.isa
	a.setParams(p, c.DType, c.BlockSize, p.QKVCols(), p.OutCols())
	a.k, a.v = c.K, c.V
	a.qkv, a.att = qkv[:tokens*p.QKVCols()], att[:tokens*p.OutCols()]
	a.tables, a.items = a.tables[:0], a.items[:0]
	a.scratchFloat, a.work = 0, 0
	per := max(1, maxItemRows/p.Group())
	row := 0
	for _, s := range seqs {
		off := len(a.tables)
		need := (s.PastLen + s.NumNew + c.BlockSize - 1) / c.BlockSize
		a.tables = append(a.tables, s.Table[:need]...)
		for j0 := 0; j0 < s.NumNew; j0 += per {
			n := min(per, s.NumNew-j0)
			pos := s.PastLen + j0
			span := pos + n
			if p.SlidingWindow > 0 {
				span = min(span, p.SlidingWindow+n-1)
			}
			a.scratchFloat = max(a.scratchFloat, n*p.Group()*(span+p.HeadDim)+p.HeadDim*(ktile+c.BlockSize)+tileRows*ktile)
			a.work += p.NumKVHeads * n * p.Group() * span * p.HeadDim
			for h := range p.NumKVHeads {
				a.items = append(a.items, int32(off), int32(h), int32(pos), int32(n), int32(row+j0))
			}
		}
		row += s.NumNew
	}
}

// runItems runs the planned items on up to GOMAXPROCS goroutines, each taking the
// next item as it finishes one (a long prompt's items cost more than a decode's).
func (l *Layer) runItems() {
	a := &l.args
	n := len(a.items) / itemFields
	workers := min(runtime.GOMAXPROCS(0), n)
	if a.work < parallelMinWork {
		workers = 1 // waking another goroutine would cost more than it saves
	}
	for len(l.scratch) < workers {
		l.scratch = append(l.scratch, nil)
	}
	for w := range workers {
		if len(l.scratch[w]) < a.scratchFloat {
			l.scratch[w] = make([]float32, a.scratchFloat)
		}
	}
	if workers <= 1 {
		a.attend(0, n, l.scratch[0])
		return
	}
	var next atomic.Int64
	work := func(scratch []float32) {
		for {
			i := int(next.Add(1)) - 1
			if i >= n {
				return
			}
			a.attend(i, i+1, scratch)
		}
	}
	var wg sync.WaitGroup
	for w := 1; w < workers; w++ {
		wg.Add(1)
		go func(s []float32) {
			defer wg.Done()
			work(s)
		}(l.scratch[w])
	}
	work(l.scratch[0])
	wg.Wait()
}
