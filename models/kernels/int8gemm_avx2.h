// The AVX2 kernel, included by int8gemm.c. vpmaddubsw multiplies unsigned by signed
// bytes, so it takes |w| and the code with w's sign moved onto it:
// maddubs(|w|, sign(q, w)). Codes are within [-127, 127] and |w| <= 128, so a pair
// sums to at most 2 · 127 · 128 = 32512 and the int16 never saturates; vpmaddwd by 1
// widens to int32. Every product and sum is exact.

#define CV_AVX2_FN __attribute__((target("avx2")))

// cv_avx2_block computes R rows (R <= 4) × 32 columns (half a panel: 4 ymm of 8
// columns × 4 k) over all of K. wp points at the half panel's first k-step (stride
// 256 bytes), cols is how many of its 32 columns are real. With more than two rows its
// accumulators do not fit AVX2's 16 ymm registers and live on the stack (L1, store to
// load forwarding); taking two columns at a time instead, so that they fit, reads the
// half panel twice and was slower (a 4,864 × 896 product at 16 rows: 36 against 63
// GMAC/s on a 2-core Zen 3).
CV_AVX2_FN __attribute__((always_inline)) static inline void cv_avx2_block(const int R, int k4n,
	const int8_t *a, int lda, const int8_t *wp, const float *mult, const float *s, float *y, int ldy, int cols) {
	__m256i acc[4][4];
	const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
	for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
		for (int c = 0; c < 4; c++) {
			acc[r][c] = _mm256_setzero_si256();
		}
	}
	for (int k4 = 0; k4 < k4n; k4++) {
		__m256i w[4], aw[4];
#pragma GCC unroll 4
		for (int c = 0; c < 4; c++) {
			w[c] = _mm256_load_si256((const __m256i *)(wp + (size_t)k4 * 4 * CV_PANEL + c * 32));
			aw[c] = _mm256_abs_epi8(w[c]);
		}
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			int32_t av;
			memcpy(&av, a + (size_t)r * lda + 4 * k4, 4);
			__m256i b = _mm256_set1_epi32(av);
#pragma GCC unroll 4
			for (int c = 0; c < 4; c++) {
				__m256i p = _mm256_maddubs_epi16(aw[c], _mm256_sign_epi8(b, w[c]));
				acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(p, ones));
			}
		}
	}
#pragma GCC unroll 4
	for (int c = 0; c < 4; c++) {
		__m256 mu = _mm256_loadu_ps(mult + 8 * c);
		int left = cols - 8 * c;
#pragma GCC unroll 4
		for (int r = 0; r < R; r++) {
			__m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][c]), mu), _mm256_set1_ps(s[r]));
			float *dst = y + (size_t)r * ldy + 8 * c;
			if (left >= 8) {
				_mm256_storeu_ps(dst, f);
			} else if (left > 0) {
				float t[8];
				_mm256_storeu_ps(t, f);
				memcpy(dst, t, sizeof(float) * (size_t)left);
			}
		}
	}
}

#define CV_AVX2_R(R) \
	CV_AVX2_FN static void cv_avx2_##R(int k4n, const int8_t *a, int lda, const int8_t *wp, \
		const float *mult, const float *s, float *y, int ldy, int cols) { \
		cv_avx2_block(R, k4n, a, lda, wp, mult, s, y, ldy, cols); \
	}
CV_AVX2_R(1)
CV_AVX2_R(2)
CV_AVX2_R(3)
CV_AVX2_R(4)
#undef CV_AVX2_R

typedef void (*cv_avx2_fn)(int, const int8_t *, int, const int8_t *, const float *, const float *, float *, int, int);
static const cv_avx2_fn cv_avx2_by_rows[5] = {NULL, cv_avx2_1, cv_avx2_2, cv_avx2_3, cv_avx2_4};

