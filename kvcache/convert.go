package kvcache

import (
	"encoding/binary"
	"math"
)

// Float32ToFloat16 converts f to IEEE 754 binary16 bits, rounding to nearest, ties to even.
// Values too large become ±Inf; NaN stays NaN.
func Float32ToFloat16(f float32) uint16 {
	x := math.Float32bits(f)
	sign := uint16(x>>16) & 0x8000
	exp := int32(x>>23) & 0xff
	man := x & 0x7fffff
	switch {
	case exp == 0xff: // Inf or NaN
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	case exp > 127+15: // overflow
		return sign | 0x7c00
	case exp >= 127-14: // normal half
		h := uint32(exp-127+15)<<10 | man>>13
		rest := man & 0x1fff
		if rest > 0x1000 || (rest == 0x1000 && h&1 == 1) {
			h++ // may carry into the exponent, up to Inf: correct
		}
		return sign | uint16(h)
	case exp >= 127-25: // subnormal half (or rounds up to the smallest normal)
		man |= 0x800000
		shift := uint32(126 - 14 - exp + 13 + 1) // bits dropped from the 24-bit significand
		h := man >> shift
		rest := man & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rest > half || (rest == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	return sign // underflow to ±0
}

// Float16ToFloat32 converts IEEE 754 binary16 bits to float32 exactly.
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: normalize.
	e := uint32(127 - 15 + 1)
	for man&0x400 == 0 {
		man <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
}

// Encode writes src into dst as little-endian elements of type dt and returns the number of
// elements written: min(len(src), len(dst)/dt.Size()), or 0 for an unknown dt.
func Encode(dt DType, dst []byte, src []float32) int {
	switch dt {
	case Float32:
		n := min(len(src), len(dst)/4)
		for i, f := range src[:n] {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
		}
		return n
	case Float16:
		n := min(len(src), len(dst)/2)
		for i, f := range src[:n] {
			binary.LittleEndian.PutUint16(dst[2*i:], Float32ToFloat16(f))
		}
		return n
	}
	return 0
}

// Decode reads little-endian elements of type dt from src into dst and returns the number of
// elements read: min(len(dst), len(src)/dt.Size()), or 0 for an unknown dt.
func Decode(dt DType, dst []float32, src []byte) int {
	switch dt {
	case Float32:
		n := min(len(dst), len(src)/4)
		for i := range dst[:n] {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
		return n
	case Float16:
		n := min(len(dst), len(src)/2)
		for i := range dst[:n] {
			dst[i] = Float16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
		return n
	}
	return 0
}
