// The attention kernel for one instruction set; kernel.c includes this file once per
// set with VW, SFX and KFN defined. No include guard on purpose.

#define CV_CAT2(a, b) a##b
#define CV_CAT(a, b) CV_CAT2(a, b)
#define N(name) CV_CAT(name, SFX)

typedef float N(vf) __attribute__((vector_size(VW * 4)));
typedef float N(vfu) __attribute__((vector_size(VW * 4), aligned(4)));
typedef int32_t N(vi) __attribute__((vector_size(VW * 4)));

KFN static inline N(vf) N(load)(const float *p) { return *(const N(vfu) *)p; }
KFN static inline void N(store)(float *p, N(vf) v) { *(N(vfu) *)p = v; }
KFN static inline N(vf) N(splat)(float x) { return (N(vf)){0} + x; }

// hsum adds the lanes of v as a tree (depth log2(VW), not a VW-long chain).
KFN static inline float N(hsum)(N(vf) v) {
	float t[VW];
	memcpy(t, &v, sizeof t);
	for (int w = VW / 2; w >= 1; w /= 2) {
		for (int i = 0; i < w; i++) {
			t[i] += t[i + w];
		}
	}
	return t[0];
}

KFN static inline N(vf) N(select)(N(vi) mask, N(vf) a, N(vf) b) {
	return (N(vf))(((N(vi))a & mask) | ((N(vi))b & ~mask));
}

// halves converts n IEEE half-precision values to float32.
KFN static inline void N(halves)(float *dst, const uint16_t *src, size_t n) {
	size_t i = 0;
#if VW == 16
	for (; i + 16 <= n; i += 16) {
		_mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
	}
#elif VW == 8
	for (; i + 8 <= n; i += 8) {
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
	}
#endif
	for (; i < n; i++) {
		dst[i] = cv_half_to_float(src[i]);
	}
}

// exp of every lane (Cephes' polynomial after range reduction by ln 2; relative error
// ~1e-7). Inputs below -87.3 give 0.
KFN static inline N(vf) N(vexp)(N(vf) x) {
	N(vi) under = x < N(splat)(-87.3f);
	x = N(select)(x > N(splat)(88.3f), N(splat)(88.3f), x);
	x = N(select)(under, N(splat)(-87.3f), x);
	N(vf) fx = x * N(splat)(1.44269504088896341f) + N(splat)(0.5f);
	N(vi) n = __builtin_convertvector(fx, N(vi));
	N(vf) nf = __builtin_convertvector(n, N(vf));
	n = n + (N(vi))(nf > fx); // truncation -> floor
	nf = __builtin_convertvector(n, N(vf));
	x = x - nf * N(splat)(0.693359375f) - nf * N(splat)(-2.12194440e-4f);
	N(vf) y = N(splat)(1.9875691500e-4f);
	y = y * x + N(splat)(1.3981999507e-3f);
	y = y * x + N(splat)(8.3334519073e-3f);
	y = y * x + N(splat)(4.1665795894e-2f);
	y = y * x + N(splat)(1.6666665459e-1f);
	y = y * x + N(splat)(5.0000001201e-1f);
	y = y * x * x + x + N(splat)(1.0f);
	N(vf) pow2n = (N(vf))((n + 127) << 23);
	return N(select)(under, N(splat)(0.0f), y * pow2n);
}

KFN static inline float N(dot)(const float *a, const float *b, int n) {
	N(vf) acc0 = {0}, acc1 = {0};
	int d = 0;
	for (; d + 2 * VW <= n; d += 2 * VW) {
		acc0 += N(load)(a + d) * N(load)(b + d);
		acc1 += N(load)(a + d + VW) * N(load)(b + d + VW);
	}
	for (; d + VW <= n; d += VW) {
		acc0 += N(load)(a + d) * N(load)(b + d);
	}
	float s = N(hsum)(acc0 + acc1);
	for (; d < n; d++) {
		s += a[d] * b[d];
	}
	return s;
}

