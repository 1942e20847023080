package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
)

// int8ISANames lists the instruction sets, slowest first.
var int8ISANames = []string{"portable", "avx2", "avx512vnni", "amx"}

// qscale is QuantizeLinear's y_scale in the graph models/convert emits.
const qscale = float32(1.0 / 127)

// quantCode is the graph's code for x in a row whose range is s:
// QuantizeLinear(x / s, 1/127, 128) - 128, rounding half to even and saturating.
func quantCode(x, s float32) int32 {
	u := (x / s) / qscale
	u = min(max(u, -128), 127)
	return int32(math.RoundToEven(float64(u)))
}

// rowRange is the graph's Max(ReduceMax(Abs(x)), 1e-30) for one row.
func rowRange(row []float32) float32 {
	var amax float32
	for _, v := range row {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	return max(amax, float32(1e-30))
}

// reference computes MatMul's definition in plain Go: int32 sums, then
// (float32(acc) · (1/127 · scale[n])) · s, one float32 rounding per operation as in the
// graph.
func int8Reference(w []int8, scale []float32, K, N int, x []float32, M int) []float32 {
	y := make([]float32, M*N)
	q := make([]int32, K)
	acc := make([]int32, N)
	for m := range M {
		row := x[m*K : (m+1)*K]
		s := rowRange(row)
		for k, v := range row {
			q[k] = quantCode(v, s)
		}
		clear(acc)
		for k := range K {
			if q[k] == 0 {
				continue
			}
			for n, wv := range w[k*N : (k+1)*N] {
				acc[n] += q[k] * int32(wv)
			}
		}
		for n := range N {
			mult := qscale * scale[n]
			y[m*N+n] = float32(acc[n]) * mult * s
		}
	}
	return y
}

// forEachISA runs f once with every instruction set this CPU supports forced.
func forEachISA(t *testing.T, f func(t *testing.T)) {
	t.Cleanup(func() { forceInt8ISA("") })
	ran := 0
	for _, isa := range int8ISANames {
		if !forceInt8ISA(isa) {
			t.Logf("%s: not supported on this CPU, skipped", isa)
			continue
		}
		ran++
		t.Run(isa, f)
	}
	if ran == 0 {
		t.Fatal("no instruction set could be forced, not even portable")
	}
}

func randWeights(r *rand.Rand, K, N int) ([]int8, []float32) {
	w := make([]int8, K*N)
	for i := range w {
		w[i] = int8(r.IntN(256) - 128)
	}
	scale := make([]float32, N)
	for i := range scale {
		scale[i] = float32(0.001 + 0.02*r.Float64())
	}
	return w, scale
}

// randInput fills M rows of K values, including the awkward rows: row 0 of every
// input with M > 2 is all zeros, row 1 has an outlier a thousand times the rest, and
// row 2 is below the graph's 1e-30 range floor.
func randInput(r *rand.Rand, M, K int) []float32 {
	x := make([]float32, M*K)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	if M > 2 {
		clear(x[:K])
		x[K+r.IntN(K)] = 1000
		for k := range K {
			x[2*K+k] = float32(r.NormFloat64() * 1e-32)
		}
	}
	return x
}

// checkExact compares y to want bit for bit, naming the first difference.
func checkExact(t *testing.T, y, want []float32, N int) {
	t.Helper()
	bad := 0
	for i := range want {
		if math.Float32bits(y[i]) != math.Float32bits(want[i]) {
			if bad == 0 {
				t.Errorf("y[%d][%d] = %g, want %g", i/N, i%N, y[i], want[i])
			}
			bad++
		}
	}
	if bad > 1 {
		t.Errorf("%d of %d outputs differ", bad, len(want))
	}
}

// matMulGuarded runs MatMul on a y with guard values behind it and fails if the kernel
// writes past M·N (padded columns must never be stored).
func matMulGuarded(t *testing.T, wt *Int8Weights, x []float32, M int) []float32 {
	t.Helper()
	const guard = 256
	buf := make([]float32, M*wt.N()+guard)
	sentinel := float32(math.Inf(-1))
	for i := range buf {
		buf[i] = sentinel
	}
	y := buf[:M*wt.N()]
	if err := wt.MatMul(y, x, M); err != nil {
		t.Fatal(err)
	}
	for i, v := range buf[M*wt.N():] {
		if v != sentinel {
			t.Fatalf("kernel wrote %g at y[%d], past the %d outputs", v, M*wt.N()+i, M*wt.N())
		}
	}
	return y
}

func TestInt8MatchesReference(t *testing.T) {
	type shape struct{ K, N int }
	shapes := []shape{{1, 1}, {3, 5}, {4, 64}, {7, 100}, {33, 200}, {130, 129}, {896, 100}, {896, 1152}, {4864, 96}}
	ms := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 16, 17, 64}
	forEachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		for _, sh := range shapes {
			w, scale := randWeights(r, sh.K, sh.N)
			wt, err := PackInt8(w, scale, sh.K, sh.N)
			if err != nil {
				t.Fatal(err)
			}
			for _, M := range ms {
				t.Run(fmt.Sprintf("K%d_N%d_M%d", sh.K, sh.N, M), func(t *testing.T) {
					x := randInput(r, M, sh.K)
					y := matMulGuarded(t, wt, x, M)
					checkExact(t, y, int8Reference(w, scale, sh.K, sh.N, x, M), sh.N)
				})
			}
			wt.Close()
		}
	})
}

