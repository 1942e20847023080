package gguf

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// fixture is one tensor of testdata/ggml.gguf and its testdata/dequant files, as
// testdata/gen_fixtures.c writes them with ggml.
type fixture struct {
	name string
	typ  GGMLType
	dims []int64
}

var fixtures = []fixture{
	{"f32", TypeF32, []int64{8, 4, 3}},
	{"f16", TypeF16, []int64{16, 6}},
	{"bf16", TypeBF16, []int64{96}},
	{"q4_0", TypeQ4_0, []int64{64, 4}},
	{"q4_1", TypeQ4_1, []int64{64, 4}},
	{"q5_0", TypeQ5_0, []int64{64, 4}},
	{"q5_1", TypeQ5_1, []int64{64, 4}},
	{"q8_0", TypeQ8_0, []int64{64, 4}},
	{"q4_k", TypeQ4_K, []int64{512, 2}},
	{"q5_k", TypeQ5_K, []int64{512, 2}},
	{"q6_k", TypeQ6_K, []int64{256, 4}},
}

// loadFixture returns the stored blocks of a fixture and the float32 values ggml decodes
// from them.
func loadFixture(t *testing.T, name string) (raw []byte, want []float32) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "dequant", name+".raw"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join("testdata", "dequant", name+".f32"))
	if err != nil {
		t.Fatal(err)
	}
	want = make([]float32, len(b)/4)
	for i := range want {
		want[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return raw, want
}

// sameBits reports the first value of got that differs from want in any bit.
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: value %d is %g (0x%08x), ggml gives %g (0x%08x)",
				what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// TestDequantizeMatchesGGML decodes blocks quantized by ggml and blocks of random bytes and
// compares every value, bit for bit, with what ggml's dequantize_row_* gives.
func TestDequantizeMatchesGGML(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.name, func(t *testing.T) {
			raw, want := loadFixture(t, fx.name)
			n := int64(1)
			for _, d := range fx.dims {
				n *= d
			}
			if int64(len(want)) != n || int64(len(raw)) != n/fx.typ.BlockValues()*fx.typ.BlockBytes() {
				t.Fatalf("fixture holds %d bytes and %d values, want %d values", len(raw), len(want), n)
			}
			got := make([]float32, len(want))
			decoderFor(fx.typ)(got, raw)
			sameBits(t, fx.name, got, want)

			// The checked entry point gives the same values.
			clear(got)
			if err := Dequantize(fx.typ, got, raw); err != nil {
				t.Fatal(err)
			}
			sameBits(t, fx.name+" via Dequantize", got, want)
		})
	}
}

// TestDequantizeByHand checks one block per layout against values derived from the format
// by hand, so a fixture and a decoder that were wrong together would still be caught.
func TestDequantizeByHand(t *testing.T) {
	const half = 0x3800 // fp16 0.5
	t.Run("Q8_0", func(t *testing.T) {
		// d = 0.5, q_j = j-16 as int8: x_j = (j-16)/2.
		b := (&enc{}).u16(half)
		for j := range 32 {
			b.u8(uint8(int8(j - 16)))
		}
		got := make([]float32, 32)
		DequantizeQ8_0(got, b.b)
		for j := range 32 {
			if want := float32(j-16) / 2; got[j] != want {
				t.Fatalf("x[%d] = %g, want %g", j, got[j], want)
			}
		}
	})
	t.Run("Q4_0", func(t *testing.T) {
		// d = 0.5; byte j = 0x(15-j)(j): x_j = (j-8)/2 and x_{j+16} = (15-j-8)/2.
		b := (&enc{}).u16(half)
		for j := range 16 {
			b.u8(uint8(j) | uint8(15-j)<<4)
		}
		got := make([]float32, 32)
		DequantizeQ4_0(got, b.b)
		for j := range 16 {
			if got[j] != float32(j-8)/2 || got[j+16] != float32(7-j)/2 {
				t.Fatalf("x[%d], x[%d] = %g, %g, want %g, %g", j, j+16, got[j], got[j+16], float32(j-8)/2, float32(7-j)/2)
			}
		}
	})
	t.Run("Q5_1", func(t *testing.T) {
		// d = 0.5, m = -1; high bits set for values 0 and 31 only; all nibbles 1:
		// x_0 = x_31 = 17*0.5-1 = 7.5, every other x = 1*0.5-1 = -0.5.
		b := (&enc{}).u16(half).u16(0xBC00).u32(1 | 1<<31)
		for range 16 {
			b.u8(0x11)
		}
		got := make([]float32, 32)
		DequantizeQ5_1(got, b.b)
		for j, x := range got {
			want := float32(-0.5)
			if j == 0 || j == 31 {
				want = 7.5
			}
			if x != want {
				t.Fatalf("x[%d] = %g, want %g", j, x, want)
			}
		}
	})
	t.Run("Q4_K", func(t *testing.T) {
		// d = 0.5, dmin = 1. Sub-block 0: scale 2, min 3 (bytes 0 and 4). Sub-block 5:
		// scale 0x1F (low four bits 0xF in byte 9, high two bits 01 in byte 1's top bits),
		// min 0x20 (low bits 0 in byte 9's high nibble, high bits 10 in byte 5's top bits).
		// All quants 0x21: sub-block 0 (low nibbles of bytes 0-31) has q = 1, sub-block 5
		// (high nibbles of bytes 64-95) has q = 2.
		b := (&enc{}).u16(half).u16(0x3C00)
		scales := make([]byte, 12)
		scales[0], scales[4] = 2, 3
		scales[1] |= 0x1 << 6
		scales[5] |= 0x2 << 6
		scales[9] = 0x0F
		b.raw(scales)
		for range 128 {
			b.u8(0x21)
		}
		got := make([]float32, 256)
		DequantizeQ4_K(got, b.b)
		if want := float32(0.5*2*1 - 3); got[0] != want || got[31] != want {
			t.Fatalf("sub-block 0: %g, %g, want %g", got[0], got[31], want)
		}
		if want := float32(0.5*31*2 - 32); got[5*32] != want || got[6*32-1] != want {
			t.Fatalf("sub-block 5: %g, %g, want %g", got[5*32], got[6*32-1], want)
		}
	})
	t.Run("Q6_K", func(t *testing.T) {
		// d = 0.5, scale of group 0 is -2, of group 15 is 3; all low nibbles 5, all high
		// pairs 2 (qh = 0xAA): q = 5 | 2<<4 = 37, q-32 = 5. Group 0: 0.5*-2*5 = -5;
		// group 15 (the last 16 values): 0.5*3*5 = 7.5.
		b := &enc{}
		for range 128 {
			b.u8(0x55)
		}
		for range 64 {
			b.u8(0xAA)
		}
		sc := make([]byte, 16)
		sc[0], sc[15] = 0xFE, 3
		b.raw(sc).u16(half)
		got := make([]float32, 256)
		DequantizeQ6_K(got, b.b)
		if got[0] != -5 || got[15] != -5 || got[240] != 7.5 || got[255] != 7.5 {
			t.Fatalf("got %g %g %g %g, want -5 -5 7.5 7.5", got[0], got[15], got[240], got[255])
		}
	})
}