// block returns the run of block bi's keys or values for kv head kvh as float32: the
// arena's own memory for float32 arenas; for float16 arenas the run converted into buf
// (bs*D floats). Only the rows [from, to] of the block are converted.
KFN static inline const float *N(block)(const cv_params *p, const char *arena, int32_t bi, int kvh,
	int from, int to, float *buf) {
	const size_t run = (size_t)p->block_size * p->head_dim;
	const size_t first = ((size_t)bi * p->num_kv_heads + kvh) * run;
	if (p->dtype == CV_F32) {
		return (const float *)arena + first;
	}
	const uint16_t *h = (const uint16_t *)arena + first;
	const size_t lo = (size_t)from * p->head_dim, hi = (size_t)(to + 1) * p->head_dim;
	N(halves)(buf + lo, h + lo, hi - lo);
	return buf;
}

// prefetch_block prefetches block bi's run for kv head kvh into L2 (prefetcht1: a
// non-temporal hint left the run to arrive too late).
KFN static inline void N(prefetch_block)(const cv_params *p, const char *arena, int32_t bi, int kvh) {
	const size_t run = (size_t)p->block_size * p->head_dim;
	const size_t esz = p->dtype == CV_F32 ? 4 : 2;
	const char *x = arena + ((size_t)bi * p->num_kv_heads + kvh) * run * esz;
	for (size_t i = 0; i < run * esz; i += 64) {
		__builtin_prefetch(x + i, 0, 2);
	}
}

// hsum4 adds the lanes of four vectors at once: with AVX2 three horizontal adds and one
// cross-lane add give all four sums (AVX-512 first folds each vector to 8 lanes).
KFN static inline void N(hsum4)(N(vf) a, N(vf) b, N(vf) c, N(vf) d, float *ra, float *rb, float *rc, float *rd) {
#if VW == 8 || VW == 16
#if VW == 16
	__m512 a5, b5, c5, d5;
	memcpy(&a5, &a, 64), memcpy(&b5, &b, 64), memcpy(&c5, &c, 64), memcpy(&d5, &d, 64);
#define CV_FOLD(x) _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)))
	__m256 a8 = CV_FOLD(a5), b8 = CV_FOLD(b5), c8 = CV_FOLD(c5), d8 = CV_FOLD(d5);
#undef CV_FOLD
#else
	__m256 a8, b8, c8, d8;
	memcpy(&a8, &a, 32), memcpy(&b8, &b, 32), memcpy(&c8, &c, 32), memcpy(&d8, &d, 32);
#endif
	__m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
	__m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
	float t[4];
	_mm_storeu_ps(t, r);
	*ra = t[0], *rb = t[1], *rc = t[2], *rd = t[3];
#else
	*ra = N(hsum)(a), *rb = N(hsum)(b), *rc = N(hsum)(c), *rd = N(hsum)(d);
#endif
}

// scores4 writes the dot products of q with the 4 consecutive key rows at k.
KFN static inline void N(scores4)(const float *q, const float *k, int D, float *out) {
	N(vf) s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
	int d = 0;
	for (; d + VW <= D; d += VW) {
		N(vf) qv = N(load)(q + d);
		s0 += qv * N(load)(k + d);
		s1 += qv * N(load)(k + D + d);
		s2 += qv * N(load)(k + 2 * D + d);
		s3 += qv * N(load)(k + 3 * D + d);
	}
	float r0, r1, r2, r3;
	N(hsum4)(s0, s1, s2, s3, &r0, &r1, &r2, &r3);
	for (; d < D; d++) {
		r0 += q[d] * k[d];
		r1 += q[d] * k[D + d];
		r2 += q[d] * k[2 * D + d];
		r3 += q[d] * k[3 * D + d];
	}
	out[0] = r0, out[1] = r1, out[2] = r2, out[3] = r3;
}

