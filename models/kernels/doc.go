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
// one header from outside).
//
// # SIMD header and dispatch
//
// One header, simd.h, holds what the kernels share:
//
//   - the CPU's features (cv_cpu_features, cv_cpu_has: AVX2, FMA, F16C, AVX-512F,
//     AVX-512BW, AVX512-VNNI, AMX), detected once per process in simd.c and cached as a
//     bitmask;
//   - IEEE half <-> float32 conversion of one value (cv_half_to_float, exact;
//     cv_float_to_half, rounded to nearest even), the scalar path of PagedAttention's
//     float16 caches: the same conversion as kvcache's Float16ToFloat32 and
//     Float32ToFloat16 in Go;
//   - the one vector exp (CV_VEXP, GCC vector extensions for any lane width, defined by
//     each kernel once per instruction set) and its scalar twin cv_expf, under one rule:
//     below -87 (and -Inf) exactly 0, above 88 e^88, NaN gives NaN. PagedAttention's
//     softmax and softcap and the rows' RowExp use it (RowExp also counts a NaN argument
//     as 0).
//
// The C is compiled for several instruction sets in one build with per-function target
// attributes, no global -march, and each kernel picks the best one the CPU runs, by
// cv_cpu_has, at its first use: the int8 GEMM among amx, avx512vnni, avx2 and portable
// (Int8ISA; AMX only after Linux grants the tile data and a self-check in a child
// process passes, int8gemm_amx.h), PagedAttention among avx512, avx2 and generic
// (PagedAttentionISA), the rows between AVX2+FMA and portable C.
//
// The sections below, from int8gemm_doc.go and pagedattn_doc.go, describe the int8 GEMM
// and PagedAttention in full.
package kernels
