package pagedattn

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

// Domain and OpName name the ONNX Runtime custom operator in a graph: com.conveyor's
// PagedAttention, since version 1, with com.microsoft.PagedAttention's inputs 0-9,
// outputs and attributes, all float tensors float32 (see the package doc).
const (
	Domain = C.CV_PA_DOMAIN
	OpName = C.CV_PA_OP
)

var registerMu sync.Mutex

// RegisterOp adds the com.conveyor operator domain, holding PagedAttention and the
// operators of others (OrtCustomOp pointers, such as int8gemm.CustomOp()), to an ONNX
// Runtime session options object before a session is created from it. ONNX Runtime
// refuses a session with two domains of one name, so Conveyor's operators share this
// one; every call must pass the same others (the domain is made once per process). api
// is the process's OrtApi function table (a library of C API version 17 or later: the
// operator runs its work on the session's threads through KernelContext_ParallelFor)
// and sessionOptions an OrtSessionOptions pointer.
func RegisterOp(api, sessionOptions unsafe.Pointer, others ...unsafe.Pointer) error {
	if api == nil || sessionOptions == nil {
		return errors.New("pagedattn: RegisterOp needs the OrtApi table and session options")
	}
	for _, op := range others {
		if op == nil {
			return errors.New("pagedattn: RegisterOp: a nil operator")
		}
	}
	registerMu.Lock()
	defer registerMu.Unlock()
	ops := (*unsafe.Pointer)(C.malloc(C.size_t(max(len(others), 1)) * C.size_t(unsafe.Sizeof(unsafe.Pointer(nil)))))
	defer C.free(unsafe.Pointer(ops))
	copy(unsafe.Slice(ops, len(others)), others)
	if msg := C.cv_paop_register(api, sessionOptions, (*unsafe.Pointer)(unsafe.Pointer(ops)), C.int(len(others))); msg != nil {
		defer C.free(unsafe.Pointer(msg))
		return errors.New("pagedattn: registering " + Domain + "'s operators: " + C.GoString(msg))
	}
	return nil
}
