package kernels

// #cgo CFLAGS: -O3 -std=gnu11
// #cgo LDFLAGS: -lm
// #include <stdlib.h>
// #include "pagedattn.h"
import "C"

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// ErrPagedInput reports a call whose inputs do not fit the operator's contract: lengths that
// do not match the dimensions, bad attributes, sequence lengths or block table entries.
var ErrPagedInput = errors.New("kernels: invalid PagedAttention input")

// PagedAttrs are the operator's attributes.
type PagedAttrs struct {
	NumHeads   int // query heads
	KVNumHeads int // key and value heads; NumHeads is a multiple of it
	// Scale multiplies q·k; 0 means 1/sqrt(HeadDim).
	Scale float32
	// Softcap, when > 0, replaces each scaled score s by Softcap·tanh(s/Softcap).
	Softcap float32
	// LocalWindowSize, when > 0, is how many keys a query sees, itself included: the
	// query at position p sees positions p-LocalWindowSize+1 ... p. <= 0 means all.
	LocalWindowSize int
	// DoRotary rotates the new queries and keys by their positions' cos and sin rows.
	DoRotary bool
	// RotaryInterleaved rotates pairs (2i, 2i+1) instead of rotate-half pairs (i, i+R/2).
	RotaryInterleaved bool
}

// PagedDims are the dimensions of the operator's tensors.
type PagedDims struct {
	Tokens    int // T: the new tokens of all rows, packed one row after another
	HeadDim   int // D
	NumBlocks int // the caches' blocks
	BlockSize int // tokens per block
	Batch     int // B: rows (sequences)
	MaxBlocks int // block_table's columns
	RotaryDim int // 2 × cos_cache's columns (partial rotary when < HeadDim); 0 without cos and sin
	MaxPos    int // cos_cache's rows: the positions it covers
}

// PagedTensors are the operator's inputs and its output, row-major, float32 unless said.
// KeyCache and ValueCache are updated in place (the operator's key_cache_out and
// value_cache_out are the same buffers).
type PagedTensors struct {
	Query      []float32 // [T, NumHeads·D], or q|k|v [T, (NumHeads+2·KVNumHeads)·D] when Key and Value are nil
	Key, Value []float32 // [T, KVNumHeads·D], or both nil
	KeyCache   []float32 // [NumBlocks, BlockSize, KVNumHeads, D]
	ValueCache []float32 // [NumBlocks, BlockSize, KVNumHeads, D]
	// KeyCacheHalf and ValueCacheHalf are the caches in float16 (IEEE half bits), when
	// KeyCache and ValueCache are nil: new keys and values are rounded to nearest even
	// as they are stored, and read back exactly.
	KeyCacheHalf, ValueCacheHalf []uint16
	CumSeqLens                   []int32   // [B+1]: row b's new tokens are Query rows CumSeqLens[b] ... CumSeqLens[b+1]-1
	PastSeqLens                  []int32   // [B]: tokens already cached for row b; its new token j is at position PastSeqLens[b]+j
	BlockTable                   []int32   // [B, MaxBlocks]: position p of row b lives in block BlockTable[b][p/BlockSize]
	Cos, Sin                     []float32 // [MaxPos, RotaryDim/2], or both nil
	// Metadata is attention_metadata, or nil: [max_query_len, max_kv_len] over the call's
	// rows, each 0 when unknown. CUDA sizes its launches by these bounds instead of
	// reading the lengths back; this kernel checks them as CUDA does and needs none.
	Metadata []int32
	Out      []float32 // [T, NumHeads·D], written
}

// PagedAttention applies the operator: it stores the new keys (rotated) and values into their
// cache slots and writes each new token's attention over its row's positions to Out.
// Every length is checked against d, and the sequence lengths and block table against
// the caches, before the kernel runs; a call that fails changes nothing. The work is
// spread over GOMAXPROCS goroutines.
func PagedAttention(a PagedAttrs, d PagedDims, t PagedTensors) error {
	x, err := newArgs(a, d, t)
	if err != nil {
		return err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	for _, p := range []unsafe.Pointer{
		unsafe.Pointer(x.query), unsafe.Pointer(x.key), unsafe.Pointer(x.value), unsafe.Pointer(x.key_cache),
		unsafe.Pointer(x.value_cache), unsafe.Pointer(x.cu_seqlens), unsafe.Pointer(x.past_seqlens),
		unsafe.Pointer(x.block_table), unsafe.Pointer(x.cos_cache), unsafe.Pointer(x.sin_cache), unsafe.Pointer(x.output),
		unsafe.Pointer(x.metadata),
	} {
		if p != nil {
			pin.Pin(p)
		}
	}
	var msg [C.CV_PA_ERR_LEN]C.char
	if C.cv_pa_check(x, &msg[0]) != 0 {
		return fmt.Errorf("%w: %s", ErrPagedInput, C.GoString(&msg[0]))
	}
	if C.cv_pa_store(x) != 0 {
		return errors.New("kernels: PagedAttention: out of memory")
	}
	n := int(C.cv_pa_plan(x, nil))
	if n == 0 {
		return nil
	}
	items := make([]C.cv_pa_item, n)
	C.cv_pa_plan(x, &items[0])
	var next atomic.Int64
	var failed atomic.Bool
	work := func() {
		for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
			if C.cv_pa_attend(x, &items[i]) != 0 {
				failed.Store(true)
			}
		}
	}
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), n) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	if failed.Load() {
		return errors.New("kernels: PagedAttention: out of memory")
	}
	return nil
}