// weighted adds w[t] * v[t] over n consecutive value rows of D floats to o, keeping up
// to 4 vectors of o in registers across the rows.
KFN static inline void N(weighted)(float *o, const float *w, const float *v, int n, int D) {
	int d = 0;
	for (; d + 4 * VW <= D; d += 4 * VW) {
		N(vf) a0 = N(load)(o + d), a1 = N(load)(o + d + VW), a2 = N(load)(o + d + 2 * VW), a3 = N(load)(o + d + 3 * VW);
		for (int t = 0; t < n; t++) {
			N(vf) wv = N(splat)(w[t]);
			const float *row = v + (size_t)t * D + d;
			a0 += wv * N(load)(row);
			a1 += wv * N(load)(row + VW);
			a2 += wv * N(load)(row + 2 * VW);
			a3 += wv * N(load)(row + 3 * VW);
		}
		N(store)(o + d, a0), N(store)(o + d + VW, a1), N(store)(o + d + 2 * VW, a2), N(store)(o + d + 3 * VW, a3);
	}
	for (; d + VW <= D; d += VW) {
		N(vf) a = N(load)(o + d);
		for (int t = 0; t < n; t++) {
			a += N(splat)(w[t]) * N(load)(v + (size_t)t * D + d);
		}
		N(store)(o + d, a);
	}
	for (; d < D; d++) {
		float a = o[d];
		for (int t = 0; t < n; t++) {
			a += w[t] * v[(size_t)t * D + d];
		}
		o[d] = a;
	}
}

// Softmax of s[0:n] in place; returns 1/sum.
KFN static inline float N(softmax)(float *s, int n) {
	float m = s[0];
	int i = 0;
	if (n >= VW) {
		N(vf) mx = N(load)(s);
		for (i = VW; i + VW <= n; i += VW) {
			const N(vf) x = N(load)(s + i);
			mx = N(select)(x > mx, x, mx);
		}
		float t[VW];
		memcpy(t, &mx, sizeof t);
		for (int j = 0; j < VW; j++) {
			m = t[j] > m ? t[j] : m;
		}
	}
	for (; i < n; i++) {
		m = s[i] > m ? s[i] : m;
	}
	N(vf) mv = N(splat)(m), sumv = {0};
	i = 0;
	for (; i + VW <= n; i += VW) {
		N(vf) e = N(vexp)(N(load)(s + i) - mv);
		N(store)(s + i, e);
		sumv += e;
	}
	float sum = N(hsum)(sumv);
	for (; i < n; i++) {
		s[i] = expf(s[i] - m);
		sum += s[i];
	}
	return 1.0f / sum;
}

// The decode path: an item of one token, whose G query rows all see the same keys
// [first(pos), pos]. CV_RB (N(rb)) rows at a time share every key and value load, four
// keys at a time share every query load, and the scale is applied as the four sums
// leave their registers.
#if VW == 16
enum { N(rb) = 4 };
#else
enum { N(rb) = 2 };
#endif
_Static_assert(N(rb) <= CV_TILE_ROWS, "a tile's rows must fit the scratch kept for them");

// scores_rows writes for R rows (q[r]) the scaled dot products with 4 consecutive key
// rows at k to out[r][0..3]. REQUIRES: D % VW == 0.
KFN __attribute__((always_inline)) static inline void N(scores_rows)(const int R, const float *const *q,
	const float *k, int D, float scale, float *const *out) {
	N(vf) acc[N(rb)][4];
	for (int r = 0; r < R; r++) {
		acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = (N(vf)){0};
	}
	for (int d = 0; d < D; d += VW) {
		const N(vf) k0 = N(load)(k + d), k1 = N(load)(k + D + d), k2 = N(load)(k + 2 * D + d), k3 = N(load)(k + 3 * D + d);
		for (int r = 0; r < R; r++) {
			const N(vf) qv = N(load)(q[r] + d);
			acc[r][0] += qv * k0;
			acc[r][1] += qv * k1;
			acc[r][2] += qv * k2;
			acc[r][3] += qv * k3;
		}
	}
	for (int r = 0; r < R; r++) {
		float *o = out[r];
		N(hsum4)(acc[r][0], acc[r][1], acc[r][2], acc[r][3], o, o + 1, o + 2, o + 3);
		o[0] *= scale, o[1] *= scale, o[2] *= scale, o[3] *= scale;
	}
}

