package int8gemm

/*
#cgo CFLAGS: -I${SRCDIR}/../ort
#include "ortop.h"
*/
import "C"

import "unsafe"

// Domain and OpName name the ONNX Runtime custom operator Int8Linear in a graph:
// attributes K and N; inputs x (float32 [..., K]), w (int8, [K][N] in the packed
// layout: Packed's PackedSize(K, N) bytes, a constant initializer, which the kernel
// reads in place) and scale (float32 [N], a constant initializer); output y (float32
// [..., N]) = x @ (w * scale), with x's rows quantized to int8 one by one as
// Weights.MatMul does.
const (
	Domain = C.CV_INT8_DOMAIN
	OpName = C.CV_INT8_OP
)

// OpDesc returns the operator's descriptor (a cv_op_desc of models/ort's op.h), of which
// models/ort makes an ONNX Runtime custom operator in the one com.conveyor domain that
// holds Conveyor's operators.
func OpDesc() unsafe.Pointer { return unsafe.Pointer(C.cv_i8op_desc()) }
