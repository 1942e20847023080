// One work item's attention for one instruction set; pagedattn.c includes this file once
// per set with VW (lanes of a float vector), SFX (a name suffix) and KFN (the function
// attributes that select the set) defined. No include guard on purpose.

#define CV_PA_CAT2(a, b) a##b
#define CV_PA_CAT(a, b) CV_PA_CAT2(a, b)
#define N(name) CV_PA_CAT(name, SFX)

typedef float N(vf) __attribute__((vector_size(VW * 4)));
typedef float N(vfu) __attribute__((vector_size(VW * 4), aligned(4)));
typedef int32_t N(vi) __attribute__((vector_size(VW * 4)));

KFN static inline N(vf) N(load)(const float *p) { return *(const N(vfu) *)p; }
KFN static inline void N(store)(float *p, N(vf) v) { *(N(vfu) *)p = v; }
KFN static inline N(vf) N(splat)(float x) { return (N(vf)){0} + x; }

// hsum adds the lanes of v pairwise.
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

// vexp is e^x in every lane, by simd.h's exp rule.
CV_VEXP(N(vexp), N(vf), N(vi), KFN)

// ld returns VW floats of a cache row from element i of p: float32, or IEEE halves
// converted in registers when half.
KFN static inline __attribute__((always_inline)) N(vf) N(ld)(const void *p, int64_t i, int half) {
	if (!half) {
		return N(load)((const float *)p + i);
	}
#if VW == 16
	return (N(vf))_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
#elif VW == 8
	return (N(vf))_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
#else
	N(vf) v;
	for (int j = 0; j < VW; j++) {
		v[j] = cv_half_to_float(((const uint16_t *)p)[i + j]);
	}
	return v;
#endif
}