// cv_avx2_row computes one row × a whole panel (64 columns) over all of K in one pass:
// eight accumulators in registers, the weights loaded, made absolute and used column
// group by column group, so a k-step's 256 bytes are read in order. Streaming each panel
// once, front to back, reads the weights faster than two passes over its halves, and
// keeps the accumulators out of the stack (the blocks above, which share each weight
// load between rows).
CV_AVX2_FN static void cv_avx2_row(int k4n, const int8_t *a, const int8_t *panel, const float *mult, float s, float *y, int cols) {
	__m256i acc[8];
	const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
	for (int c = 0; c < 8; c++) {
		acc[c] = _mm256_setzero_si256();
	}
	for (int k4 = 0; k4 < k4n; k4++) {
		int32_t av;
		memcpy(&av, a + 4 * k4, 4);
		const __m256i b = _mm256_set1_epi32(av);
		const int8_t *row = panel + (size_t)k4 * 4 * CV_PANEL;
#pragma GCC unroll 8
		for (int c = 0; c < 8; c++) {
			const __m256i wv = _mm256_load_si256((const __m256i *)(row + c * 32));
			const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(b, wv));
			acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p, ones));
		}
	}
	const __m256 sv = _mm256_set1_ps(s);
#pragma GCC unroll 8
	for (int c = 0; c < 8; c++) {
		const int left = cols - 8 * c;
		if (left <= 0) {
			break;
		}
		__m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[c]), _mm256_loadu_ps(mult + 8 * c)), sv);
		if (left >= 8) {
			_mm256_storeu_ps(y + 8 * c, f);
		} else {
			float t[8];
			_mm256_storeu_ps(t, f);
			memcpy(y + 8 * c, t, sizeof(float) * (size_t)left);
		}
	}
}

// cv_avx2_quarter runs k-steps [k0, k1) of R rows (R <= CV_AVX2_COLS_ROWS) × 16
// columns (a quarter of a panel: 2 ymm of 8 columns × 4 k, one 64-byte line per k-step),
// its accumulators coming from and going back to acc (2R vectors). Each weight vector is
// loaded and made absolute once and used for every row from registers: 2R accumulators,
// the two vectors, their absolute values and the row's broadcast fit AVX2's 16 ymm
// registers at R = 5. wp points at the quarter's k-step 0 (stride 256 bytes). Each k-step
// prefetches the quarter's line CV_AVX2_PF k-steps ahead: in the chunk that follows
// (past the end of K, the same quarter of the next panel).
#define CV_AVX2_COLS_ROWS 5
#define CV_AVX2_KC 8
#define CV_AVX2_PF CV_AVX2_KC
CV_AVX2_FN __attribute__((always_inline)) static inline void cv_avx2_quarter(const int R, int k0, int k1, const int8_t *a,
	int lda, const int8_t *wp, __m256i *acc) {
	__m256i sum[CV_AVX2_COLS_ROWS][2];
	const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 5
	for (int r = 0; r < R; r++) {
		sum[r][0] = _mm256_load_si256(acc + 2 * r);
		sum[r][1] = _mm256_load_si256(acc + 2 * r + 1);
	}
	for (int k4 = k0; k4 < k1; k4++) {
		const int8_t *wk = wp + (size_t)k4 * 4 * CV_PANEL;
		_mm_prefetch((const char *)(wk + CV_AVX2_PF * 4 * CV_PANEL), _MM_HINT_T0);
		const __m256i w0 = _mm256_load_si256((const __m256i *)wk), w1 = _mm256_load_si256((const __m256i *)(wk + 32));
		const __m256i aw0 = _mm256_abs_epi8(w0), aw1 = _mm256_abs_epi8(w1);
#pragma GCC unroll 5
		for (int r = 0; r < R; r++) {
			int32_t av;
			memcpy(&av, a + (size_t)r * lda + 4 * k4, 4);
			const __m256i b = _mm256_set1_epi32(av);
			const __m256i p0 = _mm256_maddubs_epi16(aw0, _mm256_sign_epi8(b, w0));
			const __m256i p1 = _mm256_maddubs_epi16(aw1, _mm256_sign_epi8(b, w1));
			sum[r][0] = _mm256_add_epi32(sum[r][0], _mm256_madd_epi16(p0, ones));
			sum[r][1] = _mm256_add_epi32(sum[r][1], _mm256_madd_epi16(p1, ones));
		}
	}
#pragma GCC unroll 5
	for (int r = 0; r < R; r++) {
		_mm256_store_si256(acc + 2 * r, sum[r][0]);
		_mm256_store_si256(acc + 2 * r + 1, sum[r][1]);
	}
}