// TestInt8WrapMatchesPack: weights laid out by PackInt8Layout (as the builder stores them) and
// wrapped compute exactly what the reference does, on every instruction set; a wrong
// length is refused.
func TestInt8WrapMatchesPack(t *testing.T) {
	type shape struct{ K, N int }
	forEachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, sh := range []shape{{1, 1}, {7, 100}, {130, 129}, {896, 1152}} {
			w, scale := randWeights(r, sh.K, sh.N)
			raw := make([]byte, len(w))
			for i, v := range w {
				raw[i] = byte(v)
			}
			packed, err := PackInt8Layout(raw, sh.K, sh.N)
			if err != nil || len(packed) != Int8PackedSize(sh.K, sh.N) {
				t.Fatalf("PackInt8Layout %v: %d bytes, %v", sh, len(packed), err)
			}
			wrapped, err := WrapInt8(packed, scale, sh.K, sh.N)
			if err != nil {
				t.Fatal(err)
			}
			for _, M := range []int{1, 16} {
				x := randInput(r, M, sh.K)
				checkExact(t, matMulGuarded(t, wrapped, x, M), int8Reference(w, scale, sh.K, sh.N, x, M), sh.N)
			}
			wrapped.Close()
			if _, err := WrapInt8(packed[1:], scale, sh.K, sh.N); !errors.Is(err, ErrInt8Shape) {
				t.Fatalf("WrapInt8 of a short buffer: %v", err)
			}
		}
	})
}

// TestInt8VocabularyWidth covers the language-model head's width, N = 151936, with a short
// K to keep the reference quick.
func TestInt8VocabularyWidth(t *testing.T) {
	const K, N = 12, 151936
	forEachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		w, scale := randWeights(r, K, N)
		wt, err := PackInt8(w, scale, K, N)
		if err != nil {
			t.Fatal(err)
		}
		defer wt.Close()
		for _, M := range []int{1, 2, 5} {
			x := randInput(r, M, K)
			checkExact(t, matMulGuarded(t, wt, x, M), int8Reference(w, scale, K, N, x, M), N)
		}
	})
}

// TestInt8Extremes drives the int32 sums to their largest magnitude (K = Int8MaxK, every code
// 127 and every weight -128) and checks outliers and a negative and a zero scale.
func TestInt8Extremes(t *testing.T) {
	forEachISA(t, func(t *testing.T) {
		const K, N = Int8MaxK, 70
		w := make([]int8, K*N)
		for i := range w {
			w[i] = -128
			if i%N == 69 {
				w[i] = 127
			}
		}
		scale := make([]float32, N)
		for i := range scale {
			scale[i] = 1
		}
		scale[1], scale[2] = -0.5, 0
		wt, err := PackInt8(w, scale, K, N)
		if err != nil {
			t.Fatal(err)
		}
		defer wt.Close()
		const M = 3
		x := make([]float32, M*K)
		for k := range K {
			x[k] = 3.5    // every code 127
			x[K+k] = -1e6 // every code -127
			x[2*K+k] = float32(k%7) - 3
		}
		x[2*K+5] = 3e38 // an outlier near float32's limit: the other codes round to 0
		y := matMulGuarded(t, wt, x, M)
		want := int8Reference(w, scale, K, N, x, M)
		checkExact(t, y, want, N)
		// Independently of the reference: 131072 · 127 · -128 / 127 · 3.5.
		if want := float64(K) * -128 * 3.5; math.Abs(float64(y[0])/want-1) > 1e-6 {
			t.Errorf("y[0][0] = %g, want %g", y[0], want)
		}
	})
}

