package kernels

// #cgo CFLAGS: -O3 -std=gnu11
// #cgo LDFLAGS: -lm
// #include "rows.h"
import "C"

import (
	"math"
	"unsafe"
)

// RowMax returns the largest value of x: NaN if any value is NaN, -Inf when x is empty.
func RowMax(x []float32) float32 {
	if len(x) == 0 {
		return float32(math.Inf(-1))
	}
	return float32(C.cv_row_max((*C.float)(unsafe.Pointer(&x[0])), C.long(len(x))))
}

// RowExp returns the sum of exp((x[i]-shift)*scale), accumulated in float64, and stores
// each term in out when out is not nil (len(out) >= len(x)). Terms below exp(-87) are 0,
// terms of a NaN argument too, and arguments above 88 count as 88.
func RowExp(x, out []float32, shift, scale float32) float64 {
	if len(x) == 0 {
		return 0
	}
	var o *C.float
	if out != nil {
		o = (*C.float)(unsafe.Pointer(&out[0:len(x)][0]))
	}
	return float64(C.cv_row_exp((*C.float)(unsafe.Pointer(&x[0])), o, C.long(len(x)), C.float(shift), C.float(scale)))
}

// RowFind returns the first i with x[i] == v, or -1.
func RowFind(x []float32, v float32) int {
	if len(x) == 0 {
		return -1
	}
	return int(C.cv_row_find((*C.float)(unsafe.Pointer(&x[0])), C.long(len(x)), C.float(v)))
}