// ld1 returns element i of a cache row p as a float.
KFN static inline __attribute__((always_inline)) float N(ld1)(const void *p, int64_t i, int half) {
	return half ? cv_half_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

// dot returns a·b over n values, b a cache row.
KFN static inline __attribute__((always_inline)) float N(dot)(const float *restrict a, const void *restrict b, int n,
	int half) {
	N(vf) s0 = {0}, s1 = {0};
	int d = 0;
	for (; d + 2 * VW <= n; d += 2 * VW) {
		s0 += N(load)(a + d) * N(ld)(b, d, half);
		s1 += N(load)(a + d + VW) * N(ld)(b, d + VW, half);
	}
	for (; d + VW <= n; d += VW) {
		s0 += N(load)(a + d) * N(ld)(b, d, half);
	}
	float s = N(hsum)(s0 + s1);
	for (; d < n; d++) {
		s += a[d] * N(ld1)(b, d, half);
	}
	return s;
}

// The lane masks that pick a pair of vectors' even and odd lanes, concatenated.
#if VW == 4
#define CV_PA_EVEN {0, 2, 4, 6}
#define CV_PA_ODD {1, 3, 5, 7}
#elif VW == 8
#define CV_PA_EVEN {0, 2, 4, 6, 8, 10, 12, 14}
#define CV_PA_ODD {1, 3, 5, 7, 9, 11, 13, 15}
#elif VW == 16
#define CV_PA_EVEN {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}
#define CV_PA_ODD {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}
#endif

// pairsum adds a's and b's lanes in adjacent pairs: the first half of the result holds
// a's pair sums, the second half b's.
KFN static inline N(vf) N(pairsum)(N(vf) a, N(vf) b) {
	return __builtin_shuffle(a, b, (N(vi))CV_PA_EVEN) + __builtin_shuffle(a, b, (N(vi))CV_PA_ODD);
}

// scores sets s[i] = q·k_i for n keys k_i = k + i·ks (elements) of D values, float32
// or halves. VW keys at a time share each load of q, one accumulator per key, and the VW
// accumulators are summed into one vector of the VW scores by log2(VW) rounds of pairsum
// (lane i of the result is key i's sum): no horizontal sum per key. The keys past the
// last VW, and a head's values past the last VW, go through dot and scalar sums.
KFN static inline __attribute__((always_inline)) void N(scores)(const float *restrict q, const void *restrict k,
	int64_t ks, int n, int D, float *restrict s, int half) {
	const int Dv = D - D % VW;
	const int64_t es = half ? 2 : 4;
	const char *kb = k;
	int i = 0;
	for (; i + VW <= n; i += VW) {
		N(vf) a[VW];
#pragma GCC unroll 16
		for (int j = 0; j < VW; j++) {
			a[j] = (N(vf)){0};
		}
		for (int d = 0; d < Dv; d += VW) {
			const N(vf) qv = N(load)(q + d);
#pragma GCC unroll 16
			for (int j = 0; j < VW; j++) {
				a[j] += qv * N(ld)(kb + (i + j) * ks * es, d, half);
			}
		}
#pragma GCC unroll 8
		for (int w = VW; w > 1; w /= 2) {
#pragma GCC unroll 8
			for (int j = 0; j < w / 2; j++) {
				a[j] = N(pairsum)(a[2 * j], a[2 * j + 1]);
			}
		}
		N(store)(s + i, a[0]);
		for (int j = 0; j < VW && Dv < D; j++) {
			float t = 0;
			for (int d = Dv; d < D; d++) {
				t += q[d] * N(ld1)(kb + (i + j) * ks * es, d, half);
			}
			s[i + j] += t;
		}
	}
	for (; i < n; i++) {
		s[i] = N(dot)(q, kb + i * ks * es, D, half);
	}
}

#undef CV_PA_EVEN
#undef CV_PA_ODD

// weigh adds w[0]·v_0 + ... + w[n-1]·v_(n-1) to acc over D values, v_i = v + i·stride
// (elements), float32 or halves: a run of acc stays in registers while the n rows of v
// stream past it.
KFN static inline __attribute__((always_inline)) void N(weigh)(float *restrict acc, const float *restrict w,
	const void *restrict v, int64_t stride, int n, int D, int half) {
	const int64_t es = half ? 2 : 4;
	const char *vb = v;
	int d = 0;
	for (; d + 4 * VW <= D; d += 4 * VW) {
		N(vf) a0 = N(load)(acc + d), a1 = N(load)(acc + d + VW), a2 = N(load)(acc + d + 2 * VW), a3 = N(load)(acc + d + 3 * VW);
		for (int i = 0; i < n; i++) {
			const char *vi = vb + i * stride * es;
			const N(vf) wi = N(splat)(w[i]);
			a0 += wi * N(ld)(vi, d, half);
			a1 += wi * N(ld)(vi, d + VW, half);
			a2 += wi * N(ld)(vi, d + 2 * VW, half);
			a3 += wi * N(ld)(vi, d + 3 * VW, half);
		}
		N(store)(acc + d, a0);
		N(store)(acc + d + VW, a1);
		N(store)(acc + d + 2 * VW, a2);
		N(store)(acc + d + 3 * VW, a3);
	}
	for (; d + VW <= D; d += VW) {
		N(vf) a0 = N(load)(acc + d);
		for (int i = 0; i < n; i++) {
			a0 += N(splat)(w[i]) * N(ld)(vb + i * stride * es, d, half);
		}
		N(store)(acc + d, a0);
	}
	for (; d < D; d++) {
		float a = acc[d];
		for (int i = 0; i < n; i++) {
			a += w[i] * N(ld1)(vb + i * stride * es, d, half);
		}
		acc[d] = a;
	}
}

// prefetch asks for n rows of bytes bytes, stride bytes apart, in L2.
KFN static inline void N(prefetch)(const char *p, int64_t stride, int n, int64_t bytes) {
	for (int i = 0; i < n; i++) {
		const char *row = p + i * stride;
		for (int64_t b = 0; b < bytes; b += 64) {
			__builtin_prefetch(row + b, 0, 2);
		}
	}
}

// halves converts n IEEE half-precision values to float32.
KFN static inline void N(halves)(float *restrict dst, const uint16_t *restrict src, int n) {
	int i = 0;
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

// softcap replaces each of s[0..n) by cap·tanh(s/cap), tanh(y) = 1 - 2/(e^2y + 1).
KFN static inline void N(softcap)(float *s, int n, float cap) {
	const float k = 2.0f / cap;
	int i = 0;
	for (; i + VW <= n; i += VW) {
		const N(vf) e = N(vexp)(N(load)(s + i) * N(splat)(k));
		N(store)(s + i, N(splat)(cap) - N(splat)(2.0f * cap) / (e + N(splat)(1.0f)));
	}
	for (; i < n; i++) {
		s[i] = cap * tanhf(s[i] / cap);
	}
}

// exp_sum replaces each of s[0..n) by e^(s-m) and returns their sum.
KFN static inline float N(exp_sum)(float *s, int n, float m) {
	N(vf) acc = {0};
	int i = 0;
	for (; i + VW <= n; i += VW) {
		const N(vf) e = N(vexp)(N(load)(s + i) - N(splat)(m));
		N(store)(s + i, e);
		acc += e;
	}
	float sum = N(hsum)(acc);
	for (; i < n; i++) {
		s[i] = cv_expf(s[i] - m);
		sum += s[i];
	}
	return sum;
}

// run finds the run of rows from position a (below hi) that lie one stride apart in the
// cache: the key (value = 0) or value (value = 1) rows of KV head kvh, which end with
// their block. It sets *p to the run's first row and returns the position past the run.
KFN static inline int64_t N(run)(const cv_pa_args *x, const int32_t *bt, int kvh, int64_t a, int64_t hi, int value,
	const void **p) {
	const int64_t D = x->g.head_dim, kvw = x->a.kv_num_heads * D, bs = x->g.block_size;
	const char *cache = (const char *)(value ? x->value_cache : x->key_cache);
	*p = cache + (((int64_t)bt[a / bs] * bs + a % bs) * kvw + (int64_t)kvh * D) * (x->cache_half ? 2 : 4);
	const int64_t e = (a / bs + 1) * bs;
	return e < hi ? e : hi;
}

// tilerun finds the run of rows from position a (below hi) of the tile that starts at pos
// that lie one stride apart: the key (value = 0) or value (value = 1) rows of the item's
// KV head hh (cache head kvh) of nh. A half cache's tile is one run in tile (converted,
// nh heads of D floats per position); a float32 cache's runs end with their block. It
// sets *p to the run's first row and *stride, and returns the position past the run.
KFN static inline int64_t N(tilerun)(const cv_pa_args *x, const int32_t *bt, int kvh, int hh, int nh, int64_t pos,
	int64_t a, int64_t hi, const float *tile, int value, const float **p, int64_t *stride) {
	const int64_t D = x->g.head_dim, kvw = x->a.kv_num_heads * D, bs = x->g.block_size;
	if (x->cache_half) {
		*p = tile + ((a - pos) * nh + hh) * D, *stride = nh * D;
		return hi;
	}
	const float *cache = (const float *)(value ? x->value_cache : x->key_cache);
	*p = cache + ((int64_t)bt[a / bs] * bs + a % bs) * kvw + (int64_t)kvh * D, *stride = kvw;
	const int64_t e = (a / bs + 1) * bs;
	return e < hi ? e : hi;
}

// scores2 sets s0[i] = q0·k_i and s1[i] = q1·k_i for n keys k_i = k + i·ks (elements):
// two query rows share each load of a key. VW/2 keys at a time, one accumulator per
// (row, key), summed into one vector by pairsum rounds (lanes 0..VW/2-1 row 0's scores,
// the rest row 1's).
KFN static inline __attribute__((always_inline)) void N(scores2)(const float *restrict q0, const float *restrict q1,
	const void *restrict k, int64_t ks, int n, int D, float *restrict s0, float *restrict s1, int half) {
	enum { KG = VW / 2 };
	const int Dv = D - D % VW;
	const int64_t es = half ? 2 : 4;
	const char *kb = k;
	int i = 0;
	for (; i + KG <= n && Dv == D; i += KG) {
		N(vf) a[VW];
#pragma GCC unroll 16
		for (int j = 0; j < VW; j++) {
			a[j] = (N(vf)){0};
		}
		for (int d = 0; d < D; d += VW) {
			const N(vf) qa = N(load)(q0 + d), qb = N(load)(q1 + d);
#pragma GCC unroll 8
			for (int j = 0; j < KG; j++) {
				const N(vf) kv = N(ld)(kb + (i + j) * ks * es, d, half);
				a[j] += qa * kv;
				a[KG + j] += qb * kv;
			}
		}
#pragma GCC unroll 8
		for (int w = VW; w > 1; w /= 2) {
#pragma GCC unroll 8
			for (int j = 0; j < w / 2; j++) {
				a[j] = N(pairsum)(a[2 * j], a[2 * j + 1]);
			}
		}
		float t[VW];
		memcpy(t, &a[0], sizeof t);
		memcpy(s0 + i, t, KG * sizeof(float));
		memcpy(s1 + i, t + KG, KG * sizeof(float));
	}
	for (; i < n; i++) {
		s0[i] = N(dot)(q0, kb + i * ks * es, D, half);
		s1[i] = N(dot)(q1, kb + i * ks * es, D, half);
	}
}

// weigh2 is weigh for two rows: acc0 += Σ w0[i]·v_i and acc1 += Σ w1[i]·v_i, sharing
// each load of v_i.
KFN static inline __attribute__((always_inline)) void N(weigh2)(float *restrict acc0, float *restrict acc1,
	const float *restrict w0, const float *restrict w1, const void *restrict v, int64_t stride, int n, int D,
	int half) {
	const int64_t es = half ? 2 : 4;
	const char *vb = v;
	int d = 0;
	for (; d + 4 * VW <= D; d += 4 * VW) {
		N(vf) a0 = N(load)(acc0 + d), a1 = N(load)(acc0 + d + VW), a2 = N(load)(acc0 + d + 2 * VW),
		      a3 = N(load)(acc0 + d + 3 * VW);
		N(vf) b0 = N(load)(acc1 + d), b1 = N(load)(acc1 + d + VW), b2 = N(load)(acc1 + d + 2 * VW),
		      b3 = N(load)(acc1 + d + 3 * VW);
		for (int i = 0; i < n; i++) {
			const char *vi = vb + i * stride * es;
			const N(vf) x = N(splat)(w0[i]), y = N(splat)(w1[i]);
			const N(vf) v0 = N(ld)(vi, d, half), v1 = N(ld)(vi, d + VW, half), v2 = N(ld)(vi, d + 2 * VW, half),
				    v3 = N(ld)(vi, d + 3 * VW, half);
			a0 += x * v0, a1 += x * v1, a2 += x * v2, a3 += x * v3;
			b0 += y * v0, b1 += y * v1, b2 += y * v2, b3 += y * v3;
		}
		N(store)(acc0 + d, a0), N(store)(acc0 + d + VW, a1), N(store)(acc0 + d + 2 * VW, a2), N(store)(acc0 + d + 3 * VW, a3);
		N(store)(acc1 + d, b0), N(store)(acc1 + d + VW, b1), N(store)(acc1 + d + 2 * VW, b2), N(store)(acc1 + d + 3 * VW, b3);
	}
	if (d < D) {
		const int64_t off = d * es;
		N(weigh)(acc0 + d, w0, vb + off, stride, n, D - d, half);
		N(weigh)(acc1 + d, w1, vb + off, stride, n, D - d, half);
	}
}

// score_rows scores the G query rows q (D floats each) against n keys k_i = k + i·ks:
// row g's scores go to s + g·sw. Rows go two at a time (scores2), the odd one alone.
KFN static inline __attribute__((always_inline)) void N(score_rows)(const float *q, int G, const void *k, int64_t ks,
	int n, int D, float *s, int64_t sw, int half) {
	int g = 0;
	for (; g + 2 <= G; g += 2) {
		N(scores2)(q + (size_t)g * D, q + (size_t)(g + 1) * D, k, ks, n, D, s + g * sw, s + (g + 1) * sw, half);
	}
	if (g < G) {
		N(scores)(q + (size_t)g * D, k, ks, n, D, s + g * sw, half);
	}
}

// weigh_rows adds to each of the G rows of acc (D floats each) its weights w + g·sw
// times n values v_i = v + i·stride, two rows at a time (weigh2), the odd one alone.
KFN static inline __attribute__((always_inline)) void N(weigh_rows)(float *acc, int G, const float *w, int64_t sw,
	const void *v, int64_t stride, int n, int D, int half) {
	int g = 0;
	for (; g + 2 <= G; g += 2) {
		N(weigh2)(acc + (size_t)g * D, acc + (size_t)(g + 1) * D, w + g * sw, w + (g + 1) * sw, v, stride, n, D, half);
	}
	if (g < G) {
		N(weigh)(acc + (size_t)g * D, w + g * sw, v, stride, n, D, half);
	}
}

// vmax returns the largest of s[0..n).
KFN static inline float N(vmax)(const float *s, int n) {
	N(vf) m = N(splat)(-INFINITY);
	int i = 0;
	for (; i + VW <= n; i += VW) {
		const N(vf) v = N(load)(s + i);
		const N(vi) gt = v > m;
		m = (N(vf))(((N(vi))v & gt) | ((N(vi))m & ~gt));
	}
	float r = -INFINITY;
	for (int j = 0; j < VW; j++) {
		r = m[j] > r ? m[j] : r;
	}
	for (; i < n; i++) {
		r = s[i] > r ? s[i] : r;
	}
	return r;
}

// ahead prefetches, while the block of position a is read, the key (value = 0) or value
// rows of KV head kvh in the block pfb blocks further (the first time, at a == first,
// every block up to there), up to position p.
KFN static inline void N(ahead)(const cv_pa_args *x, const int32_t *bt, int kvh, int64_t a, int64_t first, int64_t p,
	int64_t pfb, int value) {
	const int64_t bs = x->g.block_size, D = x->g.head_dim, es = x->cache_half ? 2 : 4, kvw = x->a.kv_num_heads * D;
	for (int64_t f = (a == first ? a / bs + 1 : a / bs + pfb) * bs; f <= (a / bs + pfb) * bs && f <= p; f += bs) {
		const void *row;
		const int64_t e = N(run)(x, bt, kvh, f, p + 1, value, &row);
		N(prefetch)(row, kvw * es, (int)(e - f), D * es);
	}
}

// attend1_SFX computes a decode item (one new token): every query row of each of the
// item's KV heads against all its keys in three passes over the row's blocks — scores
// for every key, one softmax, the weighted sum — with the group's query rows taken two
// at a time so that they share each load of a key and of a value.
KFN static int N(attend1)(const cv_pa_args *x, const cv_pa_item *it) {
	const cv_pa_geom *g = &x->g;
	const int D = (int)g->head_dim, H = (int)x->a.num_heads, G = H / (int)x->a.kv_num_heads;
	const int64_t kvw = x->a.kv_num_heads * g->head_dim, qs = cv_pa_q_stride(x);
	const int b = it->row, h0 = it->h0, nh = it->h1 - it->h0;
	const int64_t t0 = (int64_t)x->cu_seqlens[b] + it->j0, p = (int64_t)x->past_seqlens[b] + it->j0;
	const float scale = x->a.scale != 0 ? x->a.scale : 1.0f / sqrtf((float)D), cap = x->a.softcap;
	const int half = (int)g->rotary_half, hf = x->cache_half;
	const int64_t first = cv_pa_first_key(x, p), npos = p + 1 - first, bs = g->block_size, es = hf ? 2 : 4;
	// Blocks prefetched ahead: about CV_PA_PREFETCH_BYTES of one head's rows, at least one block.
	const int64_t pfb = CV_PA_PREFETCH_BYTES / (bs * D * es) > 1 ? CV_PA_PREFETCH_BYTES / (bs * D * es) : 1;
	const int64_t sw = (npos + VW - 1) / VW * VW; // a row of scores, padded
	float *buf = cv_pa_scratch((size_t)G * D * 2 + (size_t)G * sw);
	if (buf == NULL) {
		return -1;
	}
	float *q = buf, *acc = q + (size_t)G * D, *S = acc + (size_t)G * D;
	const int32_t *bt = x->block_table + (int64_t)b * g->max_blocks;
	for (int hh = 0; hh < nh; hh++) {
		const int kvh = h0 + hh;
		for (int gh = 0; gh < G; gh++) {
			float *qr = q + (size_t)gh * D;
			memcpy(qr, x->query + t0 * qs + (int64_t)(kvh * G + gh) * D, (size_t)D * sizeof(float));
			if (x->a.do_rotary) {
				cv_pa_rotate(qr, x->cos_cache + p * half, x->sin_cache + p * half, half, (int)x->a.rotary_interleaved);
			}
			for (int d = 0; d < D; d++) {
				qr[d] *= scale;
			}
		}
		memset(acc, 0, (size_t)G * D * sizeof(float));
		// Scores, a run of keys per block.
		for (int64_t a = first, e; a <= p; a = e) {
			const void *k;
			e = N(run)(x, bt, kvh, a, p + 1, 0, &k);
			const int n = (int)(e - a);
			N(ahead)(x, bt, kvh, a, first, p, pfb, 0);
			if (hf) {
				N(score_rows)(q, G, k, kvw, n, D, S + (a - first), sw, 1);
			} else {
				N(score_rows)(q, G, k, kvw, n, D, S + (a - first), sw, 0);
			}
		}
		// One softmax per row; its 1/sum scales the output.
		float inv[G];
		for (int gh = 0; gh < G; gh++) {
			float *sr = S + gh * sw;
			if (cap > 0) {
				N(softcap)(sr, (int)npos, cap);
			}
			inv[gh] = 1.0f / N(exp_sum)(sr, (int)npos, N(vmax)(sr, (int)npos));
		}
		// The weighted sums, a run of values per block.
		for (int64_t a = first, e; a <= p; a = e) {
			const void *v;
			e = N(run)(x, bt, kvh, a, p + 1, 1, &v);
			const int n = (int)(e - a);
			N(ahead)(x, bt, kvh, a, first, p, pfb, 1);
			if (hf) {
				N(weigh_rows)(acc, G, S + (a - first), sw, v, kvw, n, D, 1);
			} else {
				N(weigh_rows)(acc, G, S + (a - first), sw, v, kvw, n, D, 0);
			}
		}
		for (int gh = 0; gh < G; gh++) {
			float *o = x->output + t0 * H * D + (int64_t)(kvh * G + gh) * D;
			for (int d = 0; d < D; d++) {
				o[d] = acc[(size_t)gh * D + d] * inv[gh];
			}
		}
	}
	return 0;
}

// cv_pa_attend_SFX computes item it: every query row (token × query head of the item's
// KV heads) against the keys it sees, walked once in tiles along the row's blocks, with
// an online softmax (a running maximum, denominator and weighted sum per query row).
// Query row r = (hh·nt + j)·G + gh is token j0 + j of query head (h0 + hh)·G + gh.
KFN static int N(cv_pa_attend)(const cv_pa_args *x, const cv_pa_item *it) {
	if (it->j1 - it->j0 == 1) {
		return N(attend1)(x, it);
	}
	const cv_pa_geom *g = &x->g;
	const int D = (int)g->head_dim, H = (int)x->a.num_heads, G = H / (int)x->a.kv_num_heads;
	const int64_t kvw = x->a.kv_num_heads * g->head_dim, qs = cv_pa_q_stride(x), bs = g->block_size;
	const int b = it->row, h0 = it->h0, nh = it->h1 - it->h0, nt = it->j1 - it->j0, rows = nh * nt * G;
	const int64_t t0 = (int64_t)x->cu_seqlens[b] + it->j0, p0 = (int64_t)x->past_seqlens[b] + it->j0;
	const float scale = x->a.scale != 0 ? x->a.scale : 1.0f / sqrtf((float)D), cap = x->a.softcap;
	const int half = (int)g->rotary_half;
	// Positions per tile: CV_PA_TILE for one head, fewer for several (CV_PA_TILE_FLOATS).
	int64_t tp = nh == 1 ? CV_PA_TILE : CV_PA_TILE_FLOATS / ((int64_t)nh * D);
	tp = tp < CV_PA_MIN_BLOCK ? CV_PA_MIN_BLOCK : tp > CV_PA_TILE ? CV_PA_TILE : tp;

	// A half cache's tile is converted to float32 rows (ktile, vtile) before it is scored.
	const size_t tile = x->cache_half ? (size_t)tp * nh * D : 0;
	float *buf = cv_pa_scratch((size_t)rows * D * 2 + 2 * (size_t)rows + CV_PA_TILE + 2 * tile);
	if (buf == NULL) {
		return -1;
	}
	float *q = buf, *acc = q + (size_t)rows * D, *m = acc + (size_t)rows * D, *l = m + rows, *s = l + rows;
	float *ktile = s + CV_PA_TILE, *vtile = ktile + tile;
	const int64_t esize = x->cache_half ? 2 : 4; // bytes per cache element
	for (int hh = 0; hh < nh; hh++) {
		for (int j = 0; j < nt; j++) {
			for (int gh = 0; gh < G; gh++) {
				const int r = (hh * nt + j) * G + gh;
				float *qr = q + (size_t)r * D;
				memcpy(qr, x->query + (t0 + j) * qs + (int64_t)((h0 + hh) * G + gh) * D, (size_t)D * sizeof(float));
				if (x->a.do_rotary) {
					cv_pa_rotate(qr, x->cos_cache + (p0 + j) * half, x->sin_cache + (p0 + j) * half, half,
						(int)x->a.rotary_interleaved);
				}
				for (int d = 0; d < D; d++) {
					qr[d] *= scale;
				}
				m[r] = -INFINITY;
				l[r] = 0;
			}
		}
	}
	memset(acc, 0, (size_t)rows * D * sizeof(float));

	const int32_t *bt = x->block_table + (int64_t)b * g->max_blocks;
	const int64_t last = p0 + nt - 1, width = (int64_t)nh * D; // floats of the item's heads per position
	for (int64_t pos = cv_pa_first_key(x, p0); pos <= last;) {
		// A tile: at most tp consecutive positions, over as many blocks as they fill. A
		// half cache's tile is converted into ktile and vtile, one run of rows; a float32
		// cache's is read where it lies, a run of rows per block.
		int64_t end = pos + tp;
		end = end < last + 1 ? end : last + 1;
		if (x->cache_half) {
			for (int64_t p = pos; p < end; p++) {
				const int64_t h = ((int64_t)bt[p / bs] * bs + p % bs) * kvw + (int64_t)h0 * D;
				N(halves)(ktile + (p - pos) * width, (const uint16_t *)x->key_cache + h, (int)width);
				N(halves)(vtile + (p - pos) * width, (const uint16_t *)x->value_cache + h, (int)width);
			}
		}
		// Fetch the next tile's blocks while this one is scored.
		for (int64_t p = end, stop = end + tp < last + 1 ? end + tp : last + 1; p < stop;) {
			const int64_t next = ((int64_t)bt[p / bs] * bs + p % bs) * kvw + (int64_t)h0 * D;
			const int64_t e = (p / bs + 1) * bs < stop ? (p / bs + 1) * bs : stop;
			N(prefetch)((const char *)x->key_cache + next * esize, kvw * esize, (int)(e - p), width * esize);
			N(prefetch)((const char *)x->value_cache + next * esize, kvw * esize, (int)(e - p), width * esize);
			p = e;
		}
		for (int hh = 0; hh < nh; hh++) {
			const int kvh = h0 + hh;
			for (int j = 0; j < nt; j++) {
				const int64_t p = p0 + j, first = cv_pa_first_key(x, p);
				const int64_t lo = pos > first ? pos : first, hi = end < p + 1 ? end : p + 1;
				if (lo >= hi) {
					continue;
				}
				const int n = (int)(hi - lo);
				for (int r = (hh * nt + j) * G; r < (hh * nt + j + 1) * G; r++) {
					const float *qr = q + (size_t)r * D;
					float *ar = acc + (size_t)r * D;
					float mx = -INFINITY;
					for (int64_t a = lo, e; a < hi; a = e) {
						const float *k;
						int64_t ks; // floats from one key row of the run to the next
						e = N(tilerun)(x, bt, kvh, hh, nh, pos, a, hi, ktile, 0, &k, &ks);
						N(scores)(qr, k, ks, (int)(e - a), D, s + (a - lo), 0);
					}
					if (cap > 0) {
						N(softcap)(s, n, cap);
					}
					for (int i = 0; i < n; i++) {
						mx = s[i] > mx ? s[i] : mx;
					}
					if (mx > m[r]) {
						const float c = expf(m[r] - mx);
						l[r] *= c;
						for (int d = 0; d < D; d++) {
							ar[d] *= c;
						}
						m[r] = mx;
					}
					l[r] += N(exp_sum)(s, n, m[r]);
					for (int64_t a = lo, e; a < hi; a = e) {
						const float *v;
						int64_t vs;
						e = N(tilerun)(x, bt, kvh, hh, nh, pos, a, hi, vtile, 1, &v, &vs);
						N(weigh)(ar, s + (a - lo), v, vs, (int)(e - a), D, 0);
					}
				}
			}
		}
		pos = end;
	}

	for (int hh = 0; hh < nh; hh++) {
		for (int j = 0; j < nt; j++) {
			for (int gh = 0; gh < G; gh++) {
				const int r = (hh * nt + j) * G + gh;
				const float inv = 1.0f / l[r];
				float *o = x->output + (t0 + j) * H * D + (int64_t)((h0 + hh) * G + gh) * D;
				for (int d = 0; d < D; d++) {
					o[d] = acc[(size_t)r * D + d] * inv;
				}
			}
		}
	}
	return 0;
}

#undef N
#undef CV_PA_CAT
#undef CV_PA_CAT2
