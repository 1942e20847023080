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
#define KFN __attribute__((target("avx2,fma")))
#include "kernel_impl.h"
#undef VW
#undef SFX
#undef KFN

#define VW 16
#define SFX _avx512
#define KFN __attribute__((target("avx512f,avx2,fma")))
#include "kernel_impl.h"
#undef VW
#undef SFX
#undef KFN
#endif

int cv_isa(void) {
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f")) {
		return CV_ISA_AVX512;
	}
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
		return CV_ISA_AVX2;
	}
#endif
	return CV_ISA_GENERIC;
}

void cv_attend(int isa, const cv_params *p, const float *karena, const float *varena,
	const int32_t *tables, const int32_t *items, int lo, int hi,
	const float *qkv, float *att, float *scratch) {
	for (int i = lo; i < hi; i++) {
		const int32_t *it = items + (size_t)i * CV_ITEM_FIELDS;
		switch (isa) {
#if defined(__x86_64__)
		case CV_ISA_AVX512:
			attend_item_avx512(p, karena, varena, tables, it, qkv, att, scratch);
			break;
		case CV_ISA_AVX2:
			attend_item_avx2(p, karena, varena, tables, it, qkv, att, scratch);
			break;
#endif
		default:
			attend_item_generic(p, karena, varena, tables, it, qkv, att, scratch);
		}
	}
}