// newArgs checks the attributes and every length against d and returns the kernel's
// arguments (pointing into t's slices).
func newArgs(a PagedAttrs, d PagedDims, t PagedTensors) (*C.cv_pa_args, error) {
	x := &C.cv_pa_args{a: C.cv_pa_attrs{
		num_heads:          C.int64_t(a.NumHeads),
		kv_num_heads:       C.int64_t(a.KVNumHeads),
		scale:              C.float(a.Scale),
		softcap:            C.float(a.Softcap),
		window:             C.int64_t(a.LocalWindowSize),
		do_rotary:          C.int64_t(b2i(a.DoRotary)),
		rotary_interleaved: C.int64_t(b2i(a.RotaryInterleaved)),
	}}
	var msg [C.CV_PA_ERR_LEN]C.char
	if C.cv_pa_check_attrs(&x.a, &msg[0]) != 0 {
		return nil, fmt.Errorf("%w: %s", ErrPagedInput, C.GoString(&msg[0]))
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"Tokens", d.Tokens}, {"HeadDim", d.HeadDim}, {"NumBlocks", d.NumBlocks}, {"BlockSize", d.BlockSize},
		{"Batch", d.Batch}, {"MaxBlocks", d.MaxBlocks}, {"RotaryDim", d.RotaryDim}, {"MaxPos", d.MaxPos}} {
		if v.n < 0 || v.n > math.MaxInt32 {
			return nil, fmt.Errorf("%w: PagedDims.%s = %d is outside [0, 2^31)", ErrPagedInput, v.name, v.n)
		}
	}
	packed := t.Key == nil && t.Value == nil
	if !packed && (t.Key == nil || t.Value == nil) {
		return nil, fmt.Errorf("%w: Key and Value must both be given, or both be nil (packed q|k|v)", ErrPagedInput)
	}
	if (t.Cos == nil) != (t.Sin == nil) {
		return nil, fmt.Errorf("%w: Cos and Sin must both be given, or both be nil", ErrPagedInput)
	}
	half := t.KeyCache == nil && t.ValueCache == nil && (t.KeyCacheHalf != nil || t.ValueCacheHalf != nil)
	if half && (t.KeyCacheHalf == nil || t.ValueCacheHalf == nil) || !half && (t.KeyCacheHalf != nil || t.ValueCacheHalf != nil) {
		return nil, fmt.Errorf("%w: give KeyCache and ValueCache, or KeyCacheHalf and ValueCacheHalf", ErrPagedInput)
	}
	keyCache, valueCache := len(t.KeyCache), len(t.ValueCache)
	if half {
		keyCache, valueCache = len(t.KeyCacheHalf), len(t.ValueCacheHalf)
	}
	rotary := t.Cos != nil
	if rotary && (d.RotaryDim < 2 || d.RotaryDim%2 != 0) {
		return nil, fmt.Errorf("%w: PagedDims.RotaryDim = %d, want an even number >= 2 with Cos and Sin", ErrPagedInput, d.RotaryDim)
	}
	if !rotary && d.RotaryDim != 0 {
		return nil, fmt.Errorf("%w: PagedDims.RotaryDim = %d without Cos and Sin", ErrPagedInput, d.RotaryDim)
	}
	qHeads := a.NumHeads
	if packed {
		qHeads += 2 * a.KVNumHeads
	}
	for _, c := range []struct {
		name      string
		got, want int
		how       string
	}{
		{"Query", len(t.Query), mul(d.Tokens, qHeads, d.HeadDim), "Tokens × query columns"},
		{"Key", len(t.Key), mul(d.Tokens, a.KVNumHeads, d.HeadDim), "Tokens × KVNumHeads × HeadDim"},
		{"Value", len(t.Value), mul(d.Tokens, a.KVNumHeads, d.HeadDim), "Tokens × KVNumHeads × HeadDim"},
		{"KeyCache", keyCache, mul(d.NumBlocks, d.BlockSize, a.KVNumHeads, d.HeadDim), "NumBlocks × BlockSize × KVNumHeads × HeadDim"},
		{"ValueCache", valueCache, mul(d.NumBlocks, d.BlockSize, a.KVNumHeads, d.HeadDim), "NumBlocks × BlockSize × KVNumHeads × HeadDim"},
		{"CumSeqLens", len(t.CumSeqLens), d.Batch + 1, "Batch + 1"},
		{"PastSeqLens", len(t.PastSeqLens), d.Batch, "Batch"},
		{"BlockTable", len(t.BlockTable), mul(d.Batch, d.MaxBlocks), "Batch × MaxBlocks"},
		{"Cos", len(t.Cos), mul(d.MaxPos, d.RotaryDim/2), "MaxPos × RotaryDim/2"},
		{"Sin", len(t.Sin), mul(d.MaxPos, d.RotaryDim/2), "MaxPos × RotaryDim/2"},
		{"Out", len(t.Out), mul(d.Tokens, a.NumHeads, d.HeadDim), "Tokens × NumHeads × HeadDim"},
	} {
		if (c.name == "Key" || c.name == "Value") && packed || (c.name == "Cos" || c.name == "Sin") && !rotary {
			continue
		}
		if c.want < 0 || c.got != c.want {
			return nil, fmt.Errorf("%w: len(%s) = %d, want %s = %d", ErrPagedInput, c.name, c.got, c.how, c.want)
		}
	}
	x.g = C.cv_pa_geom{
		tokens:      C.int64_t(d.Tokens),
		head_dim:    C.int64_t(d.HeadDim),
		num_blocks:  C.int64_t(d.NumBlocks),
		block_size:  C.int64_t(d.BlockSize),
		batch:       C.int64_t(d.Batch),
		max_blocks:  C.int64_t(d.MaxBlocks),
		rotary_half: C.int64_t(d.RotaryDim / 2),
		max_pos:     C.int64_t(d.MaxPos),
		packed:      C.int(b2i(packed)),
	}
	x.query, x.key, x.value = f32(t.Query), f32(t.Key), f32(t.Value)
	x.key_cache, x.value_cache = unsafe.Pointer(f32(t.KeyCache)), unsafe.Pointer(f32(t.ValueCache))
	if half {
		x.key_cache, x.value_cache, x.cache_half = unsafe.Pointer(u16(t.KeyCacheHalf)), unsafe.Pointer(u16(t.ValueCacheHalf)), 1
	}
	x.output = f32(t.Out)
	x.cu_seqlens, x.past_seqlens, x.block_table = i32(t.CumSeqLens), i32(t.PastSeqLens), i32(t.BlockTable)
	x.cos_cache, x.sin_cache = f32(t.Cos), f32(t.Sin)
	if t.Metadata != nil {
		// A non-nil empty slice is a metadata input of shape (0), which the check refuses.
		x.metadata, x.metadata_len = i32(append(t.Metadata[:len(t.Metadata):len(t.Metadata)], 0)), C.int64_t(len(t.Metadata))
	}
	return x, nil
}

