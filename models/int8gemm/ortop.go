package int8gemm

/*
#cgo CFLAGS: -I${SRCDIR}/../../third_party/onnxruntime
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

// CustomOp returns the operator's OrtCustomOp. models/ort adds it to the one com.conveyor
// domain that holds Conveyor's operators (pagedattn.RegisterOp): ONNX Runtime refuses a
// session with two domains of one name.
func CustomOp() unsafe.Pointer { return unsafe.Pointer(C.cv_i8op_custom_op()) }
