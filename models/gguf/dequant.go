package gguf

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// The block decoders below follow ggml's dequantize_row_* (ggml-quants.c) operation for
// operation, so their results equal ggml's to the bit: each scale is converted from fp16
// exactly, and each value is computed in float32 with one rounding per operation, in ggml's
// order. Where ggml computes a*b + c, the product is converted to float32 before the add,
// which keeps the Go compiler from fusing the two into one multiply-add on the platforms
// where it may (arm64, ppc64, s390x) and round differently from the reference.
//
// Each DequantizeX decodes len(src)/BlockBytes whole blocks into dst and panics when src is
// not a whole number of blocks or dst does not hold exactly their values: the lengths are
// the caller's contract, as with copy. Dequantize checks them and returns an error instead.

// decoder decodes whole blocks of one type.
type decoder func(dst []float32, src []byte)

// decoderFor returns the decoder of t, or nil when the package does not decode it.
func decoderFor(t GGMLType) decoder {
	switch t {
	case TypeF32:
		return DequantizeF32
	case TypeF16:
		return DequantizeF16
	case TypeBF16:
		return DequantizeBF16
	case TypeQ4_0:
		return DequantizeQ4_0
	case TypeQ4_1:
		return DequantizeQ4_1
	case TypeQ5_0:
		return DequantizeQ5_0
	case TypeQ5_1:
		return DequantizeQ5_1
	case TypeQ8_0:
		return DequantizeQ8_0
	case TypeQ4_K:
		return DequantizeQ4_K
	case TypeQ5_K:
		return DequantizeQ5_K
	case TypeQ6_K:
		return DequantizeQ6_K
	}
	return nil
}

// Dequantize decodes src, whole blocks of type t, into dst, which must hold exactly their
// values. It returns an error for a type the package does not decode or mismatched lengths.
func Dequantize(t GGMLType, dst []float32, src []byte) error {
	dec := decoderFor(t)
	if dec == nil {
		return unsupportedf("type %s is not supported (supported: %s)", t, supportedNames)
	}
	bv, bb := t.BlockValues(), t.BlockBytes()
	if int64(len(src))%bb != 0 {
		return fmt.Errorf("gguf: %d bytes are not a whole number of %s blocks of %d bytes", len(src), t, bb)
	}
	if want := int64(len(src)) / bb * bv; int64(len(dst)) != want {
		return fmt.Errorf("gguf: %d bytes of %s hold %d values, but dst has room for %d", len(src), t, want, len(dst))
	}
	dec(dst, src)
	return nil
}

// blocks returns the number of blocks in src and panics unless src is whole blocks of t and
// dst holds exactly their values.
func blocks(t GGMLType, dst []float32, src []byte) int {
	bb, bv := int(t.BlockBytes()), int(t.BlockValues())
	n := len(src) / bb
	if len(src)%bb != 0 || len(dst) != n*bv {
		panic(fmt.Sprintf("gguf: Dequantize%s: %d bytes (blocks of %d) into %d values (blocks of %d)", t, len(src), bb, len(dst), bv))
	}
	return n
}

// half reads the little-endian fp16 at b[0:2] as float32.
func half(b []byte) float32 {
	return kvcache.Float16ToFloat32(binary.LittleEndian.Uint16(b))
}