// weighted_rows adds w[r][t] * v[t] over n consecutive value rows of D floats to o[r]
// for R rows, each value vector loaded once for all of them. REQUIRES: D % VW == 0.
KFN __attribute__((always_inline)) static inline void N(weighted_rows)(const int R, float *const *o,
	const float *const *w, const float *v, int n, int D) {
	int d = 0;
	for (; d + 4 * VW <= D; d += 4 * VW) {
		N(vf) a[N(rb)][4];
		for (int r = 0; r < R; r++) {
			for (int j = 0; j < 4; j++) {
				a[r][j] = N(load)(o[r] + d + j * VW);
			}
		}
		for (int t = 0; t < n; t++) {
			const float *row = v + (size_t)t * D + d;
			const N(vf) v0 = N(load)(row), v1 = N(load)(row + VW), v2 = N(load)(row + 2 * VW), v3 = N(load)(row + 3 * VW);
			for (int r = 0; r < R; r++) {
				const N(vf) wv = N(splat)(w[r][t]);
				a[r][0] += wv * v0;
				a[r][1] += wv * v1;
				a[r][2] += wv * v2;
				a[r][3] += wv * v3;
			}
		}
		for (int r = 0; r < R; r++) {
			for (int j = 0; j < 4; j++) {
				N(store)(o[r] + d + j * VW, a[r][j]);
			}
		}
	}
	for (; d < D; d += VW) {
		N(vf) a[N(rb)];
		for (int r = 0; r < R; r++) {
			a[r] = N(load)(o[r] + d);
		}
		for (int t = 0; t < n; t++) {
			const N(vf) vv = N(load)(v + (size_t)t * D + d);
			for (int r = 0; r < R; r++) {
				a[r] += N(splat)(w[r][t]) * vv;
			}
		}
		for (int r = 0; r < R; r++) {
			N(store)(o[r] + d, a[r]);
		}
	}
}

// weighted_block adds, for rows [0, rows) of w ([rows] with stride ws: each row's
// weights for this block's keys), the weighted n value rows at vb to acc ([rows][D]),
// N(rb) rows per value load. REQUIRES: D % VW == 0.
KFN static void N(weighted_block)(float *acc, const float *w0, int rows, int ws, const float *vb, int n, int D) {
	for (int r0 = 0; r0 < rows; r0 += N(rb)) {
		const int R = rows - r0 < N(rb) ? rows - r0 : N(rb);
		float *o[N(rb)];
		const float *w[N(rb)];
		for (int r = 0; r < R; r++) {
			o[r] = acc + (size_t)(r0 + r) * D;
			w[r] = w0 + (size_t)(r0 + r) * ws;
		}
		switch (R) {
#if VW == 16
		case 4:
			N(weighted_rows)(4, o, w, vb, n, D);
			break;
		case 3:
			N(weighted_rows)(3, o, w, vb, n, D);
			break;
#endif
		case 2:
			N(weighted_rows)(2, o, w, vb, n, D);
			break;
		default:
			N(weighted_rows)(1, o, w, vb, n, D);
		}
	}
}

// store_rows writes an item's rows: row r (token r / group, query head r % group of
// kv head kvh) is acc[r] · inv[r].
KFN static void N(store_rows)(const cv_params *p, float *att, const float *acc, const float *inv, int rows, int row, int kvh) {
	const int D = p->head_dim, G = p->group;
	for (int r = 0; r < rows; r++) {
		float *out = att + (size_t)(row + r / G) * p->att_stride + (size_t)(kvh * G + r % G) * D;
		const float *o = acc + (size_t)r * D;
		int d = 0;
		const N(vf) iv = N(splat)(inv[r]);
		for (; d + VW <= D; d += VW) {
			N(store)(out + d, N(load)(o + d) * iv);
		}
		for (; d < D; d++) {
			out[d] = o[d] * inv[r];
		}
	}
}

// decode_scores computes rows [r0, r0+R) against the keys [a, b] of one block (kb: key
// a's row): four keys at a time, then one by one.
KFN __attribute__((always_inline)) static inline void N(decode_scores)(const int R, const float *const *q,
	const float *kb, int a, int b, int D, float scale, float *const *s) {
	float *out[N(rb)];
	int t = a;
	for (; t + 3 <= b; t += 4) {
		for (int r = 0; r < R; r++) {
			out[r] = s[r] + (t - a);
		}
		N(scores_rows)(R, q, kb + (size_t)(t - a) * D, D, scale, out);
	}
	for (; t <= b; t++) {
		for (int r = 0; r < R; r++) {
			s[r][t - a] = N(dot)(q[r], kb + (size_t)(t - a) * D, D) * scale;
		}
	}
}

