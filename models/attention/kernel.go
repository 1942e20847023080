package attention

// #cgo CFLAGS: -O3 -std=gnu11
// #cgo LDFLAGS: -lm
// #include "kernel.h"
import "C"

import (
	"unsafe"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// The instruction sets the kernel is compiled for.
const (
	isaGeneric = C.CV_ISA_GENERIC
	isaAVX2    = C.CV_ISA_AVX2
	isaAVX512  = C.CV_ISA_AVX512
)

// itemFields is the int32 count of one work item in the items array.
const itemFields = C.CV_ITEM_FIELDS

// ktile is the most keys the kernel transposes at once, and tileRows the most query
// rows whose scores against them it keeps at once (scratch it needs per item).
const (
	ktile    = C.CV_KTILE
	tileRows = C.CV_TILE_ROWS
)

// bestISA is the best instruction set this CPU runs.
var bestISA = int(C.cv_isa())

// ISA names the instruction set the kernel uses on this CPU.
func ISA() string { return isaName(bestISA) }

func isaName(isa int) string {
	switch isa {
	case isaAVX512:
		return "avx512"
	case isaAVX2:
		return "avx2"
	}
	return "generic"
}

// kernelArgs are one Run's arguments to the kernel, checked by Run.
type kernelArgs struct {
	params       C.cv_params
	isa          int
	k, v         []byte
	tables       []int32
	items        []int32
	qkv, att     []float32
	scratchFloat int // floats of scratch the largest item needs
	work         int // query·key pairs × head dim over all items
}

// attend runs items [lo, hi) with scratch (at least a.scratchFloat floats).
func (a *kernelArgs) attend(lo, hi int, scratch []float32) {
	C.cv_attend(C.int(a.isa), &a.params,
		unsafe.Pointer(unsafe.SliceData(a.k)), unsafe.Pointer(unsafe.SliceData(a.v)),
		(*C.int32_t)(unsafe.Pointer(unsafe.SliceData(a.tables))), (*C.int32_t)(unsafe.Pointer(unsafe.SliceData(a.items))),
		C.int(lo), C.int(hi),
		(*C.float)(unsafe.Pointer(unsafe.SliceData(a.qkv))), (*C.float)(unsafe.Pointer(unsafe.SliceData(a.att))),
		(*C.float)(unsafe.Pointer(unsafe.SliceData(scratch))))
}

func (a *kernelArgs) setParams(p Params, dt kvcache.DType, blockSize, qkvStride, attStride int) {
	cdt := C.int(C.CV_F32)
	if dt == kvcache.Float16 {
		cdt = C.CV_F16
	}
	a.params = C.cv_params{
		dtype:        cdt,
		num_kv_heads: C.int(p.NumKVHeads),
		block_size:   C.int(blockSize),
		head_dim:     C.int(p.HeadDim),
		group:        C.int(p.Group()),
		window:       C.int(p.SlidingWindow),
		scale:        C.float(p.Scale),
		softcap:      C.float(p.Softcap),
		qkv_stride:   C.int(qkvStride),
		att_stride:   C.int(attStride),
	}
}
