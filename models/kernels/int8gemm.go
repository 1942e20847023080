package kernels

// #cgo CFLAGS: -O3 -std=gnu11
// #cgo LDFLAGS: -lpthread
// #include <stdlib.h>
// #include "int8gemm.h"
import "C"

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"syscall"
	"unsafe"
)

// ErrInt8Shape reports arguments whose shapes or lengths do not fit together.
var ErrInt8Shape = errors.New("kernels: int8: bad shape")

// ErrInt8Closed reports a call on closed Int8Weights.
var ErrInt8Closed = errors.New("kernels: int8: weights are closed")

// Int8MaxK is the largest K that PackInt8 accepts: below it no int32 sum of K products of an
// int8 code and an int8 weight can overflow.
const Int8MaxK = C.CV_I8_MAX_K

// Int8Weights is an int8 weight matrix [K][N] with one float32 scale per column, packed
// for the kernel. Its methods may be called from several goroutines at once; Close
// waits for running MatMuls to return.
type Int8Weights struct {
	mu   sync.RWMutex // held shared while the kernel reads p, exclusively by Close
	p    *C.cv_i8w
	k, n int
}

// PackInt8 copies w (int8 [K][N], row-major: the layout of MatMulIntegerToFloat's B) and
// scale ([N]) into packed Int8Weights. Close releases them; so does the garbage collector,
// eventually, for Int8Weights that are dropped unclosed.
func PackInt8(w []int8, scale []float32, K, N int) (*Int8Weights, error) {
	if K < 1 || N < 1 || K > Int8MaxK || N > math.MaxInt32-64 || len(w) != K*N || len(scale) != N {
		return nil, fmt.Errorf("%w: PackInt8 needs 1 <= K <= %d, N >= 1, len(w) = K*N and len(scale) = N (K %d, N %d, len(w) %d, len(scale) %d)",
			ErrInt8Shape, Int8MaxK, K, N, len(w), len(scale))
	}
	packed, err := PackInt8Layout(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)), K, N)
	if err != nil {
		return nil, err
	}
	return WrapInt8(packed, scale, K, N)
}

// WrapInt8 makes Int8Weights of [K][N] weights already in the packed layout (PackInt8Layout) and their
// scales, copying both. (The Int8Linear operator wraps ONNX Runtime's initializer in
// place instead: C memory, which the kernel may keep.)
func WrapInt8(packed []byte, scale []float32, K, N int) (*Int8Weights, error) {
	if K < 1 || N < 1 || K > Int8MaxK || N > math.MaxInt32-64 || len(packed) != Int8PackedSize(K, N) || len(scale) != N {
		return nil, fmt.Errorf("%w: WrapInt8 needs 1 <= K <= %d, N >= 1, len(packed) = Int8PackedSize(K, N) and len(scale) = N (K %d, N %d, len(packed) %d, len(scale) %d)",
			ErrInt8Shape, Int8MaxK, K, N, len(packed), len(scale))
	}
	p := C.cv_i8w_wrap((*C.int8_t)(unsafe.Pointer(unsafe.SliceData(packed))), C.int64_t(len(packed)),
		(*C.float)(unsafe.Pointer(unsafe.SliceData(scale))), C.int(K), C.int(N), 0)
	if p == nil {
		return nil, fmt.Errorf("kernels: int8: wrapping %d×%d weights: out of memory", K, N)
	}
	wt := &Int8Weights{p: p, k: K, n: N}
	runtime.SetFinalizer(wt, (*Int8Weights).Close)
	return wt, nil
}

// N is the number of columns of the weights (the length of an output row).
func (w *Int8Weights) N() int { return w.n }

// MatMul sets y (M×N) to x (M×K, both row-major) times the weights, each row of x
// quantized to int8 on its own as int8gemm_doc.go describes. M = 0 does nothing.
func (w *Int8Weights) MatMul(y, x []float32, M int) error {
	if M < 0 || M > math.MaxInt32 || len(x) != M*w.k || len(y) != M*w.n {
		return fmt.Errorf("%w: MatMul needs len(x) = M*K and len(y) = M*N (M %d, K %d, N %d, len(x) %d, len(y) %d)",
			ErrInt8Shape, M, w.k, w.n, len(x), len(y))
	}
	if M == 0 {
		return nil
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.p == nil {
		return ErrInt8Closed
	}
	rc := C.cv_i8_linear(w.p, (*C.float)(unsafe.Pointer(unsafe.SliceData(x))), C.int(M), (*C.float)(unsafe.Pointer(unsafe.SliceData(y))))
	if rc != 0 {
		return fmt.Errorf("kernels: int8: MatMul of %d rows: out of memory", M)
	}
	return nil
}

// matMulAMXModel is MatMul through the AMX kernel run on a C model of the tile
// instructions, on any CPU: the tests check the kernel's addressing, tile shapes and
// operand order with it where no AMX unit is. K must be a multiple of 64. The sums
// become outputs through the hardware kernel's epilogue where the CPU has AVX-512F,
// unless plainEpilogue asks for the model's C one.
func (w *Int8Weights) matMulAMXModel(y, x []float32, M int, plainEpilogue bool) error {
	if M < 1 || M > math.MaxInt32 || len(x) != M*w.k || len(y) != M*w.n {
		return fmt.Errorf("%w: matMulAMXModel needs len(x) = M*K and len(y) = M*N (M %d, K %d, N %d)", ErrInt8Shape, M, w.k, w.n)
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.p == nil {
		return ErrInt8Closed
	}
	switch rc := syscall.Errno(C.cv_i8_linear_amx_model(w.p, (*C.float)(unsafe.Pointer(unsafe.SliceData(x))), C.int(M), (*C.float)(unsafe.Pointer(unsafe.SliceData(y))), C.int(b2i(plainEpilogue)))); rc {
	case 0:
	case syscall.EFAULT:
		return fmt.Errorf("kernels: int8: AMX model of %d rows: the kernel broke a tile shape rule (the CPU would fault): %w", M, rc)
	default:
		return fmt.Errorf("kernels: int8: AMX model of %d rows: %w", M, rc)
	}
	return nil
}

// Close releases the packed weights. Later calls to MatMul return ErrInt8Closed; closing
// twice is harmless.
func (w *Int8Weights) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.p != nil {
		C.cv_i8w_free(w.p)
		w.p = nil
		runtime.SetFinalizer(w, nil)
	}
}

// Int8ISA names the instruction set MatMul uses on this CPU: "amx" (AMX tiles for 8 rows
// or more, AVX512-VNNI below), "avx512vnni", "avx2" or "portable".
func Int8ISA() string { return C.GoString(C.cv_i8_isa()) }

// SetInt8Threads sets how many threads, the caller's included, share one large MatMul;
// n < 1 restores the default, the number of online CPUs. Small products always run on
// the calling thread alone.
func SetInt8Threads(n int) { C.cv_i8_set_threads(C.int(max(min(n, math.MaxInt32), math.MinInt32))) }

// forceInt8ISA makes MatMul use the named instruction set ("" restores the automatic
// choice) and reports whether this CPU runs it. It is for tests and benchmarks; it
// affects every Int8Weights in the process.
func forceInt8ISA(name string) bool {
	if name == "" {
		return C.cv_i8_force_isa(nil) != 0
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return C.cv_i8_force_isa(cs) != 0
}