// attend_decode computes a decode item (see above). REQUIRES: one token, D % VW == 0.
KFN static void N(attend_decode)(const cv_params *p, const char *karena, const char *varena,
	const int32_t *tables, const int32_t *it, const float *qkv, float *att, float *scratch) {
	const int D = p->head_dim, G = p->group, bs = p->block_size;
	const int32_t *table = tables + it[CV_ITEM_TABLE];
	const int kvh = it[CV_ITEM_KVHEAD], pos = it[CV_ITEM_POS], row = it[CV_ITEM_ROW];
	const int lo = cv_first_key(p, pos);
	const int span = pos - lo + 1;
	float *scores = scratch;                    // [G][span]
	float *acc = scratch + (size_t)G * span;    // [G][D]
	float *conv = acc + (size_t)G * D;          // [bs][D]: a float16 block converted
	const float *qrow = qkv + (size_t)row * p->qkv_stride + (size_t)kvh * G * D;

	for (int t0 = lo; t0 <= pos;) {
		const int bi = t0 / bs;
		const int t1 = (bi + 1) * bs - 1 < pos ? (bi + 1) * bs - 1 : pos;
		const float *kb = N(block)(p, karena, table[bi], kvh, t0 - bi * bs, t1 - bi * bs, conv) + (size_t)(t0 - bi * bs) * D;
		// The past comes from memory (every layer's is far larger than the caches): ask
		// for the next block's keys, and for this block's values (read after the
		// softmax), while this block's scores are computed.
		if (t1 < pos) {
			N(prefetch_block)(p, karena, table[bi + 1], kvh);
		}
		N(prefetch_block)(p, varena, table[bi], kvh);
		for (int r0 = 0; r0 < G; r0 += N(rb)) {
			const int R = G - r0 < N(rb) ? G - r0 : N(rb);
			const float *q[N(rb)];
			float *s[N(rb)];
			for (int r = 0; r < R; r++) {
				q[r] = qrow + (size_t)(r0 + r) * D;
				s[r] = scores + (size_t)(r0 + r) * span + (t0 - lo);
			}
			switch (R) {
#if VW == 16
			case 4:
				N(decode_scores)(4, q, kb, t0, t1, D, p->scale, s);
				break;
			case 3:
				N(decode_scores)(3, q, kb, t0, t1, D, p->scale, s);
				break;
#endif
			case 2:
				N(decode_scores)(2, q, kb, t0, t1, D, p->scale, s);
				break;
			default:
				N(decode_scores)(1, q, kb, t0, t1, D, p->scale, s);
			}
		}
		t0 = t1 + 1;
	}
	float inv[G];
	for (int r = 0; r < G; r++) {
		float *s = scores + (size_t)r * span;
		if (p->softcap > 0) {
			for (int t = 0; t < span; t++) {
				s[t] = p->softcap * tanhf(s[t] / p->softcap);
			}
		}
		inv[r] = N(softmax)(s, span);
	}

	memset(acc, 0, sizeof(float) * (size_t)G * D);
	for (int t0 = lo; t0 <= pos;) {
		const int bi = t0 / bs;
		const int t1 = (bi + 1) * bs - 1 < pos ? (bi + 1) * bs - 1 : pos;
		const float *vb = N(block)(p, varena, table[bi], kvh, t0 - bi * bs, t1 - bi * bs, conv) + (size_t)(t0 - bi * bs) * D;
		N(weighted_block)(acc, scores + (t0 - lo), G, span, vb, t1 - t0 + 1, D);
		t0 = t1 + 1;
	}
	N(store_rows)(p, att, acc, inv, G, row, kvh);
}

