// Int8 linear layers: weight packing, activation quantization, the thread pool and
// the dispatch to one of four kernels (int8gemm_amx.h, int8gemm_vnni.h, int8gemm_avx2.h and
// the portable one below). See int8gemm_doc.go for the design and measurements.
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/wait.h>
#endif

#include "int8gemm.h"
#include "simd.h"

// Packed layout: panels of CV_PANEL columns; panel p holds kp*CV_PANEL bytes as
// [kp/4][CV_PANEL columns][4 k], so byte (k, n) sits at
// p*kp*64 + (k/4)*256 + (n%64)*4 + k%4. One 64-byte load is 16 columns × 4 k and one
// panel row of 256 bytes is contiguous: a single row of x reads the panel as one
// linear stream.
enum { CV_PANEL = 64 };

struct cv_i8w {
	int k, n;      // unpadded shape
	int kp, np;    // k rounded up to 4, n rounded up to CV_PANEL
	int8_t *data;  // np/CV_PANEL panels of kp*CV_PANEL bytes, 64-byte aligned
	int32_t *comp; // [np] 128 · sum_k w[k][n], for the VNNI kernel's unsigned activations
	float *mult;   // [np] (1/127) · scale[n], MatMulIntegerToFloat's per-column multiplier
	int borrowed;  // data is the caller's (cv_i8w_wrap in place), not to be freed
};

// CV_QSCALE is QuantizeLinear's y_scale in the graph, a float32 constant.
#define CV_QSCALE (1.0f / 127.0f)
// CV_MIN_RANGE is the graph's floor on a row's max |x| (Max(amax, 1e-30)).
#define CV_MIN_RANGE 1e-30f

static void *cv_alloc(size_t n) {
	void *p = NULL;
	if (posix_memalign(&p, 64, (n + 63) & ~(size_t)63) != 0) {
		return NULL;
	}
	return p;
}

int64_t cv_i8w_packed_size(int K, int N) {
	if (K < 1 || N < 1 || K > CV_I8_MAX_K || N > INT_MAX - CV_PANEL) {
		return -1;
	}
	return (int64_t)((K + 3) & ~3) * ((N + CV_PANEL - 1) / CV_PANEL * CV_PANEL);
}

cv_i8w *cv_i8w_wrap(const int8_t *packed, int64_t len, const float *scale, int K, int N, int in_place) {
	int64_t size = cv_i8w_packed_size(K, N);
	if (packed == NULL || scale == NULL || size < 0 || len != size) {
		return NULL;
	}
	cv_i8w *p = calloc(1, sizeof *p);
	if (p == NULL) {
		return NULL;
	}
	p->k = K;
	p->n = N;
	p->kp = (K + 3) & ~3;
	p->np = (N + CV_PANEL - 1) / CV_PANEL * CV_PANEL;
	if (in_place && ((uintptr_t)packed & 63) == 0) {
		p->data = (int8_t *)packed;
		p->borrowed = 1;
	} else if ((p->data = cv_alloc((size_t)size)) != NULL) {
		memcpy(p->data, packed, (size_t)size);
	}
	p->comp = cv_alloc(sizeof(int32_t) * p->np);
	p->mult = cv_alloc(sizeof(float) * p->np);
	if (p->data == NULL || p->comp == NULL || p->mult == NULL) {
		cv_i8w_free(p);
		return NULL;
	}
	memset(p->comp, 0, sizeof(int32_t) * p->np);
	memset(p->mult, 0, sizeof(float) * p->np);
	// Byte i of a panel is column (i % (4·CV_PANEL)) / 4 of it; padding is zero.
	size_t panel = (size_t)p->kp * CV_PANEL;
	for (int n0 = 0; n0 < p->np; n0 += CV_PANEL) {
		const int8_t *src = p->data + (size_t)(n0 / CV_PANEL) * panel;
		for (size_t i = 0; i < panel; i++) {
			p->comp[n0 + (int)(i % (4 * CV_PANEL)) / 4] += 128 * src[i];
		}
	}
	for (int n = 0; n < N; n++) {
		p->mult[n] = CV_QSCALE * scale[n];
	}
	return p;
}