// TestInt8RoundsHalfToEven checks the reference's rounding on inputs whose scaled value
// is exactly halfway between two codes, so that the kernels are held to the graph's
// QuantizeLinear rounding, not to round-half-away-from-zero.
func TestInt8RoundsHalfToEven(t *testing.T) {
	// With a row range of 1, x / 1 / (1/127) is exact for these x when it lands on a
	// half: collect the ones that do.
	var ties []float32
	for j := range 127 {
		x := float32(float64(j)+0.5) * qscale
		u := (x / 1) / qscale
		if u == float32(j)+0.5 {
			ties = append(ties, x, -x)
		}
	}
	if len(ties) < 10 {
		t.Fatalf("only %d exact halves found; the test needs another construction", len(ties))
	}
	for _, x := range ties {
		c := quantCode(x, 1)
		u := float64(x / qscale)
		if c%2 != 0 || math.Abs(float64(c)-u) != 0.5 {
			t.Fatalf("code for %g (scaled %g) = %d, want the even neighbour", x, u, c)
		}
	}
	K := len(ties) + 1
	x := append([]float32{1}, ties...)
	forEachISA(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		w, scale := randWeights(r, K, 64)
		wt, err := PackInt8(w, scale, K, 64)
		if err != nil {
			t.Fatal(err)
		}
		defer wt.Close()
		checkExact(t, matMulGuarded(t, wt, x, 1), int8Reference(w, scale, K, 64, x, 1), 64)
	})
}

// TestInt8ThreadCounts runs a large product with 1, 2, 3 and the default number of
// threads: every split must give the same bits.
func TestInt8ThreadCounts(t *testing.T) {
	t.Cleanup(func() { SetInt8Threads(0) })
	r := rand.New(rand.NewPCG(7, 8))
	const K, N = 300, 1000
	w, scale := randWeights(r, K, N)
	wt, err := PackInt8(w, scale, K, N)
	if err != nil {
		t.Fatal(err)
	}
	defer wt.Close()
	forEachISA(t, func(t *testing.T) {
		for _, M := range []int{1, 3, 17, 64} {
			x := randInput(r, M, K)
			want := int8Reference(w, scale, K, N, x, M)
			for _, n := range []int{1, 2, 3, 0} {
				SetInt8Threads(n)
				checkExact(t, matMulGuarded(t, wt, x, M), want, N)
			}
		}
	})
}

