package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestRowExp checks the vectorised exponential sum against math.Exp over lengths that
// leave every tail size, -Inf (masked, exactly 0), arguments beyond exp's float32 range
// (0) and NaN in RowMax.
func TestRowExp(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for n := range 40 {
		x := make([]float32, n*37+n%8)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 20)
			if i%11 == 3 {
				x[i] = float32(math.Inf(-1))
			}
		}
		m := RowMax(x)
		scale := float32(1 + rng.Float64())
		out := make([]float32, len(x))
		sum := RowExp(x, out, m, scale)
		want := 0.0
		for i, v := range x {
			e := math.Exp(float64((v - m) * scale))
			if float64((v-m)*scale) < -87 {
				e = 0
			}
			want += e
			if d := math.Abs(float64(out[i]) - e); d > 2e-7*e {
				t.Fatalf("n %d: exp(%g) = %g, want %g", len(x), (v-m)*scale, out[i], e)
			}
			if math.IsInf(float64(v), -1) && out[i] != 0 {
				t.Fatalf("a masked logit has probability %g", out[i])
			}
		}
		if math.Abs(sum-want) > 1e-6*want || (len(x) > 0 && sum != sum) {
			t.Fatalf("n %d: sum %g, want %g", len(x), sum, want)
		}
		if len(x) > 0 {
			x[len(x)/2] = float32(math.NaN())
			if r := RowMax(x); !math.IsNaN(float64(r)) {
				t.Fatalf("n %d: RowMax with a NaN = %g", len(x), r)
			}
		}
	}
}

// TestRowExpRule checks simd.h's exp rule through RowExp, in the vector lanes and the
// scalar tail alike: arguments below -87 and NaN give 0, arguments above 88 give e^88.
func TestRowExpRule(t *testing.T) {
	args := []float32{float32(math.NaN()), -87.5, -86.5, 100, 0, float32(math.Inf(-1)), 88.5, -1}
	for _, n := range []int{len(args), 19} { // one vector and its tail, or the tail alone
		x := make([]float32, n)
		for i := range x {
			x[i] = args[i%len(args)]
		}
		out := make([]float32, n)
		sum := RowExp(x, out, 0, 1)
		want := 0.0
		for i, a := range x {
			e := 0.0
			switch {
			case a != a || a < -87:
			case a > 88:
				e = math.Exp(88)
			default:
				e = math.Exp(float64(a))
			}
			if d := math.Abs(float64(out[i]) - e); d > 2e-7*e {
				t.Errorf("n %d: term %d of exp(%g) = %g, want %g", n, i, a, out[i], e)
			}
			want += e
		}
		if math.Abs(sum-want) > 1e-6*want {
			t.Errorf("n %d: sum %g, want %g", n, sum, want)
		}
	}
}
