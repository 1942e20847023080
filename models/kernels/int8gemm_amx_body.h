// The AMX kernel's body, included by int8gemm_amx.h with CV_AMX_NAME (the function's
// name), CV_AMX_ATTR (its attributes) and the TL_* tile operations defined: the
// instructions themselves, or their model in C. It undefines them at its end, ready
// for the next inclusion. No include guard on purpose.

// CV_AMX_NAME computes rows [m0, m1) × panels [p0, p1): up to 16 rows at a time in tile
// 4, a panel's four 16-column B tiles in turn in tile 5, their sums in tiles 0-3; the
// panel after each one, when below pf_end, is prefetched towards L2 with the first row
// block. REQUIRES: kp % 64 == 0 (whole 16-group B tiles).
CV_AMX_ATTR static void CV_AMX_NAME(const cv_call *c, int m0, int m1, int p0, int p1, int pf_end) {
	const cv_i8w *w = c->w;
	const int kp = w->kp, k4n = kp / 4;
	const size_t panel_bytes = (size_t)kp * CV_PANEL;
	int32_t acc[16 * 64] __attribute__((aligned(64)));
	TL_STATE
	for (int mb = m0; mb < m1; mb += 16) {
		const int R = m1 - mb < 16 ? m1 - mb : 16;
		cv_tilecfg cfg;
		memset(&cfg, 0, sizeof cfg);
		cfg.palette = 1;
		for (int t = 0; t < 5; t++) {
			cfg.rows[t] = (uint8_t)R; // tiles 0-3: sums, R rows × 16 int32; tile 4: R rows of codes
			cfg.colsb[t] = 64;
		}
		cfg.rows[5] = 16; // tile 5: 16 k-groups × 16 columns × 4 bytes
		cfg.colsb[5] = 64;
		TL_CONFIG(&cfg);
		const uint8_t *a = (const uint8_t *)c->q + (size_t)mb * kp;
		for (int p = p0; p < p1; p++) {
			const int8_t *panel = w->data + (size_t)p * panel_bytes;
			const int n0 = p * CV_PANEL, cols = w->n - n0 < CV_PANEL ? w->n - n0 : CV_PANEL;
			const int8_t *pf = mb == m0 && p + 1 < pf_end ? panel + panel_bytes : NULL;
			TL_ZERO(0);
			TL_ZERO(1);
			TL_ZERO(2);
			TL_ZERO(3);
			for (int k4 = 0; k4 < k4n; k4 += 16) {
				const int8_t *b = panel + (size_t)k4 * 4 * CV_PANEL;
				if (pf != NULL) {
					for (int i = 0; i < 16 * 4; i++) { // the next panel's same 4 KB, towards L2
						__builtin_prefetch(pf + (size_t)k4 * 4 * CV_PANEL + 64 * i, 0, 2);
					}
				}
				TL_LOAD(4, a + 4 * (size_t)k4, kp);
				TL_LOAD(5, b, 4 * CV_PANEL);
				TL_DPBUSD(0, 4, 5);
				TL_LOAD(5, b + 64, 4 * CV_PANEL);
				TL_DPBUSD(1, 4, 5);
				TL_LOAD(5, b + 128, 4 * CV_PANEL);
				TL_DPBUSD(2, 4, 5);
				TL_LOAD(5, b + 192, 4 * CV_PANEL);
				TL_DPBUSD(3, 4, 5);
			}
			TL_STORE(0, acc, 64 * 4);
			TL_STORE(1, acc + 16, 64 * 4);
			TL_STORE(2, acc + 32, 64 * 4);
			TL_STORE(3, acc + 48, 64 * 4);
			TL_EPILOGUE(R, acc, w->comp + n0, w->mult + n0, c->s + mb, c->y + (size_t)mb * w->n + n0, w->n, cols);
		}
		TL_RELEASE();
	}
}

#undef CV_AMX_NAME
#undef CV_AMX_ATTR
#undef TL_STATE
#undef TL_CONFIG
#undef TL_ZERO
#undef TL_LOAD
#undef TL_DPBUSD
#undef TL_STORE
#undef TL_RELEASE
#undef TL_EPILOGUE
