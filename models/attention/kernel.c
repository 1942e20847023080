#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// The kernel body is written once over GCC/Clang vector extensions and compiled per
// instruction set: kernel_impl.h is included with VW (lanes of a float vector), SFX
// (a name suffix) and KFN (the function attributes that select the instruction set).

// cv_half_to_float converts one IEEE half-precision value (portable path and tails).
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

// cv_first_key returns the first key position a query at qpos sees: 0, or the start of
// its sliding window.
static inline int cv_first_key(const cv_params *p, int qpos) {
	return p->window > 0 && qpos - p->window + 1 > 0 ? qpos - p->window + 1 : 0;
}

#define VW 4
#define SFX _generic
#define KFN
#include "kernel_impl.h"
#undef VW
#undef SFX
#undef KFN

#if defined(__x86_64__)
#define VW 8
#define SFX _avx2
#define KFN __attribute__((target("avx2,fma,f16c")))
#include "kernel_impl.h"
#undef VW
#undef SFX
#undef KFN

#define VW 16
#define SFX _avx512
#define KFN __attribute__((target("avx512f,avx2,fma,f16c")))
#include "kernel_impl.h"
#undef VW
#undef SFX
#undef KFN
#endif

int cv_isa(void) {
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
		return CV_ISA_AVX512;
	}
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
		return CV_ISA_AVX2;
	}
#endif
	return CV_ISA_GENERIC;
}

void cv_attend(int isa, const cv_params *p, const void *karena, const void *varena,
	const int32_t *tables, const int32_t *items, int lo, int hi,
	const float *qkv, float *att, float *scratch) {
	for (int i = lo; i < hi; i++) {
		const int32_t *it = items + (size_t)i * CV_ITEM_FIELDS;
		switch (isa) {
#if defined(__x86_64__)
		case CV_ISA_AVX512:
			attend_item_avx512(p, (const char *)karena, (const char *)varena, tables, it, qkv, att, scratch);
			break;
		case CV_ISA_AVX2:
			attend_item_avx2(p, (const char *)karena, (const char *)varena, tables, it, qkv, att, scratch);
			break;
#endif
		default:
			attend_item_generic(p, (const char *)karena, (const char *)varena, tables, it, qkv, att, scratch);
		}
	}
}
