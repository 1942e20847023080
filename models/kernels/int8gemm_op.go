package kernels

/*
#cgo CFLAGS: -I${SRCDIR}/../ort
#include "int8gemm_op.h"
*/
import "C"

import "unsafe"

// Int8Domain and Int8OpName name the ONNX Runtime custom operator Int8Linear in a graph:
// attributes K and N; inputs x (float32 [..., K]), w (int8, [K][N] in the packed
// layout: PackInt8Layout's Int8PackedSize(K, N) bytes, a constant initializer, which the kernel
// reads in place) and scale (float32 [N], a constant initializer); output y (float32
// [..., N]) = x @ (w * scale), with x's rows quantized to int8 one by one as
// Int8Weights.MatMul does.
const (
	Int8Domain = C.CV_INT8_DOMAIN
	Int8OpName = C.CV_INT8_OP
)

// Int8OpDesc returns the operator's descriptor (a cv_op_desc of models/ort's op.h), of which
// models/ort makes an ONNX Runtime custom operator in the one com.conveyor domain that
// holds Conveyor's operators.
func Int8OpDesc() unsafe.Pointer { return unsafe.Pointer(C.cv_i8op_desc()) }