// mul returns the product of xs, or -1 when one is negative or the product overflows.
func mul(xs ...int) int {
	p := 1
	for _, x := range xs {
		if x < 0 || (x > 0 && p > math.MaxInt64/x) {
			return -1
		}
		p *= x
	}
	return p
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// f32 and i32 return a slice's first element for C, or nil for an empty slice.
func f32(s []float32) *C.float {
	if len(s) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&s[0]))
}

func i32(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

// PagedAttentionISA names the instruction set the kernel uses on this CPU: "avx512", "avx2" or
// "generic".
func PagedAttentionISA() string { return pagedISAName(int(C.cv_pa_isa())) }

func pagedISAName(isa int) string {
	switch isa {
	case C.CV_PA_AVX512:
		return "avx512"
	case C.CV_PA_AVX2:
		return "avx2"
	}
	return "generic"
}

// pagedISAs lists the instruction sets by name, for tests.
var pagedISAs = []int{C.CV_PA_GENERIC, C.CV_PA_AVX2, C.CV_PA_AVX512}

// setPagedISA makes the kernel use isa (for tests); it reports false when the CPU lacks it.
func setPagedISA(isa int) bool { return C.cv_pa_set_isa(C.int(isa)) == 0 }

func u16(s []uint16) *C.uint16_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.uint16_t)(unsafe.Pointer(&s[0]))
}
