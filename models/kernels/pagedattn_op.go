package kernels

/*
#cgo CFLAGS: -I${SRCDIR}/../ort
#include "pagedattn_op.h"
*/
import "C"

import "unsafe"

// PagedDomain and PagedOpName name the ONNX Runtime custom operator in a graph: com.conveyor's
// PagedAttention, since version 1, with com.microsoft.PagedAttention's inputs 0-9,
// outputs and attributes, all float tensors float32 (see pagedattn_doc.go).
const (
	PagedDomain = C.CV_PA_DOMAIN
	PagedOpName = C.CV_PA_OP
)

// PagedOpDescs returns the operator's descriptors (cv_op_desc of models/ort's op.h), one for
// float32 caches and one for float16 caches, of which models/ort makes ONNX Runtime
// custom operators in the one com.conveyor domain that holds Conveyor's operators: ONNX
// Runtime makes one schema of the two and picks the kernel by the caches' type. The
// operator runs its work on the session's intra-op threads.
func PagedOpDescs() []unsafe.Pointer {
	return []unsafe.Pointer{unsafe.Pointer(C.cv_paop_desc(0)), unsafe.Pointer(C.cv_paop_desc(1))}
}
