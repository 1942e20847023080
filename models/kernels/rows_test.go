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
