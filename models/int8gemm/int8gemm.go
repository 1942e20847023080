package int8gemm

// #cgo CFLAGS: -O3 -std=gnu11
// #cgo LDFLAGS: -lpthread
// #include <stdlib.h>
// #include "kernel.h"
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

// ErrShape reports arguments whose shapes or lengths do not fit together.
var ErrShape = errors.New("int8gemm: bad shape")

// ErrClosed reports a call on closed Weights.
var ErrClosed = errors.New("int8gemm: weights are closed")

// MaxK is the largest K that Pack accepts: below it no int32 sum of K products of an
// int8 code and an int8 weight can overflow.
const MaxK = C.CV_I8_MAX_K

// Weights is an int8 weight matrix [K][N] with one float32 scale per column, packed
// for the kernel. Its methods may be called from several goroutines at once; Close
// waits for running MatMuls to return.
type Weights struct {
	mu   sync.RWMutex // held shared while the kernel reads p, exclusively by Close
	p    *C.cv_i8w
	k, n int
}

// Pack copies w (int8 [K][N], row-major: the layout of MatMulIntegerToFloat's B) and
// scale ([N]) into packed Weights. Close releases them; so does the garbage collector,
// eventually, for Weights that are dropped unclosed.
func Pack(w []int8, scale []float32, K, N int) (*Weights, error) {
	if K < 1 || N < 1 || K > MaxK || N > math.MaxInt32-64 || len(w) != K*N || len(scale) != N {
		return nil, fmt.Errorf("%w: Pack needs 1 <= K <= %d, N >= 1, len(w) = K*N and len(scale) = N (K %d, N %d, len(w) %d, len(scale) %d)",
			ErrShape, MaxK, K, N, len(w), len(scale))
	}
	packed, err := Packed(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)), K, N)
	if err != nil {
		return nil, err
	}
	return Wrap(packed, scale, K, N)
}

// Wrap makes Weights of [K][N] weights already in the packed layout (Packed) and their
// scales, copying both. (The Int8Linear operator wraps ONNX Runtime's initializer in
// place instead: C memory, which the kernel may keep.)
func Wrap(packed []byte, scale []float32, K, N int) (*Weights, error) {
	if K < 1 || N < 1 || K > MaxK || N > math.MaxInt32-64 || len(packed) != PackedSize(K, N) || len(scale) != N {
		return nil, fmt.Errorf("%w: Wrap needs 1 <= K <= %d, N >= 1, len(packed) = PackedSize(K, N) and len(scale) = N (K %d, N %d, len(packed) %d, len(scale) %d)",
			ErrShape, MaxK, K, N, len(packed), len(scale))
	}
	p := C.cv_i8w_wrap((*C.int8_t)(unsafe.Pointer(unsafe.SliceData(packed))), C.int64_t(len(packed)),
		(*C.float)(unsafe.Pointer(unsafe.SliceData(scale))), C.int(K), C.int(N), 0)
	if p == nil {
		return nil, fmt.Errorf("int8gemm: wrapping %d×%d weights: out of memory", K, N)
	}
	wt := &Weights{p: p, k: K, n: N}
	runtime.SetFinalizer(wt, (*Weights).Close)
	return wt, nil
}

// K is the number of rows of the weights (the length of an input row).
func (w *Weights) K() int { return w.k }

// N is the number of columns of the weights (the length of an output row).
func (w *Weights) N() int { return w.n }

// MatMul sets y (M×N) to x (M×K, both row-major) times the weights, each row of x
// quantized to int8 on its own as doc.go describes. M = 0 does nothing.
func (w *Weights) MatMul(y, x []float32, M int) error {
	if M < 0 || M > math.MaxInt32 || len(x) != M*w.k || len(y) != M*w.n {
		return fmt.Errorf("%w: MatMul needs len(x) = M*K and len(y) = M*N (M %d, K %d, N %d, len(x) %d, len(y) %d)",
			ErrShape, M, w.k, w.n, len(x), len(y))
	}
	if M == 0 {
		return nil
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.p == nil {
		return ErrClosed
	}
	rc := C.cv_i8_linear(w.p, (*C.float)(unsafe.Pointer(unsafe.SliceData(x))), C.int(M), (*C.float)(unsafe.Pointer(unsafe.SliceData(y))))
	if rc != 0 {
		return fmt.Errorf("int8gemm: MatMul of %d rows: out of memory", M)
	}
	return nil
}

// matMulAMXModel is MatMul through the AMX kernel run on a C model of the tile
// instructions, on any CPU: the tests check the kernel's addressing, tile shapes and
// operand order with it where no AMX unit is. K must be a multiple of 64. The sums
// become outputs through the hardware kernel's epilogue where the CPU has AVX-512F,
// unless plainEpilogue asks for the model's C one.
func (w *Weights) matMulAMXModel(y, x []float32, M int, plainEpilogue bool) error {
	if M < 1 || M > math.MaxInt32 || len(x) != M*w.k || len(y) != M*w.n {
		return fmt.Errorf("%w: matMulAMXModel needs len(x) = M*K and len(y) = M*N (M %d, K %d, N %d)", ErrShape, M, w.k, w.n)
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.p == nil {
		return ErrClosed
	}
	switch rc := syscall.Errno(C.cv_i8_linear_amx_model(w.p, (*C.float)(unsafe.Pointer(unsafe.SliceData(x))), C.int(M), (*C.float)(unsafe.Pointer(unsafe.SliceData(y))), C.int(boolInt(plainEpilogue)))); rc {
	case 0:
	case syscall.EFAULT:
		return fmt.Errorf("int8gemm: AMX model of %d rows: the kernel broke a tile shape rule (the CPU would fault): %w", M, rc)
	default:
		return fmt.Errorf("int8gemm: AMX model of %d rows: %w", M, rc)
	}
	return nil
}

// Close releases the packed weights. Later calls to MatMul return ErrClosed; closing
// twice is harmless.
func (w *Weights) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.p != nil {
		C.cv_i8w_free(w.p)
		w.p = nil
		runtime.SetFinalizer(w, nil)
	}
}

// ISA names the instruction set MatMul uses on this CPU: "amx" (AMX tiles for 8 rows
// or more, AVX512-VNNI below), "avx512vnni", "avx2" or "portable".
func ISA() string { return C.GoString(C.cv_i8_isa()) }

// SetThreads sets how many threads, the caller's included, share one large MatMul;
// n < 1 restores the default, the number of online CPUs. Small products always run on
// the calling thread alone.
func SetThreads(n int) { C.cv_i8_set_threads(C.int(max(min(n, math.MaxInt32), math.MinInt32))) }

// isaNames lists the instruction sets, slowest first.
var isaNames = []string{"portable", "avx2", "avx512vnni", "amx"}

// forceISA makes MatMul use the named instruction set ("" restores the automatic
// choice) and reports whether this CPU runs it. It is for tests and benchmarks; it
// affects every Weights in the process.
func forceISA(name string) bool {
	if name == "" {
		return C.cv_i8_force_isa(nil) != 0
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return C.cv_i8_force_isa(cs) != 0
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