// cv_avx2_cols computes R rows (R <= CV_AVX2_COLS_ROWS) × a panel (64 columns, cols of
// them real) over all of K, a chunk of CV_AVX2_KC k-steps (2 KB of the panel) at a time:
// each quarter runs over the chunk in turn, its accumulators kept in memory between
// chunks, so a chunk's lines come from memory once (the first quarter's, prefetched a
// chunk ahead) and from L1 for the other three.
CV_AVX2_FN __attribute__((always_inline)) static inline void cv_avx2_cols(const int R, int k4n, const int8_t *a, int lda,
	const int8_t *panel, const float *mult, const float *s, float *y, int ldy, int cols) {
	__m256i acc[4][2 * CV_AVX2_COLS_ROWS] __attribute__((aligned(32)));
	const int nq = cols >= CV_PANEL ? 4 : (cols + 15) / 16;
	for (int g = 0; g < nq; g++) {
		for (int i = 0; i < 2 * R; i++) {
			acc[g][i] = _mm256_setzero_si256();
		}
	}
	for (int k0 = 0; k0 < k4n; k0 += CV_AVX2_KC) {
		const int k1 = k4n - k0 < CV_AVX2_KC ? k4n : k0 + CV_AVX2_KC;
		for (int g = 0; g < nq; g++) {
			cv_avx2_quarter(R, k0, k1, a, lda, panel + 64 * g, acc[g]);
		}
	}
	for (int g = 0; g < nq; g++) {
#pragma GCC unroll 2
		for (int c = 0; c < 2; c++) {
			const int left = cols - 16 * g - 8 * c;
			if (left <= 0) {
				break;
			}
			const __m256 mu = _mm256_loadu_ps(mult + 16 * g + 8 * c);
#pragma GCC unroll 5
			for (int r = 0; r < R; r++) {
				const __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[g][2 * r + c]), mu), _mm256_set1_ps(s[r]));
				float *dst = y + (size_t)r * ldy + 16 * g + 8 * c;
				if (left >= 8) {
					_mm256_storeu_ps(dst, f);
				} else {
					float t[8];
					_mm256_storeu_ps(t, f);
					memcpy(dst, t, sizeof(float) * (size_t)left);
				}
			}
		}
	}
}

#define CV_AVX2_C(R) \
	CV_AVX2_FN static void cv_avx2_cols_##R(int k4n, const int8_t *a, int lda, const int8_t *wp, const float *mult, \
		const float *s, float *y, int ldy, int cols) { \
		cv_avx2_cols(R, k4n, a, lda, wp, mult, s, y, ldy, cols); \
	}
CV_AVX2_C(1)
CV_AVX2_C(2)
CV_AVX2_C(3)
CV_AVX2_C(4)
CV_AVX2_C(5)
#undef CV_AVX2_C

static const cv_avx2_fn cv_avx2_cols_by_rows[CV_AVX2_COLS_ROWS + 1] = {
	NULL, cv_avx2_cols_1, cv_avx2_cols_2, cv_avx2_cols_3, cv_avx2_cols_4, cv_avx2_cols_5};

