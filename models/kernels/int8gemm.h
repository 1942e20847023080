// Int8 linear layers for decode: y = dequant(quant_rows(x) · w). The Go side
// (int8gemm.go) checks lengths before calling in; these functions also refuse bad
// shapes and NULL pointers themselves, since other cgo code in the package calls
// them directly.
#ifndef CONVEYOR_INT8GEMM_KERNEL_H
#define CONVEYOR_INT8GEMM_KERNEL_H

#include <stdint.h>

// CV_I8_MAX_K bounds K so that no int32 accumulator can overflow:
// K · 127 · 128 < 2^31.
enum { CV_I8_MAX_K = 131072 };

// Packed int8 weights [K][N] with one float32 scale per column.
typedef struct cv_i8w cv_i8w;

// cv_i8w_wrap takes weights in the packed layout (cv_i8w_packed_size bytes: N padded to
// 64 and K to 4 with zeros, panels of 64 columns laid out [K/4][64][4]; Packed in
// int8gemm.go is the one place that writes it). With in_place set it uses them where they are when
// they are 64-byte aligned (they must then outlive the result); otherwise it copies
// them. scale ([N]) is copied. It returns NULL on bad arguments (a length other than
// the packed size) or when memory runs out.
cv_i8w *cv_i8w_wrap(const int8_t *packed, int64_t len, const float *scale, int K, int N, int in_place);

// cv_i8w_packed_size is the packed layout's size in bytes for [K][N] weights, or -1
// for a shape the kernel refuses (K or N < 1, K > CV_I8_MAX_K).
int64_t cv_i8w_packed_size(int K, int N);

// cv_i8w_free releases p (NULL is a no-op).
void cv_i8w_free(cv_i8w *p);

// cv_i8w_k and cv_i8w_n give the unpadded shape of p.
int cv_i8w_k(const cv_i8w *p);
int cv_i8w_n(const cv_i8w *p);

// cv_i8_linear computes y[M][N] from x[M][K], both float32 row-major, for each row m:
//
//	s    = max(max_k |x[m][k]|, 1e-30)
//	q[k] = clamp(round_half_even((x[m][k] / s) / (1/127)), -128, 127)
//	acc  = sum_k q[k] · w[k][n]                       (exact, int32)
//	y    = ((float)acc · ((1/127) · scale[n])) · s
//
// which is, operation for operation, the Abs/ReduceMax/Max/Div/QuantizeLinear/
// MatMulIntegerToFloat/Mul graph that models/build emits for an int8 linear layer.
// It returns 0, or nonzero on bad arguments (NULL, M < 1) or when scratch memory runs
// out. It may be called from several threads at once.
int cv_i8_linear(const cv_i8w *p, const float *x, int M, float *y);

// cv_i8_set_threads sets how many threads (the caller included) share a large call;
// n < 1 restores the default, the number of online CPUs.
void cv_i8_set_threads(int n);

// cv_i8_isa names the instruction set cv_i8_linear uses: "amx", "avx512vnni", "avx2"
// or "portable".
const char *cv_i8_isa(void);

// cv_i8_force_isa makes cv_i8_linear use the named instruction set (for tests); NULL
// or "" restores the automatic choice. It returns 0, changing nothing, when this CPU
// cannot run the set or the name is unknown, and 1 otherwise.
int cv_i8_force_isa(const char *name);

// cv_i8_linear_amx_model is cv_i8_linear through the AMX kernel run on a C model of the
// tile instructions, on the calling thread, on any CPU (for tests): with the hardware
// kernel's epilogue where the CPU has AVX-512F, unless plain_epilogue asks for the C
// one. It returns EINVAL when K is not a multiple of 64, EFAULT when the kernel broke a
// tile shape rule, and ENOSYS where the AMX kernel is not built.
int cv_i8_linear_amx_model(const cv_i8w *p, const float *x, int M, float *y, int plain_epilogue);

#endif
