// The AMX kernel, included by int8gemm.c. It reads the same packed panels and the same
// unsigned activation codes as the VNNI kernel: one 64-byte row of a panel row group is
// what a B tile row holds (16 columns × 4 k), so a panel is four B tiles of 16 k-groups
// each, loaded with a stride of one panel row (256 bytes). TDPBUSD multiplies unsigned
// by signed bytes into int32 as vpdpbusd does, so the sums, and after the shared
// epilogue the outputs, are the VNNI kernel's exactly.
//
// Linux hands AMX's tile data to a process only after it asks (arch_prctl
// ARCH_REQ_XCOMP_PERM), and a kernel that faults would take the server down: cv_amx_ok
// asks once, then runs the kernel on a small problem in a forked child and compares it
// with the VNNI kernel's result; AMX is used only when the child exits cleanly with the
// same numbers.

#define CV_AMX_FN __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni")))

// CV_AMX_MIN_ROWS: fewer rows go to the VNNI kernel (one row streams the weights, which
// the tiles do not make faster).
enum { CV_AMX_MIN_ROWS = 8 };

// cv_tilecfg is the 64-byte operand of ldtilecfg (palette 1).
typedef struct {
	uint8_t palette, start_row;
	uint8_t reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
} cv_tilecfg;

CV_AMX_FN static inline void cv_amx_config(const cv_tilecfg *cfg) {
	// The whole 64 bytes are the operand (the intrinsic names only the first 8).
	__asm__ volatile("ldtilecfg %0" ::"m"(*(const struct { char b[64]; } *)cfg));
}

// cv_amx_epilogue turns R rows × 64 int32 sums (stride 64) into outputs, exactly as
// the VNNI kernel's epilogue does (AVX-512F only: the model below runs it too).
__attribute__((target("avx512f"))) static void cv_amx_epilogue(int R, const int32_t *acc, const int32_t *comp, const float *mult,
	const float *s, float *y, int ldy, int cols) {
	for (int c = 0; c < 4; c++) {
		int left = cols - 16 * c;
		if (left <= 0) {
			break;
		}
		__mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
		__m512i cp = _mm512_loadu_si512(comp + 16 * c);
		__m512 mu = _mm512_loadu_ps(mult + 16 * c);
		for (int r = 0; r < R; r++) {
			__m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(acc + (size_t)r * 64 + 16 * c), cp));
			f = _mm512_mul_ps(_mm512_mul_ps(f, mu), _mm512_set1_ps(s[r]));
			_mm512_mask_storeu_ps(y + (size_t)r * ldy + 16 * c, mask, f);
		}
	}
}

// The kernel itself (int8gemm_amx_body.h) is compiled twice: on the tile instructions
// (cv_gemm_amx), and on a plain C model of them written from the instructions'
// definitions (cv_gemm_amx_model), which the tests run on any CPU against the reference,
// so the kernel's addressing, tile shapes and operand order are checked even where no
// AMX unit is.
#define CV_AMX_NAME cv_gemm_amx
#define CV_AMX_ATTR CV_AMX_FN
#define TL_STATE
#define TL_CONFIG(cfg) cv_amx_config(cfg)
#define TL_ZERO(t) _tile_zero(t)
#define TL_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define TL_DPBUSD(d, a, b) _tile_dpbusd(d, a, b)
#define TL_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TL_RELEASE() _tile_release()
#define TL_EPILOGUE cv_amx_epilogue
#include "int8gemm_amx_body.h"

// cv_tiles models the eight tile registers and their configured shapes.
typedef struct {
	uint8_t rows[8];
	uint16_t colsb[8];
	uint8_t data[8][16][64];
	int bad; // set when an instruction breaks its shape rules (the CPU would fault)
} cv_tiles;

static void cv_model_config(cv_tiles *t, const cv_tilecfg *cfg) {
	memset(t, 0, sizeof *t);
	if (cfg->palette != 1) {
		t->bad = 1;
	}
	for (int i = 0; i < 8; i++) {
		t->rows[i] = cfg->rows[i];
		t->colsb[i] = cfg->colsb[i];
		if (t->rows[i] > 16 || t->colsb[i] > 64) {
			t->bad = 1;
		}
	}
}