void cv_i8w_free(cv_i8w *p) {
	if (p == NULL) {
		return;
	}
	if (!p->borrowed) {
		free(p->data);
	}
	free(p->comp);
	free(p->mult);
	free(p);
}

int cv_i8w_k(const cv_i8w *p) { return p == NULL ? 0 : p->k; }
int cv_i8w_n(const cv_i8w *p) { return p == NULL ? 0 : p->n; }

// ---------------------------------------------------------------- quantization

// cv_round_even rounds v (|v| <= 2^22) half to even with float arithmetic alone,
// as QuantizeLinear does; the default rounding mode makes the addition round.
static inline float cv_round_even(float v) {
	const float magic = 12582912.0f; // 1.5 · 2^23
	volatile float t = v + magic;    // keep the compiler from folding the pair away
	return t - magic;
}

// cv_quant_code is QuantizeLinear's code for x in a row with range s.
static inline int cv_quant_code(float x, float s) {
	float v = (x / s) / CV_QSCALE;
	v = v < -128.0f ? -128.0f : v;
	v = v > 127.0f ? 127.0f : v;
	return (int)cv_round_even(v);
}

// cv_range_tail finishes the graph's per-row Max(ReduceMax(Abs(x)), 1e-30): amax is
// the largest |x[k]| for k < k0.
static inline float cv_range_tail(const float *x, int k0, int K, float amax) {
	for (int k = k0; k < K; k++) {
		float a = x[k] < 0 ? -x[k] : x[k];
		amax = a > amax ? a : amax;
	}
	return amax > CV_MIN_RANGE ? amax : CV_MIN_RANGE;
}

// The quantizers write row m of x as kp codes at q + m*kp (codes past K are zero) and
// its range at s[m]; with off = 0x80 they store code+128 as an unsigned byte.
static void cv_quant_portable(const float *x, int K, int kp, int m0, int m1, int8_t *q, float *s, int off) {
	for (int m = m0; m < m1; m++) {
		const float *row = x + (size_t)m * K;
		int8_t *qr = q + (size_t)m * kp;
		float r = cv_range_tail(row, 0, K, 0.0f);
		s[m] = r;
		for (int k = 0; k < K; k++) {
			qr[k] = (int8_t)(cv_quant_code(row[k], r) ^ off);
		}
		for (int k = K; k < kp; k++) {
			qr[k] = (int8_t)off;
		}
	}
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static void cv_quant_avx2(const float *x, int K, int kp, int m0, int m1, int8_t *q, float *s, int off) {
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	const __m256 lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f), qs = _mm256_set1_ps(CV_QSCALE);
	const __m256i shuf = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
		0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
	for (int m = m0; m < m1; m++) {
		const float *row = x + (size_t)m * K;
		int8_t *qr = q + (size_t)m * kp;
		__m256 mx = _mm256_setzero_ps();
		int k = 0;
		for (; k + 8 <= K; k += 8) {
			mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(row + k), absmask));
		}
		float t[8], amax = 0.0f;
		_mm256_storeu_ps(t, mx);
		for (int i = 0; i < 8; i++) {
			amax = t[i] > amax ? t[i] : amax;
		}
		float r = cv_range_tail(row, k, K, amax);
		s[m] = r;
		__m256 vr = _mm256_set1_ps(r);
		for (k = 0; k + 8 <= K; k += 8) {
			__m256 v = _mm256_div_ps(_mm256_div_ps(_mm256_loadu_ps(row + k), vr), qs);
			v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
			__m256i i = _mm256_cvtps_epi32(v); // rounds half to even (default MXCSR)
			i = _mm256_xor_si256(_mm256_shuffle_epi8(i, shuf), _mm256_set1_epi8((char)off));
			uint32_t a = (uint32_t)_mm256_extract_epi32(i, 0), b = (uint32_t)_mm256_extract_epi32(i, 4);
			memcpy(qr + k, &a, 4);
			memcpy(qr + k + 4, &b, 4);
		}
		for (; k < K; k++) {
			qr[k] = (int8_t)(cv_quant_code(row[k], r) ^ off);
		}
		for (k = K; k < kp; k++) {
			qr[k] = (int8_t)off;
		}
	}
}

