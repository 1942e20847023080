package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// benchShapes are Qwen2.5-0.5B's int8 linear layers (K inputs, N outputs).
var benchShapes = []struct {
	name string
	K, N int
}{
	{"head", 896, 151936},
	{"gateup", 896, 9728},
	{"down", 4864, 896},
	{"qkv", 896, 1152},
	{"o", 896, 896},
}

// coldBytes is how many bytes of packed weights a benchmark cycles through: well past
// the last-level cache, so that every call reads its weights from memory as a decode
// step does.
const coldBytes = 256 << 20

// BenchmarkInt8Linear times one MatMul per shape and batch of rows M with the
// instruction set this CPU gets, reporting milliseconds and multiply-adds per second.
// Each call uses the next of several packed copies of the weights (one for the head,
// which alone is larger than the cache).
func BenchmarkInt8Linear(b *testing.B) { benchLinear(b, "") }

// BenchmarkInt8LinearAVX2 is BenchmarkInt8Linear with the AVX2 kernel forced, the one
// CPUs without AVX512-VNNI get.
func BenchmarkInt8LinearAVX2(b *testing.B) { benchLinear(b, "avx2") }

func benchLinear(b *testing.B, isa string) {
	if isa != "" {
		if !forceInt8ISA(isa) {
			b.Skipf("%s is not supported on this CPU", isa)
		}
		defer forceInt8ISA("")
	}
	r := rand.New(rand.NewPCG(1, 1))
	for _, sh := range benchShapes {
		b.Run(sh.name, func(b *testing.B) {
			w, scale := randWeights(r, sh.K, sh.N)
			copies := max(1, coldBytes/(sh.K*sh.N))
			ws := make([]*Int8Weights, copies)
			for i := range ws {
				var err error
				if ws[i], err = PackInt8(w, scale, sh.K, sh.N); err != nil {
					b.Fatal(err)
				}
				defer ws[i].Close()
			}
			for _, M := range []int{1, 2, 5, 8, 16, 64} {
				b.Run(fmt.Sprintf("M%d", M), func(b *testing.B) {
					x := randInput(r, M, sh.K)
					y := make([]float32, M*sh.N)
					i := 0
					for b.Loop() {
						if err := ws[i%copies].MatMul(y, x, M); err != nil {
							b.Fatal(err)
						}
						i++
					}
					perOp := b.Elapsed().Seconds() / float64(b.N)
					b.ReportMetric(perOp*1e3, "ms/op")
					b.ReportMetric(float64(M)*float64(sh.K)*float64(sh.N)/perOp/1e9, "GMAC/s")
				})
			}
		})
	}
}