// DequantizeF32 copies little-endian float32 values (4 bytes each) to dst.
func DequantizeF32(dst []float32, src []byte) {
	n := blocks(TypeF32, dst, src)
	for i := range n {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// DequantizeF16 converts little-endian IEEE binary16 values (2 bytes each) to float32.
func DequantizeF16(dst []float32, src []byte) {
	n := blocks(TypeF16, dst, src)
	for i := range n {
		dst[i] = half(src[2*i:])
	}
}

// DequantizeBF16 converts little-endian bfloat16 values (2 bytes each: the high half of a
// float32) to float32.
func DequantizeBF16(dst []float32, src []byte) {
	n := blocks(TypeBF16, dst, src)
	for i := range n {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

// DequantizeQ4_0 decodes Q4_0 blocks: 18 bytes for 32 values, an fp16 scale d and 16 bytes
// of 4-bit quants q (value j in the low nibble of byte j, value j+16 in its high nibble);
// each value is (q-8)*d.
func DequantizeQ4_0(dst []float32, src []byte) {
	n := blocks(TypeQ4_0, dst, src)
	for i := range n {
		b := src[i*18 : i*18+18]
		y := dst[i*32 : i*32+32]
		d := half(b)
		qs := b[2:18]
		for j := range 16 {
			y[j] = float32(int(qs[j]&0x0F)-8) * d
			y[j+16] = float32(int(qs[j]>>4)-8) * d
		}
	}
}

// DequantizeQ4_1 decodes Q4_1 blocks: 20 bytes for 32 values, an fp16 scale d, an fp16
// minimum m and 16 bytes of 4-bit quants q laid out as in Q4_0; each value is q*d + m.
func DequantizeQ4_1(dst []float32, src []byte) {
	n := blocks(TypeQ4_1, dst, src)
	for i := range n {
		b := src[i*20 : i*20+20]
		y := dst[i*32 : i*32+32]
		d, m := half(b), half(b[2:])
		qs := b[4:20]
		for j := range 16 {
			y[j] = float32(float32(qs[j]&0x0F)*d) + m
			y[j+16] = float32(float32(qs[j]>>4)*d) + m
		}
	}
}

// DequantizeQ5_0 decodes Q5_0 blocks: 22 bytes for 32 values, an fp16 scale d, a 32-bit
// little-endian word of high bits (bit j is the fifth bit of value j) and 16 bytes of low
// nibbles laid out as in Q4_0; each value is (q-16)*d.
func DequantizeQ5_0(dst []float32, src []byte) {
	n := blocks(TypeQ5_0, dst, src)
	for i := range n {
		b := src[i*22 : i*22+22]
		y := dst[i*32 : i*32+32]
		d := half(b)
		qh := binary.LittleEndian.Uint32(b[2:])
		qs := b[6:22]
		for j := range 16 {
			h0 := byte(qh>>j<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			y[j] = float32(int(qs[j]&0x0F|h0)-16) * d
			y[j+16] = float32(int(qs[j]>>4|h1)-16) * d
		}
	}
}

// DequantizeQ5_1 decodes Q5_1 blocks: 24 bytes for 32 values, an fp16 scale d, an fp16
// minimum m, the high-bit word and the low nibbles of Q5_0; each value is q*d + m.
func DequantizeQ5_1(dst []float32, src []byte) {
	n := blocks(TypeQ5_1, dst, src)
	for i := range n {
		b := src[i*24 : i*24+24]
		y := dst[i*32 : i*32+32]
		d, m := half(b), half(b[2:])
		qh := binary.LittleEndian.Uint32(b[4:])
		qs := b[8:24]
		for j := range 16 {
			h0 := byte(qh>>j<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			y[j] = float32(float32(qs[j]&0x0F|h0)*d) + m
			y[j+16] = float32(float32(qs[j]>>4|h1)*d) + m
		}
	}
}

// DequantizeQ8_0 decodes Q8_0 blocks: 34 bytes for 32 values, an fp16 scale d and 32 signed
// bytes q; each value is q*d.
func DequantizeQ8_0(dst []float32, src []byte) {
	n := blocks(TypeQ8_0, dst, src)
	for i := range n {
		b := src[i*34 : i*34+34]
		y := dst[i*32 : i*32+32]
		d := half(b)
		for j := range 32 {
			y[j] = float32(int8(b[2+j])) * d
		}
	}
}

// scaleMinK4 returns the 6-bit scale and minimum of sub-block j (0-7) from the 12 packed
// bytes of a Q4_K or Q5_K block (ggml's get_scale_min_k4): sub-blocks 0-3 keep theirs in the
// low six bits of bytes j and j+4; sub-blocks 4-7 keep the low four bits in byte j+4 and the
// high two in the top bits of bytes j-4 and j.
func scaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0x0F | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// DequantizeQ4_K decodes Q4_K super-blocks: 144 bytes for 256 values, an fp16 scale d, an
// fp16 minimum scale dmin, 12 bytes of eight 6-bit scales and minimums (scaleMinK4) and 128
// bytes of 4-bit quants. The values are eight sub-blocks of 32; each 64-value chunk takes 32
// bytes, its first sub-block from their low nibbles and its second from their high nibbles.
// A value of sub-block s is (d*sc[s])*q - dmin*m[s].
func DequantizeQ4_K(dst []float32, src []byte) {
	n := blocks(TypeQ4_K, dst, src)
	for i := range n {
		b := src[i*144 : i*144+144]
		y := dst[i*256 : i*256+256]
		d, dmin := half(b), half(b[2:])
		scales := b[4:16]
		q := b[16:144]
		for c := range 4 {
			sc1, m1 := scaleMinK4(2*c, scales)
			sc2, m2 := scaleMinK4(2*c+1, scales)
			d1, min1 := d*float32(sc1), dmin*float32(m1)
			d2, min2 := d*float32(sc2), dmin*float32(m2)
			qc := q[32*c : 32*c+32]
			yc := y[64*c : 64*c+64]
			for l := range 32 {
				yc[l] = float32(d1*float32(qc[l]&0x0F)) - min1
				yc[l+32] = float32(d2*float32(qc[l]>>4)) - min2
			}
		}
	}
}

// DequantizeQ5_K decodes Q5_K super-blocks: 176 bytes for 256 values, laid out as Q4_K with
// 32 bytes of high bits between the scales and the low nibbles. In chunk c of 64 values, bit
// 2c of high byte l is the fifth bit of value l of the first sub-block and bit 2c+1 that of
// the second. A value of sub-block s is (d*sc[s])*q - dmin*m[s].
func DequantizeQ5_K(dst []float32, src []byte) {
	n := blocks(TypeQ5_K, dst, src)
	for i := range n {
		b := src[i*176 : i*176+176]
		y := dst[i*256 : i*256+256]
		d, dmin := half(b), half(b[2:])
		scales := b[4:16]
		qh := b[16:48]
		ql := b[48:176]
		for c := range 4 {
			sc1, m1 := scaleMinK4(2*c, scales)
			sc2, m2 := scaleMinK4(2*c+1, scales)
			d1, min1 := d*float32(sc1), dmin*float32(m1)
			d2, min2 := d*float32(sc2), dmin*float32(m2)
			u1, u2 := byte(1)<<(2*c), byte(2)<<(2*c)
			qc := ql[32*c : 32*c+32]
			yc := y[64*c : 64*c+64]
			for l := range 32 {
				lo, hi := qc[l]&0x0F, qc[l]>>4
				if qh[l]&u1 != 0 {
					lo += 16
				}
				if qh[l]&u2 != 0 {
					hi += 16
				}
				yc[l] = float32(d1*float32(lo)) - min1
				yc[l+32] = float32(d2*float32(hi)) - min2
			}
		}
	}
}

// DequantizeQ6_K decodes Q6_K super-blocks: 210 bytes for 256 values, 128 bytes of low
// nibbles ql, 64 bytes of high bit pairs qh, sixteen signed 8-bit scales (one per 16 values)
// and an fp16 scale d. Each half of 128 values takes 64 bytes of ql and 32 of qh: value l of
// its four 32-value quarters takes the low nibble of ql[l], the low nibble of ql[l+32], the
// high nibble of ql[l] and the high nibble of ql[l+32], with bits 0-1, 2-3, 4-5 and 6-7 of
// qh[l] above them. A value is (d*scale)*(q-32).
func DequantizeQ6_K(dst []float32, src []byte) {
	n := blocks(TypeQ6_K, dst, src)
	for i := range n {
		b := src[i*210 : i*210+210]
		y := dst[i*256 : i*256+256]
		d := half(b[208:])
		for h := range 2 {
			ql := b[64*h : 64*h+64]
			qh := b[128+32*h : 128+32*h+32]
			sc := b[192+8*h : 192+8*h+8]
			yh := y[128*h : 128*h+128]
			for l := range 32 {
				is := l / 16
				q1 := int(ql[l]&0x0F|(qh[l]>>0&3)<<4) - 32
				q2 := int(ql[l+32]&0x0F|(qh[l]>>2&3)<<4) - 32
				q3 := int(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
				q4 := int(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
				yh[l] = d * float32(int8(sc[is])) * float32(q1)
				yh[l+32] = d * float32(int8(sc[is+2])) * float32(q2)
				yh[l+64] = d * float32(int8(sc[is+4])) * float32(q3)
				yh[l+96] = d * float32(int8(sc[is+6])) * float32(q4)
			}
		}
	}
}