__attribute__((target("avx512f,avx512bw"))) static void cv_quant_avx512(const float *x, int K, int kp, int m0, int m1, int8_t *q, float *s, int off) {
	const __m512 lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f), qs = _mm512_set1_ps(CV_QSCALE);
	const __m512i voff = _mm512_set1_epi32(off);
	for (int m = m0; m < m1; m++) {
		const float *row = x + (size_t)m * K;
		int8_t *qr = q + (size_t)m * kp;
		__m512 mx = _mm512_setzero_ps();
		int k = 0;
		for (; k + 16 <= K; k += 16) {
			mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(row + k)));
		}
		float r = cv_range_tail(row, k, K, _mm512_reduce_max_ps(mx));
		s[m] = r;
		__m512 vr = _mm512_set1_ps(r);
		for (k = 0; k + 16 <= K; k += 16) {
			__m512 v = _mm512_div_ps(_mm512_div_ps(_mm512_loadu_ps(row + k), vr), qs);
			v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
			__m512i i = _mm512_xor_si512(_mm512_cvtps_epi32(v), voff); // rounds half to even
			_mm_storeu_si128((__m128i *)(qr + k), _mm512_cvtepi32_epi8(i));
		}
		for (; k < K; k++) {
			qr[k] = (int8_t)(cv_quant_code(row[k], r) ^ off);
		}
		for (k = K; k < kp; k++) {
			qr[k] = (int8_t)off;
		}
	}
}
#endif

// ---------------------------------------------------------------- kernels

// One call's shared, read-only state. Kernels compute rows [m0, m1) of x against
// panels [p0, p1).
typedef struct {
	const cv_i8w *w;
	const float *x;
	float *y;
	int m;
	int8_t *q; // m rows of w->kp codes
	float *s;  // [m] row ranges
	int isa;
	int off; // 0x80 when the kernel reads codes as unsigned bytes
	// With panels split among the threads: thread t's panels not yet taken, [front,
	// back) packed as front << 32 | back. The owner takes from the front; a thread
	// done with its own takes from the back of the others'.
	_Atomic unsigned long long *ranges;
} cv_call;

enum { CV_PORTABLE = 0, CV_AVX2 = 1, CV_VNNI = 2, CV_AMX = 3 };

static void cv_gemm_portable(const cv_call *c, int m0, int m1, int p0, int p1) {
	const cv_i8w *w = c->w;
	int kp = w->kp;
	for (int p = p0; p < p1; p++) {
		const int8_t *panel = w->data + (size_t)p * kp * CV_PANEL;
		int n0 = p * CV_PANEL;
		int cols = w->n - n0 < CV_PANEL ? w->n - n0 : CV_PANEL;
		for (int m = m0; m < m1; m++) {
			int32_t acc[CV_PANEL] = {0};
			const int8_t *q = c->q + (size_t)m * kp;
			for (int k4 = 0; k4 < kp / 4; k4++) {
				const int8_t *wk = panel + (size_t)k4 * 4 * CV_PANEL;
				int32_t a0 = q[4 * k4], a1 = q[4 * k4 + 1], a2 = q[4 * k4 + 2], a3 = q[4 * k4 + 3];
				for (int j = 0; j < CV_PANEL; j++) {
					acc[j] += a0 * wk[4 * j] + a1 * wk[4 * j + 1] + a2 * wk[4 * j + 2] + a3 * wk[4 * j + 3];
				}
			}
			float *y = c->y + (size_t)m * w->n + n0;
			for (int j = 0; j < cols; j++) {
				y[j] = ((float)acc[j] * w->mult[n0 + j]) * c->s[m];
			}
		}
	}
}

#if defined(__x86_64__)
// The kernels' files are named .h though each is included once, here: the go command
// rebuilds a cgo package when one of its .h files changes, and ignores other suffixes.
#include "int8gemm_avx2.h"
#include "int8gemm_vnni.h"
#endif
#if defined(__x86_64__) && defined(__linux__)
static void cv_gemm(const cv_call *c, int m0, int m1, int p0, int p1, int pf_end);
static void cv_quant(const cv_call *c, int m0, int m1);
#include "int8gemm_amx.h"
#else
int cv_i8_linear_amx_model(const cv_i8w *p, const float *x, int M, float *y, int plain_epilogue) {
	(void)p, (void)x, (void)M, (void)y, (void)plain_epilogue;
	return ENOSYS;
}
#endif