// cv_model_load is TILELOADD: row r of tile i is colsb bytes at base + r*stride, and
// the bytes past the configured shape are zero.
static void cv_model_load(cv_tiles *t, int i, const void *base, long stride) {
	memset(t->data[i], 0, sizeof t->data[i]);
	for (int r = 0; r < t->rows[i]; r++) {
		memcpy(t->data[i][r], (const char *)base + r * stride, t->colsb[i]);
	}
}

static void cv_model_store(cv_tiles *t, int i, void *base, long stride) {
	for (int r = 0; r < t->rows[i]; r++) {
		memcpy((char *)base + r * stride, t->data[i][r], t->colsb[i]);
	}
}

// cv_model_dpbusd is TDPBUSD d, a, b: d[m][n] (int32) += sum over k < colsb(a)/4 and
// i < 4 of unsigned a[m][4k+i] times signed b[k][4n+i], with the instruction's shape
// rules: rows(d) = rows(a), colsb(d) = colsb(b), colsb(a) = 4 rows(b).
static void cv_model_dpbusd(cv_tiles *t, int d, int a, int b) {
	if (t->rows[d] != t->rows[a] || t->colsb[d] != t->colsb[b] || t->colsb[a] != 4 * t->rows[b]) {
		t->bad = 1;
		return;
	}
	for (int m = 0; m < t->rows[d]; m++) {
		for (int n = 0; n < t->colsb[d] / 4; n++) {
			int32_t acc;
			memcpy(&acc, &t->data[d][m][4 * n], 4);
			for (int k = 0; k < t->colsb[a] / 4; k++) {
				for (int i = 0; i < 4; i++) {
					acc += (int32_t)t->data[a][m][4 * k + i] * (int32_t)(int8_t)t->data[b][k][4 * n + i];
				}
			}
			memcpy(&t->data[d][m][4 * n], &acc, 4);
		}
	}
}

// cv_model_epilogue is cv_amx_epilogue in plain C (the same operations in the same
// order, so the same floats).
static void cv_model_epilogue(int R, const int32_t *acc, const int32_t *comp, const float *mult,
	const float *s, float *y, int ldy, int cols) {
	for (int r = 0; r < R; r++) {
		for (int j = 0; j < cols; j++) {
			y[(size_t)r * ldy + j] = ((float)(acc[(size_t)r * 64 + j] - comp[j]) * mult[j]) * s[r];
		}
	}
}

// cv_model_epilogue_any is the hardware kernel's epilogue where the CPU runs AVX-512F
// (so the tests check that one too), else cv_model_epilogue.
static int cv_model_avx512;
static void cv_model_epilogue_any(int R, const int32_t *acc, const int32_t *comp, const float *mult,
	const float *s, float *y, int ldy, int cols) {
	if (cv_model_avx512) {
		cv_amx_epilogue(R, acc, comp, mult, s, y, ldy, cols);
	} else {
		cv_model_epilogue(R, acc, comp, mult, s, y, ldy, cols);
	}
}

#define CV_AMX_NAME cv_gemm_amx_model
#define CV_AMX_ATTR
#define TL_STATE cv_tiles tl_state_;
#define TL_CONFIG(cfg) cv_model_config(&tl_state_, cfg)
#define TL_ZERO(t) memset(tl_state_.data[t], 0, sizeof tl_state_.data[t])
#define TL_LOAD(t, base, stride) cv_model_load(&tl_state_, t, base, stride)
#define TL_DPBUSD(d, a, b) cv_model_dpbusd(&tl_state_, d, a, b)
#define TL_STORE(t, base, stride) cv_model_store(&tl_state_, t, base, stride)
#define TL_RELEASE() (cv_amx_model_bad |= tl_state_.bad)
#define TL_EPILOGUE cv_model_epilogue_any
static int cv_amx_model_bad;
#include "int8gemm_amx_body.h"

