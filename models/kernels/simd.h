// The SIMD helpers every kernel of this package shares: the CPU's features, detected
// once; per-thread scratch; IEEE half <-> float32 conversion; and the one vector exp, for
// any lane width.
// The kernels include it; a change here rebuilds the package as a change to any of its
// .h files does.
#ifndef CV_SIMD_H
#define CV_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

// ---------------------------------------------------------------- CPU features

// CPU features, as a bitmask. Each bit means the CPU has the instructions and the OS
// saves their registers (XCR0), so a function compiled for them may run.
enum {
	CV_CPU_AVX2 = 1u << 0,
	CV_CPU_FMA = 1u << 1,
	CV_CPU_F16C = 1u << 2,
	CV_CPU_AVX512F = 1u << 3,
	CV_CPU_AVX512BW = 1u << 4,
	CV_CPU_AVX512VNNI = 1u << 5,
	// AMX-TILE and AMX-INT8 with the tile state enabled (XCR0 bits 17 and 18). On Linux a
	// process must still ask for the tile data before it uses them (int8gemm_amx.h).
	CV_CPU_AMX = 1u << 6,
};

// cv_cpu_features returns the CPU's features (CV_CPU_* bits), detected at the first call
// of the process and cached (simd.c); 0 off x86-64.
unsigned cv_cpu_features(void);

// ---------------------------------------------------------------- scratch

// Scratch slots: one per kernel, so that no kernel's buffer is another's.
enum { CV_SCRATCH_INT8 = 0, CV_SCRATCH_PAGED = 1, CV_SCRATCH_SLOTS = 2 };

// cv_scratch returns the calling thread's scratch of slot, at least bytes long and
// aligned to 64 bytes, or NULL when out of memory. It is kept between calls (so a kernel
// called often allocates once per thread) and freed when the thread exits; its contents
// are valid until the thread's next call for the same slot.
void *cv_scratch(int slot, size_t bytes);

// cv_cpu_has reports whether the CPU has every feature of want.
static inline int cv_cpu_has(unsigned want) { return (cv_cpu_features() & want) == want; }

// ---------------------------------------------------------------- half floats

// cv_half_to_float converts one IEEE half-precision value (subnormals, infinities and
// NaNs included), exactly.
static inline float cv_half_to_float(uint16_t h) {
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
	if (exp == 0) {
		if (man == 0) {
			bits = sign;
		} else { // subnormal: normalise
			exp = 127 - 15 + 1;
			while ((man & 0x400) == 0) {
				man <<= 1;
				exp--;
			}
			bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
		}
	} else if (exp == 31) {
		bits = sign | 0x7f800000 | (man << 13);
	} else {
		bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
	}
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

// cv_float_to_half rounds f to the nearest IEEE half-precision value, ties to even:
// above the largest half it gives infinity, below the smallest subnormal zero.
static inline uint16_t cv_float_to_half(float f) {
	uint32_t x;
	memcpy(&x, &f, 4);
	const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
	const uint32_t ax = x & 0x7fffffff;
	if (ax >= 0x7f800000) { // infinity or NaN (kept quiet)
		return sign | 0x7c00 | (ax > 0x7f800000 ? 0x200 | ((ax >> 13) & 0x3ff) : 0);
	}
	if (ax >= 0x477ff000) { // rounds above 65504
		return sign | 0x7c00;
	}
	if (ax < 0x38800000) { // below the smallest normal half: a subnormal or zero
		if (ax < 0x33000000) {
			return sign;
		}
		const uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000, shift = 126 - e; // 14..24
		uint32_t h = m >> shift;
		const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
		if (rem > halfway || (rem == halfway && (h & 1))) {
			h++;
		}
		return sign | (uint16_t)h;
	}
	uint32_t h = ((ax >> 13) - ((127 - 15) << 10));
	const uint32_t rem = ax & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) {
		h++;
	}
	return sign | (uint16_t)h;
}

// ---------------------------------------------------------------- exp

// The exp rule, for the vector exp and its scalar twin alike: arguments below
// CV_EXP_MIN (-Inf included) give exactly 0, arguments above CV_EXP_MAX give
// e^CV_EXP_MAX, and NaN gives NaN. Every other result is a normal float: e^-87 ≈ 1.6e-38
// is above FLT_MIN (e^-87.34) and e^88 ≈ 1.7e38 below FLT_MAX (e^88.72), so no lane is
// ever subnormal or infinite.
#define CV_EXP_MIN (-87.0f)
#define CV_EXP_MAX 88.0f

// cv_expf is e^x by the exp rule, through libm: the scalar tails of the vector loops.
static inline float cv_expf(float x) {
	if (x < CV_EXP_MIN) {
		return 0.0f;
	}
	return expf(x > CV_EXP_MAX ? CV_EXP_MAX : x);
}

// CV_VEXP(NAME, VF, VI, ATTR) defines ATTR static inline VF NAME(VF x): e^x in every lane
// by the exp rule. VF is a GCC vector of float (vector_size(4·lanes): __m256 and __m512
// are such vectors), VI the vector of as many int32; ATTR holds the function attributes
// that select the instruction set (target(...), or nothing), so each kernel defines the
// function once per instruction set it is compiled for. x = n·ln2 + r with |r| <= ln2/2;
// e^r by Cephes' expf polynomial (degree 6 with the leading 1 + r, relative error about
// 1e-7); times 2^n built in the exponent bits.
#define CV_VEXP(NAME, VF, VI, ATTR) \
	ATTR static inline VF NAME(VF x) { \
		const VF zero = (VF){0}, one = zero + 1.0f, lo = zero + CV_EXP_MIN, hi = zero + CV_EXP_MAX; \
		const VI under = x < lo, over = x > hi; \
		x = (VF)(((VI)hi & over) | ((VI)x & ~over)); \
		x = (VF)((VI)x & ~under); \
		const VF fx = x * (zero + 1.44269504088896341f) + (zero + 0.5f); \
		VI n = __builtin_convertvector(fx, VI); \
		n = n + (VI)(__builtin_convertvector(n, VF) > fx); /* truncation -> floor (a true lane is -1) */ \
		const VF nf = __builtin_convertvector(n, VF); \
		const VF r = x - nf * (zero + 0.693359375f) - nf * (zero + -2.12194440e-4f); \
		VF y = zero + 1.9875691500e-4f; \
		y = y * r + (zero + 1.3981999507e-3f); \
		y = y * r + (zero + 8.3334519073e-3f); \
		y = y * r + (zero + 4.1665795894e-2f); \
		y = y * r + (zero + 1.6666665459e-1f); \
		y = y * r + (zero + 5.0000001201e-1f); \
		y = y * r * r + r + one; \
		return (VF)((VI)(y * (VF)((n + 127) << 23)) & ~under); \
	}

#endif
