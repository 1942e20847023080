#include "rows.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "simd.h"

static float max_generic(const float *x, long n) {
	float m = -INFINITY;
	for (long i = 0; i < n; i++) {
		if (x[i] != x[i]) return NAN;
		if (x[i] > m) m = x[i];
	}
	return m;
}

static long find_generic(const float *x, long n, float v) {
	for (long i = 0; i < n; i++) {
		if (x[i] == v) return i;
	}
	return -1;
}

static double exp_generic(const float *x, float *out, long n, float shift, float scale) {
	double sum = 0;
	for (long i = 0; i < n; i++) {
		float a = (x[i] - shift) * scale;
		float e = a != a ? 0.0f : cv_expf(a);
		if (out) out[i] = e;
		sum += e;
	}
	return sum;
}

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX2FN __attribute__((target("avx2,fma")))

AVX2FN static float max_avx2(const float *x, long n) {
	__m256 m = _mm256_set1_ps(-INFINITY);
	__m256 nan = _mm256_setzero_ps();
	long i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);
		nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
		m = _mm256_max_ps(m, v);
	}
	if (_mm256_movemask_ps(nan)) return NAN;
	float lanes[8];
	_mm256_storeu_ps(lanes, m);
	float best = -INFINITY;
	for (int j = 0; j < 8; j++) best = lanes[j] > best ? lanes[j] : best;
	float rest = max_generic(x + i, n - i);
	if (rest != rest) return NAN;
	return rest > best ? rest : best;
}

AVX2FN static long find_avx2(const float *x, long n, float v) {
	const __m256 vv = _mm256_set1_ps(v);
	long i = 0;
	for (; i + 8 <= n; i += 8) {
		int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vv, _CMP_EQ_OQ));
		if (m) return i + __builtin_ctz(m);
	}
	long r = find_generic(x + i, n - i, v);
	return r < 0 ? -1 : i + r;
}

typedef int32_t cv_row_vi8 __attribute__((vector_size(32)));

// cv_row_vexp8 is simd.h's vector exp on __m256.
CV_VEXP(cv_row_vexp8, __m256, cv_row_vi8, AVX2FN)

AVX2FN static double exp_avx2(const float *x, float *out, long n, float shift, float scale) {
	const __m256 vs = _mm256_set1_ps(shift), vk = _mm256_set1_ps(scale);
	double sum = 0;
	long i = 0;
	while (i + 8 <= n) {
		// Sum blocks of up to 1024 values in float lanes, then in double.
		__m256 acc = _mm256_setzero_ps();
		long end = i + 1024 < n ? i + 1024 : n;
		for (; i + 8 <= end; i += 8) {
			__m256 a = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs), vk);
			__m256 keep = _mm256_cmp_ps(a, a, _CMP_ORD_Q); // false for NaN, whose term is 0
			__m256 e = _mm256_and_ps(cv_row_vexp8(a), keep);
			if (out) _mm256_storeu_ps(out + i, e);
			acc = _mm256_add_ps(acc, e);
		}
		float lanes[8];
		_mm256_storeu_ps(lanes, acc);
		for (int j = 0; j < 8; j++) sum += lanes[j];
	}
	return sum + exp_generic(x + i, out ? out + i : NULL, n - i, shift, scale);
}

static int use_avx2(void) { return cv_cpu_has(CV_CPU_AVX2 | CV_CPU_FMA); }

float cv_row_max(const float *x, long n) { return use_avx2() ? max_avx2(x, n) : max_generic(x, n); }
long cv_row_find(const float *x, long n, float v) { return use_avx2() ? find_avx2(x, n, v) : find_generic(x, n, v); }
double cv_row_exp(const float *x, float *out, long n, float shift, float scale) {
	return use_avx2() ? exp_avx2(x, out, n, shift, scale) : exp_generic(x, out, n, shift, scale);
}
int cv_row_isa(void) { return use_avx2(); }
#else
float cv_row_max(const float *x, long n) { return max_generic(x, n); }
long cv_row_find(const float *x, long n, float v) { return find_generic(x, n, v); }
double cv_row_exp(const float *x, float *out, long n, float shift, float scale) { return exp_generic(x, out, n, shift, scale); }
int cv_row_isa(void) { return 0; }
#endif