// One row streams each panel on its own (cv_avx2_row). 2 to CV_AVX2_ROWS rows take each
// panel a chunk of CV_AVX2_KC k-steps at a time, each quarter of the chunk in turn, the
// rows in blocks of up to five of as even a size as they can be (cv_avx2_cols). The
// weights are read from memory once per call, and each chunk's four lines per k-step
// once from memory and three times from L1. More rows share each weight load in the
// four-row blocks (cv_avx2_block).
//
// CV_AVX2_ROWS = 0 leaves every row count to the four-row blocks.
//
// On a 2-core AMD EPYC (family 23 model 1, Zen; AVX2, no AVX-512), which executes a
// 256-bit instruction as two 128-bit halves, a vpmaddubsw or vpmaddwd issues once per
// two cycles on the one integer multiply pipe, so 32 multiply-adds take about
// 1.6 ns whichever way the loop is blocked: about 20 GMAC/s per core is the ceiling, and
// at 2 to 16 rows the kernel is bound by it, not by the weights' bandwidth. Replacing
// vpmaddwd's widening by shifts (which use another pipe) added more ALU work than it
// saved. Measured there on one thread (CPU time, the weights cold; the range is over
// Qwen2.5-0.5B's gate/up, down, qkv and o shapes), in GMAC/s:
//   M                              2            5            8            16
//   each row streams the panel     9.3-10.4     13.0-14.1    13.8-15.3    15.1-16.2
//   quarters, blocks of <= 5 rows  12.3-13.0    17.3-17.7    17.2-18.8    17.6-18.4
// Without the prefetch the quarters were slower than the rows at 2 rows (7.3-8.1) and
// about the same at 5; blocks of at most 4 rows were 10-15% slower at 5 rows (3 + 2);
// 8-column groups in blocks of up to 8 rows were slower at 2 rows (10.2-11.1), 3-5%
// slower at 5 and about the same at 8 and 16; prefetching 32 k-steps ahead was as fast
// as 16, 8 and 4 slower. With both cores (BenchmarkInt8Linear, medians of three) the
// quarters took M = 5 from 25.2-29.6 to 27.5-36.0 GMAC/s and M = 16 from 31.0-34.2 to
// 32.4-39.1 over the five shapes (the head included), and a 0.5B int8 verifying step of
// 5 tokens from 85.6 to 72.4 ms (26.3 ms at 1 token).
//
// The quarters first ran each over all of K (a panel is 57 KB at K = 896, past L1), one
// line in four, prefetched 16 k-steps ahead. On a 2-core AMD EPYC (family 25 model 1,
// Zen 3: AVX2 with full-width 256-bit units), where five rows are not bound by arithmetic
// as they are on Zen, that read the weights at 12-15 GB/s against 20-25 GB/s for one
// row's linear stream. In chunks of 8 k-steps (2 KB), each quarter prefetching its line
// one chunk ahead, BenchmarkInt8Linear (2 threads, medians of three, alternating the two
// builds) went at M = 2 from 16.0-29.9 to 19.5-42.8 GMAC/s, at M = 5 from 33.7-66.2 to
// 36.3-76.2 and at M = 8 from 39.5-80.3 to 42.7-85.3 over the five shapes (M = 16 within
// the noise). Timed the same way through cv_i8_linear from C (896 × 4864 and four
// other shapes, cold weights), chunks of 16 k-steps were as fast at 5 rows and slower at
// 2, 32 slower at both, and prefetching every line of the chunk from the first quarter
// alone was slower.
// At M = 5 the kernel then runs at about 44 GMAC/s per core in a 0.5B int8 step, near the
// 50 it reaches with its weights in L2: bound by arithmetic again.
#ifndef CV_AVX2_ROWS
#define CV_AVX2_ROWS 16
#endif

static void cv_gemm_avx2(const cv_call *c, int m0, int m1, int p0, int p1) {
	const cv_i8w *w = c->w;
	const int kp = w->kp, k4n = kp / 4;
	for (int p = p0; p < p1; p++) {
		const int8_t *panel = w->data + (size_t)p * kp * CV_PANEL;
		if (m1 - m0 == 1 && CV_AVX2_ROWS >= 1) {
			const int n0 = p * CV_PANEL, cols = w->n - n0;
			cv_avx2_row(k4n, c->q + (size_t)m0 * kp, panel, w->mult + n0, c->s[m0], c->y + (size_t)m0 * w->n + n0,
				cols < CV_PANEL ? cols : CV_PANEL);
			continue;
		}
		if (m1 - m0 <= CV_AVX2_ROWS) {
			const int rows = m1 - m0, nb = (rows + CV_AVX2_COLS_ROWS - 1) / CV_AVX2_COLS_ROWS;
			const int n0 = p * CV_PANEL, cols = w->n - n0;
			for (int b = 0, mb = m0; b < nb; b++) {
				const int r = rows * (b + 1) / nb - rows * b / nb;
				cv_avx2_cols_by_rows[r](k4n, c->q + (size_t)mb * kp, kp, panel, w->mult + n0, c->s + mb,
					c->y + (size_t)mb * w->n + n0, w->n, cols < CV_PANEL ? cols : CV_PANEL);
				mb += r;
			}
			continue;
		}
		for (int h = 0; h < 2; h++) {
			const int n0 = p * CV_PANEL + 32 * h;
			const int cols = w->n - n0;
			if (cols <= 0) {
				break;
			}
			for (int mb = m0; mb < m1; mb += 4) {
				int r = m1 - mb < 4 ? m1 - mb : 4;
				cv_avx2_by_rows[r](k4n, c->q + (size_t)mb * kp, kp, panel + 128 * h, w->mult + n0, c->s + mb,
					c->y + (size_t)mb * w->n + n0, w->n, cols < 32 ? cols : 32);
			}
		}
	}
}
