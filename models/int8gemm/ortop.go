package int8gemm

/*
#cgo CFLAGS: -I${SRCDIR}/../../third_party/onnxruntime
#include <stdlib.h>
#include "ortop.h"
*/
import "C"

import (
	"errors"
	"sync"
	"unsafe"
)

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

var registerMu sync.Mutex

// RegisterOp adds the operator's domain to an ONNX Runtime session options object
// before a session is created from it. api is the process's OrtApi function table (C
// API version 16 or later) and sessionOptions an OrtSessionOptions pointer.
func RegisterOp(api, sessionOptions unsafe.Pointer) error {
	if api == nil || sessionOptions == nil {
		return errors.New("int8gemm: RegisterOp needs the OrtApi table and session options")
	}
	registerMu.Lock()
	defer registerMu.Unlock()
	if msg := C.cv_i8op_register(api, sessionOptions); msg != nil {
		defer C.free(unsafe.Pointer(msg))
		return errors.New("int8gemm: registering " + OpName + ": " + C.GoString(msg))
	}
	return nil
}

// CustomOp returns the operator's OrtCustomOp, for a com.conveyor domain that holds
// Conveyor's other operators too (ONNX Runtime refuses a session with two domains of one
// name; see pagedattn.RegisterOp).
func CustomOp() unsafe.Pointer { return unsafe.Pointer(C.cv_i8op_custom_op()) }
