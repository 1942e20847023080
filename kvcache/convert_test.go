package kvcache

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refHalf decodes binary16 bits with math.Ldexp, independently of Float16ToFloat32.
func refHalf(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	man := float64(h & 0x3ff)
	switch exp {
	case 0x1f:
		if man != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	case 0:
		return sign * math.Ldexp(man, -24)
	}
	return sign * math.Ldexp(1024+man, exp-25)
}

func TestFloat16ToFloat32AllValues(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		got, want := float64(Float16ToFloat32(h)), refHalf(h)
		if math.IsNaN(want) {
			if !math.IsNaN(got) {
				t.Fatalf("%#04x: got %v, want NaN", h, got)
			}
			continue
		}
		if got != want || math.Signbit(got) != math.Signbit(want) {
			t.Fatalf("%#04x: got %v, want %v", h, got, want)
		}
		// Every half value survives the trip through float32.
		if back := Float32ToFloat16(float32(got)); back != h {
			t.Fatalf("%#04x -> %v -> %#04x", h, got, back)
		}
	}
}

// TestFloat32ToFloat16Rounding checks round-to-nearest-even against a brute-force search
// over the neighbouring half values.
func TestFloat32ToFloat16Rounding(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cases := []float32{0, -0.0, 1, -1, 65504, 65519.99, 65520, 1e-8, 2.9802322e-8, 2.9802326e-8, 5.9604645e-8,
		6.1035156e-5, 6.1035156e-5 * 0.999, 1.0009765625, 1.00048828125, 1.00146484375, float32(math.Inf(-1))}
	for range 200000 {
		// Spread over the half range, including subnormals and overflow.
		e := r.IntN(50) - 30
		cases = append(cases, float32(math.Ldexp(r.Float64()*2-1, e)))
	}
	for _, f := range cases {
		h := Float32ToFloat16(f)
		if math.Abs(float64(f)) >= 65520 {
			if h&0x7fff != 0x7c00 {
				t.Fatalf("%v: got %#04x, want Inf", f, h)
			}
			continue
		}
		got := refHalf(h)
		err := math.Abs(got - float64(f))
		// No half value is strictly closer; on a tie the chosen one is even.
		for _, nb := range []uint16{h - 1, h + 1, h ^ 0x8000} {
			if nb&0x7c00 == 0x7c00 {
				continue
			}
			v := refHalf(nb)
			d := math.Abs(v - float64(f))
			if d < err || (d == err && h&1 == 1 && v != got) {
				t.Fatalf("%v: got %#04x (%v), but %#04x (%v) is closer or even", f, h, got, nb, v)
			}
		}
	}
	if h := Float32ToFloat16(float32(math.NaN())); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
		t.Errorf("NaN -> %#04x", h)
	}
}

func TestEncodeDecode(t *testing.T) {
	src := []float32{0, 1.5, -2.25, 65504, 1.0 / 3}
	for _, dt := range []DType{Float32, Float16} {
		buf := make([]byte, len(src)*dt.Size())
		if n := Encode(dt, buf, src); n != len(src) {
			t.Fatalf("%v: encoded %d", dt, n)
		}
		out := make([]float32, len(src))
		if n := Decode(dt, out, buf); n != len(src) {
			t.Fatalf("%v: decoded %d", dt, n)
		}
		for i := range src {
			want := src[i]
			if dt == Float16 {
				want = Float16ToFloat32(Float32ToFloat16(want))
			}
			if out[i] != want {
				t.Errorf("%v[%d] = %v, want %v", dt, i, out[i], want)
			}
		}
		// Short buffers convert what fits.
		if n := Encode(dt, buf[:dt.Size()*2+1], src); n != 2 {
			t.Errorf("%v: short encode wrote %d", dt, n)
		}
	}
	if Encode(DType(9), make([]byte, 8), src) != 0 || Decode(DType(9), make([]float32, 2), make([]byte, 8)) != 0 {
		t.Error("unknown dtype converted")
	}
	// Little-endian float32 layout.
	b := make([]byte, 4)
	Encode(Float32, b, []float32{1})
	if b[0] != 0 || b[1] != 0 || b[2] != 0x80 || b[3] != 0x3f {
		t.Errorf("1.0 encoded as % x", b)
	}
}