// cv_gemm runs the call's kernel over rows [m0, m1) and panels [p0, p1); panels
// below pf_end are this thread's to prefetch ahead.
static void cv_gemm(const cv_call *c, int m0, int m1, int p0, int p1, int pf_end) {
	switch (c->isa) {
#if defined(__x86_64__)
#if defined(__linux__)
	case CV_AMX:
		if (m1 - m0 >= CV_AMX_MIN_ROWS && c->w->kp % 64 == 0) {
			cv_gemm_amx(c, m0, m1, p0, p1, pf_end);
		} else {
			cv_gemm_vnni(c, m0, m1, p0, p1, pf_end);
		}
		return;
#endif
	case CV_VNNI:
		cv_gemm_vnni(c, m0, m1, p0, p1, pf_end);
		return;
	case CV_AVX2:
		cv_gemm_avx2(c, m0, m1, p0, p1);
		return;
#endif
	default:
		cv_gemm_portable(c, m0, m1, p0, p1);
	}
}

static void cv_quant(const cv_call *c, int m0, int m1) {
	const cv_i8w *w = c->w;
	switch (c->isa) {
#if defined(__x86_64__)
	case CV_AMX:
	case CV_VNNI:
		cv_quant_avx512(c->x, w->k, w->kp, m0, m1, c->q, c->s, c->off);
		return;
	case CV_AVX2:
		cv_quant_avx2(c->x, w->k, w->kp, m0, m1, c->q, c->s, c->off);
		return;
#endif
	default:
		cv_quant_portable(c->x, w->k, w->kp, m0, m1, c->q, c->s, c->off);
	}
}

// ---------------------------------------------------------------- ISA choice

static int cv_best;
static pthread_once_t cv_best_once = PTHREAD_ONCE_INIT;

// cv_find_best_isa sets cv_best, once (cv_best_isa).
static void cv_find_best_isa(void) {
	cv_best = CV_PORTABLE;
#if defined(__x86_64__)
	if (cv_cpu_has(CV_CPU_AVX512F | CV_CPU_AVX512BW | CV_CPU_AVX512VNNI)) {
#if defined(__linux__)
		cv_best = cv_amx_ok() ? CV_AMX : CV_VNNI;
#else
		cv_best = CV_VNNI;
#endif
		return;
	}
	if (cv_cpu_has(CV_CPU_AVX2)) {
		cv_best = CV_AVX2;
	}
#endif
}

// cv_best_isa is the best kernel this CPU runs, decided at the first call (every call of
// cv_i8_linear asks).
static int cv_best_isa(void) {
	pthread_once(&cv_best_once, cv_find_best_isa);
	return cv_best;
}

static const char *const cv_isa_names[] = {"portable", "avx2", "avx512vnni", "amx"};
static atomic_int cv_forced = -1;

static int cv_current_isa(void) {
	int f = atomic_load_explicit(&cv_forced, memory_order_relaxed);
	return f >= 0 ? f : cv_best_isa();
}

const char *cv_i8_isa(void) { return cv_isa_names[cv_current_isa()]; }

int cv_i8_force_isa(const char *name) {
	if (name == NULL || name[0] == 0) {
		atomic_store(&cv_forced, -1);
		return 1;
	}
	for (int i = 0; i < 4; i++) {
		if (strcmp(name, cv_isa_names[i]) == 0) {
			if (i > cv_best_isa()) {
				return 0;
			}
			atomic_store(&cv_forced, i);
			return 1;
		}
	}
	return 0;
}

// ---------------------------------------------------------------- thread pool

#include "int8gemm_pool.h"

// ---------------------------------------------------------------- entry point

// Calls below CV_SMALL_WORK multiply-adds run on the calling thread alone: waking the
// workers costs more than they would save.
#define CV_SMALL_WORK (1L << 18)
// Calls with fewer rows quantize on the calling thread before the workers start.
enum { CV_QUANT_SPLIT_ROWS = 8 };

// cv_task_quant quantizes thread tid's share of the rows.
static void cv_task_quant(void *arg, int tid, int nthr) {
	const cv_call *c = arg;
	int m0 = (int)((long)c->m * tid / nthr), m1 = (int)((long)c->m * (tid + 1) / nthr);
	if (m0 < m1) {
		cv_quant(c, m0, m1);
	}
}