// cv_i8_linear_amx_model is MatMul through cv_gemm_amx_model on the calling thread (the
// activation codes and column sums as the AMX path has them). It returns EINVAL when K
// is not a multiple of 64 and EFAULT when the kernel broke a tile shape rule.
int cv_i8_linear_amx_model(const cv_i8w *p, const float *x, int M, float *y, int plain_epilogue) {
	if (p == NULL || x == NULL || y == NULL || M < 1 || p->kp % 64 != 0) {
		return EINVAL;
	}
	size_t qbytes = ((size_t)M * p->kp + 63) & ~(size_t)63;
	char *scratch = cv_alloc(qbytes + sizeof(float) * (size_t)M);
	if (scratch == NULL) {
		return ENOMEM;
	}
	cv_call c = {.w = p, .x = x, .y = y, .m = M, .isa = CV_PORTABLE, .off = 0x80, .q = (int8_t *)scratch,
		.s = (float *)(scratch + qbytes)};
	cv_quant(&c, 0, M);
	cv_amx_model_bad = 0;
	cv_model_avx512 = !plain_epilogue && cv_cpu_has(CV_CPU_AVX512F);
	cv_gemm_amx_model(&c, 0, M, 0, p->np / CV_PANEL, p->np / CV_PANEL);
	free(scratch);
	return cv_amx_model_bad ? EFAULT : 0;
}

// cv_amx_selftest runs cv_gemm_amx in a forked child on a small problem and reports
// whether it exits cleanly with the VNNI kernel's outputs. The child runs only this
// C code on memory set up before the fork, then _exits.
static int cv_amx_selftest(void) {
	enum { K = 128, N = 2 * CV_PANEL, M = 20 };
	// Random bytes are as good weights as any, already in the packed layout.
	int8_t *packed = cv_alloc((size_t)K * N);
	float *scale = malloc(sizeof(float) * N), *x = malloc(sizeof(float) * M * K);
	float *want = malloc(sizeof(float) * M * N), *got = malloc(sizeof(float) * M * N);
	char *q = cv_alloc((size_t)M * K + sizeof(float) * M);
	cv_i8w *pw = NULL;
	int ok = 0;
	if (packed == NULL || scale == NULL || x == NULL || want == NULL || got == NULL || q == NULL) {
		goto out;
	}
	unsigned seed = 12345;
	for (int i = 0; i < K * N; i++) {
		seed = seed * 1103515245u + 12345u;
		packed[i] = (int8_t)(seed >> 16);
	}
	for (int i = 0; i < N; i++) {
		scale[i] = 0.01f * (float)(i % 7 + 1);
	}
	for (int i = 0; i < M * K; i++) {
		seed = seed * 1103515245u + 12345u;
		x[i] = (float)((int)(seed >> 16) % 2001 - 1000) / 250.0f;
	}
	if ((pw = cv_i8w_wrap(packed, (int64_t)K * N, scale, K, N, 0)) == NULL) {
		goto out;
	}
	cv_call call = {.w = pw, .x = x, .y = want, .m = M, .isa = CV_VNNI, .off = 0x80,
		.q = (int8_t *)q, .s = (float *)(q + (size_t)M * K)};
	cv_quant(&call, 0, M);
	cv_gemm(&call, 0, M, 0, pw->np / CV_PANEL, pw->np / CV_PANEL);
	pid_t pid = fork();
	if (pid == 0) {
		call.y = got;
		cv_gemm_amx(&call, 0, M, 0, pw->np / CV_PANEL, pw->np / CV_PANEL);
		_exit(memcmp(got, want, sizeof(float) * M * N) == 0 ? 0 : 1);
	}
	if (pid > 0) {
		int status = 0;
		while (waitpid(pid, &status, 0) < 0) {
			if (errno != EINTR) {
				status = -1;
				break;
			}
		}
		ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
	}
out:
	cv_i8w_free(pw);
	free(packed), free(scale), free(x), free(want), free(got), free(q);
	return ok;
}

// cv_amx_ok reports whether the AMX kernel may run here: CPU and OS support, the
// process's permission, and the self-check. It forks: call it once (cv_best_isa does).
static int cv_amx_ok(void) {
	if (getenv("CONVEYOR_NO_AMX") != NULL || !cv_cpu_has(CV_CPU_AMX | CV_CPU_AVX512F | CV_CPU_AVX512BW | CV_CPU_AVX512VNNI)) {
		return 0;
	}
	// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: the whole process may then use tiles.
	if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
		return 0;
	}
	return cv_amx_selftest();
}
