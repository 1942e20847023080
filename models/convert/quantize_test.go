package convert

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/gguf"
)

// dequantize decodes MatMulNBits' layout back to a [rows][in] matrix, written from the
// operator's definition: value = (code - 2^(bits-1)) * scale, codes packed low bits
// first along the input axis.
func dequantize(q Quantization, qw quantizedWeight, rows, in int) [][]float32 {
	blocks := (in + q.BlockSize - 1) / q.BlockSize
	blob := q.BlockSize * q.Bits / 8
	out := make([][]float32, rows)
	for r := range out {
		out[r] = make([]float32, in)
		for k := 0; k < in; k++ {
			j, i := k/q.BlockSize, k%q.BlockSize
			b := qw.codes[(r*blocks+j)*blob:]
			var code int
			if q.Bits == 8 {
				code = int(b[i])
			} else {
				code = int(b[i/2]>>(4*(i%2))) & 0xf
			}
			out[r][k] = float32(code-(1<<(q.Bits-1))) * qw.scales[r*blocks+j]
		}
	}
	return out
}

// TestQuantizeRows checks the quantizer against its decoding: every value within one
// step of its block's scale (half a step unless clipped), the error no larger than the
// clipping-free scale's, projections stacked in order with their factors applied, and
// a ragged last block padded.
func TestQuantizeRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const in = 72 // two full 32-blocks and a ragged one
	a, c := randomProjections(rng, in)
	a[5] = -7.5 // a block whose extreme is negative
	for _, bits := range []int{4} {
		q := Quantization{Bits: bits, BlockSize: 32}
		qw := quantizeRows(q, in, []projection{{w: a, scale: 0.5}, {w: c, scale: 1}})
		got := dequantize(q, qw, 5, in)
		want := func(r, k int) float32 {
			if r < 3 {
				return a[r*in+k] * 0.5
			}
			return c[(r-3)*in+k]
		}
		for r := 0; r < 5; r++ {
			for k := 0; k < in; k++ {
				scale := math.Abs(float64(qw.scales[r*3+k/32]))
				if d := math.Abs(float64(got[r][k] - want(r, k))); d > scale+1e-6 {
					t.Fatalf("int%d row %d col %d: %g decodes to %g (scale %g)", bits, r, k, want(r, k), got[r][k], scale)
				}
			}
		}
		// The total squared error is at most that of the clipping-free symmetric scale.
		var sse, sym float64
		for r := 0; r < 5; r++ {
			for j := 0; j*32 < in; j++ {
				amax := 0.0
				for k := j * 32; k < min(in, j*32+32); k++ {
					amax = math.Max(amax, math.Abs(float64(want(r, k))))
				}
				step := amax / float64(int(1)<<(bits-1)-1)
				for k := j * 32; k < min(in, j*32+32); k++ {
					w := float64(want(r, k))
					sse += math.Pow(float64(got[r][k])-w, 2)
					sym += math.Pow(math.Round(w/step)*step-w, 2)
				}
			}
		}
		if sse > sym*(1+1e-6) {
			t.Errorf("int%d: squared error %g above the symmetric scale's %g", bits, sse, sym)
		}
	}
	if _, err := ParseQuantization("int3"); err == nil {
		t.Error("int3 accepted")
	}
	if err := (Quantization{Bits: 4, BlockSize: 24}).validate(); err == nil {
		t.Error("block size 24 accepted")
	}
}

// TestQuantizeColumns checks the int8 quantizer against MatMulIntegerToFloat's
// definition of B (value = int8 code * scale of its column): projections stacked as
// columns in order with their factors applied, every value within half a step of its
// column's scale, each column's largest magnitude exactly at ±127, and a zero column
// kept zero.
func TestQuantizeColumns(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const in = 70
	a, c := randomProjections(rng, in)
	a[in+5] = -9  // column 1's extreme is negative
	clear(c[in:]) // column 4 is all zero
	cw := quantizeColumns(in, []projection{{w: a, scale: 0.5}, {w: c, scale: 1}})
	const cols = 5
	if len(cw.codes) != in*cols || len(cw.scales) != cols {
		t.Fatalf("%d codes, %d scales; want %d, %d", len(cw.codes), len(cw.scales), in*cols, cols)
	}
	want := func(col, k int) float32 {
		if col < 3 {
			return a[col*in+k] * 0.5
		}
		return c[(col-3)*in+k]
	}
	for col := range cols {
		extreme := 0
		for k := range in {
			code := int8(cw.codes[k*cols+col])
			if code == -128 {
				t.Fatalf("column %d row %d: code -128 (the range is symmetric)", col, k)
			}
			got := float32(code) * cw.scales[col]
			if d := math.Abs(float64(got - want(col, k))); d > float64(cw.scales[col])/2+1e-6 {
				t.Fatalf("column %d row %d: %g decodes to %g (scale %g)", col, k, want(col, k), got, cw.scales[col])
			}
			if code == 127 || code == -127 {
				extreme++
			}
		}
		if col == 4 {
			if cw.scales[col] != 0 || extreme != 0 {
				t.Errorf("zero column: scale %g, %d extreme codes", cw.scales[col], extreme)
			}
		} else if extreme == 0 {
			t.Errorf("column %d: no code at ±127 (scale %g wastes range)", col, cw.scales[col])
		}
	}
	if int8(cw.codes[5*cols+1]) != -127 {
		t.Errorf("column 1's extreme -9*0.5 coded %d, want -127", int8(cw.codes[5*cols+1]))
	}
	if err := (Quantization{Bits: 8, BlockSize: 32}).validate(); err == nil {
		t.Error("int8 with a block size accepted")
	}
}

// randomProjections returns two weights of in columns: a ([3, in], unit normal) and c
// ([2, in], ten times larger), to be stacked with different scales.
func randomProjections(rng *rand.Rand, in int) (a, c []float32) {
	a, c = make([]float32, 3*in), make([]float32, 2*in)
	for i := range a {
		a[i] = float32(rng.NormFloat64())
	}
	for i := range c {
		c[i] = float32(rng.NormFloat64() * 10)
	}
	return a, c
}

// TestQ4_0KeptExactly: int4 rounding of a GGUF file's Q4_0 weights (decoded to float32)
// gives back the file's own blocks, value for value: Q4_0 maps each block's value of
// largest magnitude to code 0, the first of the two scales quantizeRows tries, so the
// Q4_0 part of a build is not rounded twice.
func TestQ4_0KeptExactly(t *testing.T) {
	const rows, in = 6, 96
	rng := rand.New(rand.NewPCG(4, 0))
	raw := make([]byte, 0, rows*in/32*18)
	for range rows * in / 32 {
		d := kvcache.Float32ToFloat16(0.001 + 0.05*rng.Float32())
		raw = append(raw, byte(d), byte(d>>8))
		for j := range 16 {
			lo, hi := byte(rng.IntN(16)), byte(rng.IntN(16))
			if j == 3 {
				lo = 0 // a block's extreme has code 0 in every Q4_0 file
			}
			raw = append(raw, lo|hi<<4)
		}
	}
	w := make([]float32, rows*in)
	gguf.DequantizeQ4_0(w, raw)
	q := Quantization{Bits: 4, BlockSize: 32}
	got := dequantize(q, quantizeRows(q, in, []projection{{w: w, scale: 1}}), rows, in)
	for r := range rows {
		for k := range in {
			if got[r][k] != w[r*in+k] {
				t.Fatalf("row %d value %d: %v after int4, %v in the file", r, k, got[r][k], w[r*in+k])
			}
		}
	}
}
