// # Int8 GEMM
//
// The int8 GEMM (int8gemm.go, int8gemm.c) multiplies float32 activations by int8 weights the way the int8
// linear layers of models/convert's graphs do, with kernels written for decode: few
// rows (M = 1 to 64) against large weight matrices, where the time goes into reading
// the weights from memory once (M = 1) or into int8 multiply-adds (M = 16 and up).
//
// # Int8 GEMM: contract
//
// PackInt8 copies an int8 weight matrix w [K][N] (row-major: MatMulIntegerToFloat's B, as
// the builder stores it) and its per-column scales [N]. Int8Weights.MatMul computes
// y [M][N] from x [M][K], each row on its own, exactly as the builder's graph
// (linearInt8 in models/convert/quantize.go) does, operation for operation in float32:
//
//	s    = Max(ReduceMax(Abs(x[m])), 1e-30)           the row's range
//	q[k] = QuantizeLinear(x[m][k] / s, 1/127, 128) - 128
//	     = clamp(round_half_even((x[m][k] / s) / (1/127)), -128, 127)
//	acc  = sum_k q[k] · w[k][n]                        exact, int32
//	y    = (float32(acc) · ((1/127) · scale[n])) · s
//
// Rounding is half to even, not half away from zero: ONNX Runtime's QuantizeLinear
// (MLAS) divides by the scale, clamps to the uint8 range less the zero point and
// converts with the CPU's round-to-nearest-even. The saturation bounds are those of
// uint8 less 128, [-128, 127], but since |x/s| <= 1 and 1/(1/127 in float32) rounds to
// 127, codes never leave [-127, 127] and the clamp never acts on finite input. A zero
// row gets range 1e-30, codes 0 and an all-zero output row. MatMulIntegerToFloat
// multiplies its two scales once per column (a_scale · b_scale[n]) and the float32
// conversion of each int32 sum by that; the graph's Mul by s comes last. Int8Weights may
// use all of int8, -128 included; K is at most Int8MaxK so that no int32 sum overflows.
// NaN and infinite activations are not supported: their outputs are unspecified.
//
// The tests hold every kernel to a plain Go implementation of these lines bit for bit
// (not within a tolerance), at shapes with K not a multiple of 4 and N not a multiple
// of 64, for zero rows, outliers, rows below the 1e-30 floor, inputs that land exactly
// halfway between two codes, and int32 sums at their largest. They were not compared
// against ONNX Runtime itself; the reference follows ONNX Runtime's operators as
// described above.
//
// PackInt8Layout lays int8 weights out in the kernel's layout ahead of time (the builder stores
// Int8Linear's weights so) and WrapInt8 makes Int8Weights of such bytes; the Int8Linear
// operator (int8gemm_op.c, Int8OpDesc, which models/ort makes an ONNX Runtime custom operator of in
// the com.conveyor domain) reads its initializer in place, so a session holds one copy of
// the weights, not two.
//
// # Int8 GEMM: kernels
//
// Packing pads N to a multiple of 64 and K to a multiple of 4 with zero weights and
// lays each panel of 64 columns out as [K/4][64 columns][4 k]: one 64-byte load holds
// 16 columns × 4 k, and for a single row the whole panel is one linear stream. The C
// kernel (int8gemm.c) is compiled for four instruction sets in one build with
// per-function target attributes, no global -march, and picks one at run time (Int8ISA):
//
//   - amx (int8gemm_amx.h), where the CPU has AMX-TILE and AMX-INT8 (Xeon Sapphire
//     Rapids and later): calls of 8 rows or more (fewer stream the weights, which tiles
//     do not make faster, and go to avx512vnni) with K a multiple of 64 take TDPBUSD
//     on tiles of 16 rows × 64 codes against the panel's four B tiles, read from the
//     same packed layout (one 64-byte row of a panel row group is one B tile row), and
//     share avx512vnni's activation codes and epilogue, so the outputs are the same to
//     the bit. Linux gives a process the tile state only when it asks (arch_prctl
//     ARCH_REQ_XCOMP_PERM), and a faulting kernel would take the server down: the
//     first call asks, then runs the AMX kernel in a forked child on a small problem
//     and uses it only if the child exits cleanly with avx512vnni's numbers
//     (CONVEYOR_NO_AMX=1 skips it). The tests hold it to the reference like every
//     other path on a CPU that has it, and on every CPU through a model of the tile
//     instructions in C written from their definitions (TestInt8AMXKernelModel: the same
//     kernel source, compiled a second time against the model, which also checks each
//     instruction's tile-shape rules; the sums go through the hardware kernel's AVX-512
//     epilogue where the CPU has AVX-512F). The machines this kernel was measured on (AMD
//     EPYC) have no AMX, so it has not been timed.
//   - avx512vnni (int8gemm_vnni.h): vpdpbusd multiplies unsigned by signed bytes, so
//     activations are stored as code+128 and the epilogue subtracts 128·colsum(w),
//     computed at packing. A block of up to 6 rows × 64 columns keeps 24 zmm
//     accumulators over the whole of K. vpdpbusd is written as inline asm because gcc
//     12 spills a block of 16 or more accumulators to the stack with the intrinsic.
//     Each panel is read once and reused from cache by every row block; for M > 1 the
//     kernel also prefetches the next panel into L2 while it works on this one.
//   - avx2 (int8gemm_avx2.h): vpmaddubsw on |w| and the code carrying w's sign, then
//     vpmaddwd by 1; codes within ±127 and |w| <= 128 keep every int16 pair sum below
//     32767, so it is exact with no correction term. One row streams each panel front
//     to back; 2 to 16 rows take a panel 8 k-steps (2 KB) at a time, each 16-column
//     quarter of the chunk in turn for a block of up to 5 rows, so the chunk comes from
//     memory once and from L1 after; more rows go in blocks of 4 rows × 32 columns.
//   - portable: plain C, any CPU.
//
// # Int8 GEMM: threads
//
// A call below 2^18 multiply-adds runs on the calling thread alone. A larger one takes
// a persistent pthread pool (SetInt8Threads; by default one thread per online CPU, the
// caller included, which does its share): the rows are quantized in parallel when
// there are 8 or more, then the threads split the panels, or the rows when there are
// fewer panels than threads. Each thread works through its own panels from the front,
// prefetching the next one, and a thread done with its own takes the panels left at
// the back of the others' (a worker that woke from its futex late, or a core another
// process holds, would otherwise keep the caller waiting): on the 0.5B int8 model a
// 16-row decode step went from 41.6 to 41.0 ms (medians of 3, same session). Between calls a worker spins for 50 µs, enough to cover
// the gap between one layer's calls and the next, and then sleeps on a futex, so an
// idle server burns no CPU. One call at a time drives the pool; a call that finds it
// busy (two ONNX Runtime sessions running at once) runs on its own thread instead of
// waiting. Quantized rows live in a per-thread buffer kept between calls.
//
// # Int8 GEMM: performance
//
// Medians of 5 runs of BenchmarkInt8Linear on a 2-core AMD EPYC (Zen 4, AVX-512 VNNI)
// KVM guest, 2 threads, Qwen2.5-0.5B's layer shapes, each call reading its weights
// from memory (256 MB of packed copies are cycled through; the head alone is 136 MB).
// Milliseconds per call (GMAC/s):
//
//	shape   K × N          M = 1          M = 16         M = 64
//	head    896 × 151936   5.57 (24.5)    6.83 (319)     22.1 (394)
//	gateup  896 × 9728     0.340 (25.6)   0.460 (303)    1.42 (394)
//	down    4864 × 896     0.206 (21.1)   0.269 (260)    0.773 (361)
//	qkv     896 × 1152     0.052 (19.9)   0.077 (216)    0.210 (315)
//	o       896 × 896      0.044 (18.4)   0.063 (204)    0.179 (288)
//
// At M = 1 the kernel reads weights at 18–26 GB/s, most of the 27–31 GB/s that a plain
// two-thread streaming read gets from this VM's memory; at M = 16 and 64 the large shapes run at
// 65–85% of the two cores' vpdpbusd peak (about 460 GMAC/s). The small shapes (qkv,
// o) lose 5–15 µs per call to starting the memory streams and handing work to the
// other thread. Run-to-run noise on this machine is ±10% and more for the
// memory-bound points. The AVX2 kernel (BenchmarkInt8LinearAVX2, medians of 3) is
// 30–60% slower at M = 1 (head 8.64 ms, gateup 0.479 ms) and 2.7–3.4× slower at
// M >= 16 (head 23.5 and 74.1 ms, gateup 1.52 and 4.99 ms).
//
// # Int8 GEMM: usage
//
//	w, err := kernels.PackInt8(codes, scales, K, N) // codes []int8 [K][N], scales []float32 [N]
//	if err != nil {
//		return err
//	}
//	defer w.Close()
//	if err := w.MatMul(y, x, M); err != nil { // x []float32 [M][K], y []float32 [M][N]
//		return err
//	}
package kernels
