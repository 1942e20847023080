// Package kernels holds Conveyor's own C kernels and their Go API, in one cgo package:
//
//   - the int8 GEMM of int8 step graphs (int8gemm.go, int8gemm.c and its int8gemm_*.h
//     kernels; the ONNX Runtime operator Int8Linear in int8gemm_op.c): Int8Weights,
//     PackInt8, WrapInt8, PackInt8Layout, Int8ISA;
//   - PagedAttention on CPUs (pagedattn.go, pagedattn.c, pagedattn_impl.h; the ONNX
//     Runtime operator in pagedattn_op.c) and its contract (pagedattn_contract.go):
//     PagedAttention, PagedAttrs, PagedDims, PagedTensors, PagedHeadFits, PagedAttentionISA;
//   - the sampler's row helpers (rows.go, rows.c): RowMax, RowExp, RowFind.
//
// Int8Linear and PagedAttention reach ONNX Runtime as plain descriptors (Int8OpDesc,
// PagedOpDescs; models/ort's op.h), which models/ort registers in the com.conveyor
// domain.
//
// Every C file and header of these kernels lives in this directory, so the go command,
// which rebuilds a cgo package when a .c or .h file of its own directory changes,
// rebuilds the package after any edit to them (models/ort's op.h, reached by -I, is the
// one header from outside). The C is compiled for several instruction sets in one build
// with per-function target attributes, no global -march, and each kernel picks the best
// one the CPU runs at its first use.
//
// The sections below, from int8gemm_doc.go and pagedattn_doc.go, describe the int8 GEMM
// and PagedAttention in full.
package kernels