// cv_split_panels reports whether a call splits its panels among nthr threads (else
// its rows).
static inline int cv_split_panels(const cv_call *c, int nthr) { return c->w->np / CV_PANEL >= nthr || c->m < nthr; }

// cv_take_panel takes one panel of range r, from its front or its back; -1 when the
// range is empty. The front of a range ends at back, the back at front, so no panel
// is taken twice.
static int cv_take_panel(_Atomic unsigned long long *r, int from_back, int *limit) {
	unsigned long long v = atomic_load(r);
	for (;;) {
		unsigned f = (unsigned)(v >> 32), b = (unsigned)v;
		if (f >= b) {
			return -1;
		}
		unsigned long long n = from_back ? ((unsigned long long)f << 32) | (b - 1) : ((unsigned long long)(f + 1) << 32) | b;
		if (atomic_compare_exchange_weak(r, &v, n)) {
			*limit = (int)b; // the owner's panels run to here (as it took this one)
			return from_back ? (int)(b - 1) : (int)f;
		}
	}
}

// cv_task_gemm computes thread tid's share of y: with panels split, its own range of
// panels one by one, then any panels left at the back of the others' ranges (a worker
// that woke late, or a slower core, leaves them); otherwise a range of rows.
static void cv_task_gemm(void *arg, int tid, int nthr) {
	const cv_call *c = arg;
	int np = c->w->np / CV_PANEL;
	if (cv_split_panels(c, nthr)) {
		int p, limit;
		while ((p = cv_take_panel(&c->ranges[tid], 0, &limit)) >= 0) {
			cv_gemm(c, 0, c->m, p, p + 1, limit); // prefetch the next panel while it is ours
		}
		for (int i = 1; i < nthr; i++) {
			_Atomic unsigned long long *r = &c->ranges[(tid + i) % nthr];
			while ((p = cv_take_panel(r, 1, &limit)) >= 0) {
				cv_gemm(c, 0, c->m, p, p + 1, p + 1);
			}
		}
		return;
	}
	int m0 = (int)((long)c->m * tid / nthr), m1 = (int)((long)c->m * (tid + 1) / nthr);
	if (m0 < m1) {
		cv_gemm(c, m0, m1, 0, np, np);
	}
}

int cv_i8_linear(const cv_i8w *p, const float *x, int M, float *y) {
	if (p == NULL || x == NULL || y == NULL || M < 1) {
		return EINVAL;
	}
	cv_call c = {.w = p, .x = x, .y = y, .m = M, .isa = cv_current_isa()};
	c.off = c.isa == CV_VNNI || c.isa == CV_AMX ? 0x80 : 0;
	size_t qbytes = ((size_t)M * p->kp + 63) & ~(size_t)63;
	char *scratch = cv_scratch(CV_SCRATCH_INT8, qbytes + sizeof(float) * (size_t)M); // the quantized rows
	if (scratch == NULL) {
		return ENOMEM;
	}
	c.q = (int8_t *)scratch;
	c.s = (float *)(scratch + qbytes);

	double work = (double)M * p->kp * p->np;
	int nthr = work < (double)CV_SMALL_WORK ? 1 : cv_pool_acquire();
	if (nthr <= 1) {
		cv_quant(&c, 0, M);
		cv_gemm(&c, 0, M, 0, p->np / CV_PANEL, p->np / CV_PANEL);
		return 0;
	}
	if (M >= CV_QUANT_SPLIT_ROWS) {
		cv_pool_run(cv_task_quant, &c, nthr);
	} else {
		cv_quant(&c, 0, M);
	}
	_Atomic unsigned long long ranges[CV_MAX_THREADS];
	if (cv_split_panels(&c, nthr)) {
		long np = p->np / CV_PANEL;
		for (int t = 0; t < nthr; t++) {
			atomic_init(&ranges[t], (unsigned long long)(np * t / nthr) << 32 | (unsigned long long)(np * (t + 1) / nthr));
		}
		c.ranges = ranges;
	}
	cv_pool_run(cv_task_gemm, &c, nthr);
	cv_pool_release();
	return 0;
}