// TestHalfToFloat32 checks the fp16 conversion at the edges of the format.
func TestHalfToFloat32(t *testing.T) {
	for _, c := range []struct {
		h    uint16
		want float32
	}{
		{0x0000, 0},
		{0x3C00, 1},
		{0xC000, -2},
		{0x3555, 0.333251953125},
		{0x0001, 1.0 / (1 << 24)}, // smallest subnormal
		{0x03FF, 1023.0 / (1 << 24)},
		{0x0400, 1.0 / (1 << 14)}, // smallest normal
		{0x7BFF, 65504},
		{0x7C00, float32(math.Inf(1))},
		{0xFC00, float32(math.Inf(-1))},
	} {
		if got := kvcache.Float16ToFloat32(c.h); got != c.want {
			t.Errorf("kvcache.Float16ToFloat32(0x%04x) = %g, want %g", c.h, got, c.want)
		}
	}
	if got := kvcache.Float16ToFloat32(0x8000); got != 0 || !math.Signbit(float64(got)) {
		t.Errorf("kvcache.Float16ToFloat32(0x8000) = %g, want -0", got)
	}
	if got := kvcache.Float16ToFloat32(0x7E01); !math.IsNaN(float64(got)) {
		t.Errorf("kvcache.Float16ToFloat32(0x7E01) = %g, want NaN", got)
	}
}

// TestDequantizeLengths checks that mismatched lengths are an error from Dequantize and a
// panic from the block decoders, and that undecodable types are refused by name.
func TestDequantizeLengths(t *testing.T) {
	if err := Dequantize(TypeQ8_0, make([]float32, 32), make([]byte, 33)); err == nil || !strings.Contains(err.Error(), "whole number") {
		t.Errorf("33 bytes of Q8_0: err = %v", err)
	}
	if err := Dequantize(TypeQ8_0, make([]float32, 31), make([]byte, 34)); err == nil || !strings.Contains(err.Error(), "room for 31") {
		t.Errorf("one Q8_0 block into 31 values: err = %v", err)
	}
	err := Dequantize(TypeIQ2_XXS, make([]float32, 256), make([]byte, 66))
	if err == nil || !strings.Contains(err.Error(), "type IQ2_XXS is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)") {
		t.Errorf("IQ2_XXS: err = %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("DequantizeQ4_K of a partial block did not panic")
		}
	}()
	DequantizeQ4_K(make([]float32, 256), make([]byte, 143))
}

// TestTypeLayouts checks the block sizes the package documents for the decoded types.
func TestTypeLayouts(t *testing.T) {
	for _, c := range []struct {
		t             GGMLType
		values, bytes int64
	}{
		{TypeQ8_0, 32, 34}, {TypeQ4_0, 32, 18}, {TypeQ4_1, 32, 20}, {TypeQ5_0, 32, 22},
		{TypeQ5_1, 32, 24}, {TypeQ4_K, 256, 144}, {TypeQ5_K, 256, 176}, {TypeQ6_K, 256, 210},
		{TypeF16, 1, 2}, {TypeBF16, 1, 2}, {TypeF32, 1, 4}, {TypeIQ2_XXS, 256, 66},
	} {
		if c.t.BlockValues() != c.values || c.t.BlockBytes() != c.bytes {
			t.Errorf("%s: %d bytes per %d values, want %d per %d", c.t, c.t.BlockBytes(), c.t.BlockValues(), c.bytes, c.values)
		}
	}
	if s := GGMLType(200).String(); s != "type(200)" {
		t.Errorf("GGMLType(200) = %q", s)
	}
	if TypeQ2_K.Supported() || !TypeQ6_K.Supported() {
		t.Error("Supported: Q2_K must be refused and Q6_K decoded")
	}
}