// tile_rows writes R rows' scores (q[r]·k, unscaled) against the KT keys of a
// transposed tile kt ([D][KT], KT a multiple of VW) to tb[r][KT]: four key vectors at
// a time, so each broadcast query element feeds four products and each key vector R.
KFN __attribute__((always_inline)) static inline void N(tile_rows)(const int R, const float *const *q,
	const float *kt, int KT, int D, float *tb) {
	int kc = 0;
	for (; kc + 4 * VW <= KT; kc += 4 * VW) {
		N(vf) acc[N(rb)][4];
		for (int r = 0; r < R; r++) {
			acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = (N(vf)){0};
		}
		for (int d = 0; d < D; d++) {
			const float *col = kt + (size_t)d * KT + kc;
			const N(vf) k0 = N(load)(col), k1 = N(load)(col + VW), k2 = N(load)(col + 2 * VW), k3 = N(load)(col + 3 * VW);
			for (int r = 0; r < R; r++) {
				const N(vf) qd = N(splat)(q[r][d]);
				acc[r][0] += qd * k0;
				acc[r][1] += qd * k1;
				acc[r][2] += qd * k2;
				acc[r][3] += qd * k3;
			}
		}
		for (int r = 0; r < R; r++) {
			for (int j = 0; j < 4; j++) {
				N(store)(tb + (size_t)r * KT + kc + j * VW, acc[r][j]);
			}
		}
	}
	for (; kc < KT; kc += VW) {
		N(vf) acc[N(rb)];
		for (int r = 0; r < R; r++) {
			acc[r] = (N(vf)){0};
		}
		for (int d = 0; d < D; d++) {
			const N(vf) k = N(load)(kt + (size_t)d * KT + kc);
			for (int r = 0; r < R; r++) {
				acc[r] += N(splat)(q[r][d]) * k;
			}
		}
		for (int r = 0; r < R; r++) {
			N(store)(tb + (size_t)r * KT + kc, acc[r]);
		}
	}
}

