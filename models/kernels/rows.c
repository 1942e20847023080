#include "rows.h"

#include <math.h>
#include <stddef.h>

#define EXP_LOW (-87.0f)

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
		float e = a < EXP_LOW || a != a ? 0.0f : expf(a);
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

// exp8 is exp on 8 lanes for arguments in [-87, 0.5]: 2^n * p(r) with r in
// [-ln2/2, ln2/2] and Cephes' degree-5 polynomial (relative error ~1e-7).
AVX2FN static inline __m256 exp8(__m256 a) {
	const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
	const __m256 ln2hi = _mm256_set1_ps(0.693359375f), ln2lo = _mm256_set1_ps(-2.12194440e-4f);
	__m256 n = _mm256_round_ps(_mm256_mul_ps(a, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, ln2hi, a);
	r = _mm256_fnmadd_ps(n, ln2lo, r);
	__m256 p = _mm256_set1_ps(1.9875691500E-4f);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
	__m256 r2 = _mm256_mul_ps(r, r);
	p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

AVX2FN static double exp_avx2(const float *x, float *out, long n, float shift, float scale) {
	const __m256 vs = _mm256_set1_ps(shift), vk = _mm256_set1_ps(scale), low = _mm256_set1_ps(EXP_LOW);
	const __m256 high = _mm256_set1_ps(0.5f);
	double sum = 0;
	long i = 0;
	while (i + 8 <= n) {
		// Sum blocks of up to 1024 values in float lanes, then in double.
		__m256 acc = _mm256_setzero_ps();
		long end = i + 1024 < n ? i + 1024 : n;
		for (; i + 8 <= end; i += 8) {
			__m256 a = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs), vk);
			__m256 keep = _mm256_cmp_ps(a, low, _CMP_GE_OQ); // false for -Inf and NaN
			__m256 e = _mm256_and_ps(exp8(_mm256_min_ps(_mm256_max_ps(a, low), high)), keep);
			if (out) _mm256_storeu_ps(out + i, e);
			acc = _mm256_add_ps(acc, e);
		}
		float lanes[8];
		_mm256_storeu_ps(lanes, acc);
		for (int j = 0; j < 8; j++) sum += lanes[j];
	}
	return sum + exp_generic(x + i, out ? out + i : NULL, n - i, shift, scale);
}

static int use_avx2(void) {
	static int v = -1;
	if (v < 0) v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	return v;
}

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