// TestInt8ConcurrentCalls runs MatMul from several goroutines at once, on shared and on
// separate weights: the pool serves one call and the others run on their own
// threads, and every result must match a serial run.
func TestInt8ConcurrentCalls(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	const K, N = 896, 1152
	w, scale := randWeights(r, K, N)
	shared, err := PackInt8(w, scale, K, N)
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	const workers, rounds = 6, 15
	inputs := make([][]float32, workers)
	wants := make([][]float32, workers)
	for i := range workers {
		M := []int{1, 5, 16}[i%3]
		inputs[i] = randInput(r, M, K)
		wants[i] = int8Reference(w, scale, K, N, inputs[i], M)
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wt := shared
			if i%2 == 1 { // half the goroutines bring their own copy
				own, err := PackInt8(w, scale, K, N)
				if err != nil {
					errs <- err
					return
				}
				defer own.Close()
				wt = own
			}
			M := len(inputs[i]) / K
			y := make([]float32, M*N)
			for range rounds {
				clear(y)
				if err := wt.MatMul(y, inputs[i], M); err != nil {
					errs <- err
					return
				}
				for j := range y {
					if math.Float32bits(y[j]) != math.Float32bits(wants[i][j]) {
						errs <- fmt.Errorf("goroutine %d: y[%d] = %g, want %g", i, j, y[j], wants[i][j])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestInt8BadArguments(t *testing.T) {
	w := make([]int8, 12)
	scale := make([]float32, 4)
	for _, c := range []struct {
		name  string
		w     []int8
		scale []float32
		K, N  int
	}{
		{"K 0", nil, scale, 0, 4},
		{"N 0", nil, nil, 3, 0},
		{"negative K", w, scale, -3, -4},
		{"short w", w[:11], scale, 3, 4},
		{"long w", append(w, 0), scale, 3, 4},
		{"short scale", w, scale[:3], 3, 4},
		{"nil w", nil, scale, 3, 4},
		{"K over Int8MaxK", make([]int8, (Int8MaxK+1)*1), []float32{1}, Int8MaxK + 1, 1},
	} {
		if wt, err := PackInt8(c.w, c.scale, c.K, c.N); !errors.Is(err, ErrInt8Shape) {
			t.Errorf("PackInt8 %s: err = %v, want ErrInt8Shape", c.name, err)
			if wt != nil {
				wt.Close()
			}
		}
	}

	wt, err := PackInt8(w, scale, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 2*3)
	y := make([]float32, 2*4)
	for _, c := range []struct {
		name string
		y, x []float32
		M    int
	}{
		{"negative M", y, x, -1},
		{"short x", y, x[:5], 2},
		{"long x", y, append(x, 0), 2},
		{"short y", y[:7], x, 2},
		{"nil x", y, nil, 2},
		{"M too big", y, x, 3},
	} {
		if err := wt.MatMul(c.y, c.x, c.M); !errors.Is(err, ErrInt8Shape) {
			t.Errorf("MatMul %s: err = %v, want ErrInt8Shape", c.name, err)
		}
	}
	if err := wt.MatMul(nil, nil, 0); err != nil {
		t.Errorf("MatMul with M 0: %v", err)
	}
	if err := wt.MatMul(y, x, 2); err != nil {
		t.Errorf("MatMul: %v", err)
	}
	wt.Close()
	wt.Close()
	if err := wt.MatMul(y, x, 2); !errors.Is(err, ErrInt8Closed) {
		t.Errorf("MatMul after Close: err = %v, want ErrInt8Closed", err)
	}
}

func TestInt8ISA(t *testing.T) {
	t.Cleanup(func() { forceInt8ISA("") })
	got := Int8ISA()
	found := false
	for _, n := range int8ISANames {
		found = found || n == got
	}
	if !found {
		t.Fatalf("Int8ISA() = %q, not one of %q", got, int8ISANames)
	}
	if forceInt8ISA("sse9") {
		t.Error("forcing an unknown instruction set succeeded")
	}
	if !forceInt8ISA("portable") || Int8ISA() != "portable" {
		t.Errorf("after forcing portable, Int8ISA() = %q", Int8ISA())
	}
	forceInt8ISA("")
	if Int8ISA() != got {
		t.Errorf("after restoring, Int8ISA() = %q, want %q", Int8ISA(), got)
	}
}

// TestInt8AMXKernelModel runs the AMX kernel on the C model of the tile instructions (on
// any CPU) and holds it to the reference bit for bit: row counts around the 16-row
// tile, partial panels, K of one to many 64-byte tiles. A wrong stride, tile shape or
// operand order in the kernel fails here even where no AMX unit is.
func TestInt8AMXKernelModel(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, sh := range []struct{ K, N int }{{64, 1}, {64, 64}, {128, 100}, {896, 200}, {192, 129}} {
		w, scale := randWeights(r, sh.K, sh.N)
		wt, err := PackInt8(w, scale, sh.K, sh.N)
		if err != nil {
			t.Fatal(err)
		}
		for _, M := range []int{1, 7, 8, 15, 16, 17, 33} {
			x := randInput(r, M, sh.K)
			want := int8Reference(w, scale, sh.K, sh.N, x, M)
			for _, plain := range []bool{false, true} {
				y := make([]float32, M*sh.N)
				if err := wt.matMulAMXModel(y, x, M, plain); errors.Is(err, syscall.ENOSYS) {
					t.Skip("the AMX kernel is not built on this platform")
				} else if err != nil {
					t.Fatalf("K %d N %d M %d: %v", sh.K, sh.N, M, err)
				}
				checkExact(t, y, want, sh.N)
			}
		}
		wt.Close()
	}
	// K not a multiple of 64 is the VNNI kernel's.
	w, scale := randWeights(r, 96, 8)
	wt, err := PackInt8(w, scale, 96, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer wt.Close()
	if err := wt.matMulAMXModel(make([]float32, 8), randInput(r, 1, 96), 1, false); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("K = 96: %v, want EINVAL", err)
	}
}