// attend_rows computes an item of many query rows (a prompt chunk; see CV_TRANSPOSE_ROWS).
// Scores: the item's keys CV_KTILE at a time are transposed into kt, and every row's
// scores against the tile are small matrix products (tile_rows), computed for the whole
// tile and kept for the keys the row may see. Each row's scores outside its keys are
// then set to zero after its softmax, so that the weighted values take N(rb) rows at a
// time over the same keys, each value vector loaded once for all of them.
KFN static void N(attend_rows)(const cv_params *p, const char *karena, const char *varena,
	const int32_t *tables, const int32_t *it, const float *qkv, float *att, float *scratch) {
	const int D = p->head_dim, G = p->group, bs = p->block_size;
	const int32_t *table = tables + it[CV_ITEM_TABLE];
	const int kvh = it[CV_ITEM_KVHEAD], pos = it[CV_ITEM_POS], ntok = it[CV_ITEM_TOKENS], row = it[CV_ITEM_ROW];
	const int rows = ntok * G;
	const int last = pos + ntok - 1;
	const int lo = cv_first_key(p, pos);
	const int span = last - lo + 1;
	float *scores = scratch;                        // [rows][span]
	float *acc = scores + (size_t)rows * span;      // [rows][D]
	float *kt = acc + (size_t)rows * D;             // [D][CV_KTILE]: a tile of keys transposed
	float *tb = kt + (size_t)D * CV_KTILE;          // [CV_TILE_ROWS][CV_KTILE]: rows' tile scores
	float *conv = tb + (size_t)CV_TILE_ROWS * CV_KTILE; // [bs][D]: a float16 block converted
	float inv[rows];

	for (int u0 = lo; u0 <= last; u0 += CV_KTILE) {
		const int u1 = u0 + CV_KTILE - 1 < last ? u0 + CV_KTILE - 1 : last;
		const int n = u1 - u0 + 1, KT = (n + VW - 1) / VW * VW;
		for (int t0 = u0; t0 <= u1;) {
			const int bi = t0 / bs;
			const int t1 = (bi + 1) * bs - 1 < u1 ? (bi + 1) * bs - 1 : u1;
			const float *kb = N(block)(p, karena, table[bi], kvh, t0 - bi * bs, t1 - bi * bs, conv) + (size_t)(t0 - bi * bs) * D;
			if (t1 < last) {
				N(prefetch_block)(p, karena, table[bi + 1], kvh);
			}
			for (int t = t0; t <= t1; t++) {
				const float *k = kb + (size_t)(t - t0) * D;
				for (int d = 0; d < D; d++) {
					kt[(size_t)d * KT + (t - u0)] = k[d];
				}
			}
			t0 = t1 + 1;
		}
		for (int d = 0; d < D; d++) {
			for (int i = n; i < KT; i++) {
				kt[(size_t)d * KT + i] = 0;
			}
		}
		for (int r0 = 0; r0 < rows; r0 += N(rb)) {
			const int R = rows - r0 < N(rb) ? rows - r0 : N(rb);
			const float *q[N(rb)];
			for (int r = 0; r < R; r++) {
				const int j = (r0 + r) / G, g = (r0 + r) % G;
				q[r] = qkv + (size_t)(row + j) * p->qkv_stride + (size_t)(kvh * G + g) * D;
			}
			switch (R) {
#if VW == 16
			case 4:
				N(tile_rows)(4, q, kt, KT, D, tb);
				break;
			case 3:
				N(tile_rows)(3, q, kt, KT, D, tb);
				break;
#endif
			case 2:
				N(tile_rows)(2, q, kt, KT, D, tb);
				break;
			default:
				N(tile_rows)(1, q, kt, KT, D, tb);
			}
			for (int r = 0; r < R; r++) {
				memcpy(scores + (size_t)(r0 + r) * span + (u0 - lo), tb + (size_t)r * KT, sizeof(float) * (size_t)n);
			}
		}
	}
	for (int r = 0; r < rows; r++) {
		const int qpos = pos + r / G;
		const int a = cv_first_key(p, qpos) - lo, b = qpos - lo;
		float *s = scores + (size_t)r * span;
		int t = a;
		if (p->softcap > 0) {
			for (; t <= b; t++) {
				s[t] = p->softcap * tanhf(s[t] * p->scale / p->softcap);
			}
		} else {
			const N(vf) sc = N(splat)(p->scale);
			for (; t + VW <= b + 1; t += VW) {
				N(store)(s + t, N(load)(s + t) * sc);
			}
			for (; t <= b; t++) {
				s[t] *= p->scale;
			}
		}
		inv[r] = N(softmax)(s + a, b - a + 1);
		memset(s, 0, sizeof(float) * (size_t)a);
		memset(s + b + 1, 0, sizeof(float) * (size_t)(span - b - 1));
	}

	memset(acc, 0, sizeof(float) * (size_t)rows * D);
	for (int t0 = lo; t0 <= last;) {
		const int bi = t0 / bs;
		const int t1 = (bi + 1) * bs - 1 < last ? (bi + 1) * bs - 1 : last;
		const float *vb = N(block)(p, varena, table[bi], kvh, t0 - bi * bs, t1 - bi * bs, conv) + (size_t)(t0 - bi * bs) * D;
		if (t1 < last) {
			N(prefetch_block)(p, varena, table[bi + 1], kvh);
		}
		if (D % VW != 0) {
			for (int r = 0; r < rows; r++) {
				N(weighted)(acc + (size_t)r * D, scores + (size_t)r * span + (t0 - lo), vb, t1 - t0 + 1, D);
			}
			t0 = t1 + 1;
			continue;
		}
		N(weighted_block)(acc, scores + (t0 - lo), rows, span, vb, t1 - t0 + 1, D);
		t0 = t1 + 1;
	}
	N(store_rows)(p, att, acc, inv, rows, row, kvh);
}

