// The AVX512-VNNI kernel, included by int8gemm.c. Activations are unsigned bytes
// (code + 128) so that vpdpbusd can multiply them by the signed weights; the epilogue
// subtracts comp[n] = 128 · sum_k w[k][n]. Every product and sum is exact in int32.

#define CV_VNNI_FN __attribute__((target("avx512f,avx512bw,avx512vnni")))

// vpdpbusd through inline asm: with the intrinsic gcc 12 keeps a block of 16 or more
// accumulators on the stack inside the inner loop.
#define CV_DPBUSD(acc, a, w) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(w))

// cv_vnni_block computes R rows (R <= 6) × one 64-column panel over all of K: 4R zmm
// accumulators, one 4-byte broadcast per row and k-step. a holds the rows' codes
// (stride lda), y the rows' outputs (stride ldy), cols how many of the panel's
// columns are real. With pf non-NULL, each k-step also pulls one line of pf (the next
// panel) towards L2, so that the panel after this one is on its way from memory.
CV_VNNI_FN __attribute__((always_inline)) static inline void cv_vnni_block(const int R, int k4n,
	const uint8_t *a, int lda, const int8_t *panel, const int32_t *comp, const float *mult,
	const float *s, float *y, int ldy, int cols, const int8_t *pf) {
	__m512i acc[6][4];
#pragma GCC unroll 6
	for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
		for (int c = 0; c < 4; c++) {
			acc[r][c] = _mm512_setzero_si512();
		}
	}
	const int8_t *wk = panel;
	for (int k4 = 0; k4 < k4n; k4++, wk += 4 * CV_PANEL) {
		__m512i w[4];
#pragma GCC unroll 4
		for (int c = 0; c < 4; c++) {
			w[c] = _mm512_load_si512((const void *)(wk + c * 64));
		}
		if (pf != NULL) {
			_mm_prefetch((const char *)(pf + (size_t)k4 * 64), _MM_HINT_T1);
		}
#pragma GCC unroll 6
		for (int r = 0; r < R; r++) {
			int32_t av;
			memcpy(&av, a + (size_t)r * lda + 4 * k4, 4);
			__m512i b = _mm512_set1_epi32(av);
#pragma GCC unroll 4
			for (int c = 0; c < 4; c++) {
				CV_DPBUSD(acc[r][c], b, w[c]);
			}
		}
	}
#pragma GCC unroll 4
	for (int c = 0; c < 4; c++) {
		int left = cols - 16 * c;
		__mmask16 mask = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
		__m512i cp = _mm512_loadu_si512(comp + 16 * c);
		__m512 mu = _mm512_loadu_ps(mult + 16 * c);
#pragma GCC unroll 6
		for (int r = 0; r < R; r++) {
			__m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][c], cp));
			f = _mm512_mul_ps(_mm512_mul_ps(f, mu), _mm512_set1_ps(s[r]));
			_mm512_mask_storeu_ps(y + (size_t)r * ldy + 16 * c, mask, f);
		}
	}
}

#define CV_VNNI_R(R) \
	CV_VNNI_FN static void cv_vnni_##R(int k4n, const uint8_t *a, int lda, const int8_t *panel, \
		const int32_t *comp, const float *mult, const float *s, float *y, int ldy, int cols, const int8_t *pf) { \
		cv_vnni_block(R, k4n, a, lda, panel, comp, mult, s, y, ldy, cols, pf); \
	}
CV_VNNI_R(1)
CV_VNNI_R(2)
CV_VNNI_R(3)
CV_VNNI_R(4)
CV_VNNI_R(5)
CV_VNNI_R(6)
#undef CV_VNNI_R

typedef void (*cv_vnni_fn)(int, const uint8_t *, int, const int8_t *, const int32_t *, const float *,
	const float *, float *, int, int, const int8_t *);
static const cv_vnni_fn cv_vnni_by_rows[7] = {NULL, cv_vnni_1, cv_vnni_2, cv_vnni_3, cv_vnni_4, cv_vnni_5, cv_vnni_6};

// cv_block_rows is the row block for a share of rows: up to 6 rows in one block; 4 per
// block up to 16 rows (4 × 4 accumulators measured best there); 6 beyond.
static inline int cv_block_rows(int rows) { return rows <= 6 ? rows : rows <= 16 ? 4 : 6; }

// cv_gemm_vnni walks panel by panel, and within a panel row block by row block, so
// that each panel is read from memory once and reused from cache by every block.
static void cv_gemm_vnni(const cv_call *c, int m0, int m1, int p0, int p1, int pf_end) {
	const cv_i8w *w = c->w;
	const int kp = w->kp, k4n = kp / 4, R = cv_block_rows(m1 - m0);
	const size_t panel_bytes = (size_t)kp * CV_PANEL;
	const size_t lines = panel_bytes / 64; // 64-byte lines in a panel
	for (int p = p0; p < p1; p++) {
		const int8_t *panel = w->data + (size_t)p * panel_bytes;
		const int n0 = p * CV_PANEL, cols = w->n - n0 < CV_PANEL ? w->n - n0 : CV_PANEL;
		size_t next = 0; // lines of the next panel already prefetched
		for (int mb = m0; mb < m1; mb += R) {
			int r = m1 - mb < R ? m1 - mb : R;
			const int8_t *pf = NULL;
			if (m1 - m0 > 1 && p + 1 < pf_end && next < lines) {
				pf = panel + panel_bytes + next * 64;
				next += (size_t)k4n; // 4 blocks cover the panel's kp lines exactly
			}
			cv_vnni_by_rows[r](k4n, (const uint8_t *)c->q + (size_t)mb * kp, kp, panel, w->comp + n0,
				w->mult + n0, c->s + mb, c->y + (size_t)mb * w->n + n0, w->n, cols, pf);
		}
	}
}