// attend_item computes one work item (see CV_ITEM_*). Query row r = j*group + g is
// token j's query head kv_head*group + g; it sees keys [first(j), pos+j] where first
// honours the sliding window. Scores for all rows are kept in scratch over the item's
// key span, so each K and V row is read from its block once per item.
KFN static void N(attend_item)(const cv_params *p, const char *karena, const char *varena,
	const int32_t *tables, const int32_t *it, const float *qkv, float *att, float *scratch) {
	const int D = p->head_dim, G = p->group, bs = p->block_size;
	const int32_t *table = tables + it[CV_ITEM_TABLE];
	const int kvh = it[CV_ITEM_KVHEAD], pos = it[CV_ITEM_POS], ntok = it[CV_ITEM_TOKENS], row = it[CV_ITEM_ROW];
	if (ntok == 1 && D % VW == 0) {
		N(attend_decode)(p, karena, varena, tables, it, qkv, att, scratch);
		return;
	}
	if (ntok * G >= CV_TRANSPOSE_ROWS) {
		N(attend_rows)(p, karena, varena, tables, it, qkv, att, scratch);
		return;
	}
	const int rows = ntok * G;
	const int last = pos + ntok - 1;
	const int lo = cv_first_key(p, pos);
	const int span = last - lo + 1;
	float *scores = scratch;                   // [rows][span]
	float *acc = scratch + (size_t)rows * span; // [rows][D]
	float *conv = acc + (size_t)rows * D;       // [bs][D]: a float16 block converted
	float inv[rows];

	// Scores, key block by key block.
	for (int t0 = lo; t0 <= last;) {
		const int bi = t0 / bs;
		const int t1 = (bi + 1) * bs - 1 < last ? (bi + 1) * bs - 1 : last;
		const float *kblock = N(block)(p, karena, table[bi], kvh, t0 % bs, t1 % bs, conv);
		if (t1 < last) {
			N(prefetch_block)(p, karena, table[bi + 1], kvh);
		}
		for (int r = 0; r < rows; r++) {
			const int j = r / G, g = r % G;
			const int qpos = pos + j;
			const int first = cv_first_key(p, qpos);
			const int a = t0 > first ? t0 : first, b = t1 < qpos ? t1 : qpos;
			const float *q = qkv + (size_t)(row + j) * p->qkv_stride + (size_t)(kvh * G + g) * D;
			float *s = scores + (size_t)r * span;
			int t = a;
			for (; t + 3 <= b; t += 4) {
				N(scores4)(q, kblock + (size_t)(t % bs) * D, D, s + (t - lo));
			}
			for (; t <= b; t++) {
				s[t - lo] = N(dot)(q, kblock + (size_t)(t % bs) * D, D);
			}
		}
		if (p->scale != 1.0f || p->softcap > 0) {
			for (int r = 0; r < rows; r++) {
				const int qpos = pos + r / G;
				const int first = cv_first_key(p, qpos);
				const int a = t0 > first ? t0 : first, b = t1 < qpos ? t1 : qpos;
				float *s = scores + (size_t)r * span;
				for (int t = a; t <= b; t++) {
					float x = s[t - lo] * p->scale;
					if (p->softcap > 0) {
						x = p->softcap * tanhf(x / p->softcap);
					}
					s[t - lo] = x;
				}
			}
		}
		t0 = t1 + 1;
	}
	for (int r = 0; r < rows; r++) {
		const int qpos = pos + r / G;
		const int first = cv_first_key(p, qpos);
		inv[r] = N(softmax)(scores + (size_t)r * span + (first - lo), qpos - first + 1);
	}

	// Weighted values, block by block.
	memset(acc, 0, sizeof(float) * (size_t)rows * D);
	for (int t0 = lo; t0 <= last;) {
		const int bi = t0 / bs;
		const int t1 = (bi + 1) * bs - 1 < last ? (bi + 1) * bs - 1 : last;
		const float *vblock = N(block)(p, varena, table[bi], kvh, t0 % bs, t1 % bs, conv);
		if (t1 < last) {
			N(prefetch_block)(p, varena, table[bi + 1], kvh);
		}
		for (int r = 0; r < rows; r++) {
			const int qpos = pos + r / G;
			const int first = cv_first_key(p, qpos);
			const int a = t0 > first ? t0 : first, b = t1 < qpos ? t1 : qpos;
			const float *s = scores + (size_t)r * span;
			float *o = acc + (size_t)r * D;
			N(weighted)(o, s + (a - lo), vblock + (size_t)(a % bs) * D, b - a + 1, D);
		}
		t0 = t1 + 1;
	}
	N(store_rows)(p, att, acc, inv, rows, row, kvh);
}

#undef N
#undef CV_CAT
#undef CV_CAT2
