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

// dot returns a·b over n floats.
KFN static inline float N(dot)(const float *restrict a, const float *restrict b, int n) {
	N(vf) s0 = {0}, s1 = {0};
	int d = 0;
	for (; d + 2 * VW <= n; d += 2 * VW) {
		s0 += N(load)(a + d) * N(load)(b + d);
		s1 += N(load)(a + d + VW) * N(load)(b + d + VW);
	}
	for (; d + VW <= n; d += VW) {
		s0 += N(load)(a + d) * N(load)(b + d);
	}
	float s = N(hsum)(s0 + s1);
	for (; d < n; d++) {
		s += a[d] * b[d];
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

// scores sets s[i] = q·k_i for n keys k_i = k + i·ks of D floats. VW keys at a time
// share each load of q, one accumulator per key, and the VW accumulators are summed
// into one vector of the VW scores by log2(VW) rounds of pairsum (lane i of the result
// is key i's sum): no horizontal sum per key. The keys past the last VW, and a head's
// floats past the last VW, go through dot and scalar sums.
KFN static inline void N(scores)(const float *restrict q, const float *restrict k, int64_t ks, int n, int D,
	float *restrict s) {
	const int Dv = D - D % VW;
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
				a[j] += qv * N(load)(k + (i + j) * ks + d);
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
				t += q[d] * k[(i + j) * ks + d];
			}
			s[i + j] += t;
		}
	}
	for (; i < n; i++) {
		s[i] = N(dot)(q, k + i * ks, D);
	}
}

#undef CV_PA_EVEN
#undef CV_PA_ODD

// weigh adds w[0]·v_0 + ... + w[n-1]·v_(n-1) to acc over D floats, v_i = v + i·stride:
// a run of acc stays in registers while the n rows of v stream past it.
KFN static inline void N(weigh)(float *restrict acc, const float *restrict w, const float *restrict v, int64_t stride,
	int n, int D) {
	int d = 0;
	for (; d + 4 * VW <= D; d += 4 * VW) {
		N(vf) a0 = N(load)(acc + d), a1 = N(load)(acc + d + VW), a2 = N(load)(acc + d + 2 * VW), a3 = N(load)(acc + d + 3 * VW);
		for (int i = 0; i < n; i++) {
			const float *vi = v + i * stride + d;
			const N(vf) wi = N(splat)(w[i]);
			a0 += wi * N(load)(vi);
			a1 += wi * N(load)(vi + VW);
			a2 += wi * N(load)(vi + 2 * VW);
			a3 += wi * N(load)(vi + 3 * VW);
		}
		N(store)(acc + d, a0);
		N(store)(acc + d + VW, a1);
		N(store)(acc + d + 2 * VW, a2);
		N(store)(acc + d + 3 * VW, a3);
	}
	for (; d + VW <= D; d += VW) {
		N(vf) a0 = N(load)(acc + d);
		for (int i = 0; i < n; i++) {
			a0 += N(splat)(w[i]) * N(load)(v + i * stride + d);
		}
		N(store)(acc + d, a0);
	}
	for (; d < D; d++) {
		float a = acc[d];
		for (int i = 0; i < n; i++) {
			a += w[i] * v[i * stride + d];
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

// run finds the run of rows from position a (below hi) of the tile that starts at pos
// that lie one stride apart: the key (value = 0) or value (value = 1) rows of KV head
// kvh. A half cache's tile is one run in tile (converted, stride D); a float32 cache's
// runs end with their block. It sets *p to the run's first row and *stride, and returns
// the position past the run.
KFN static inline int64_t N(run)(const cv_pa_args *x, const int32_t *bt, int kvh, int64_t pos, int64_t a, int64_t hi,
	const float *tile, int value, const float **p, int64_t *stride) {
	const int64_t D = x->g.head_dim, kvw = x->a.kv_num_heads * D, bs = x->g.block_size;
	if (x->cache_half) {
		*p = tile + (a - pos) * D, *stride = D;
		return hi;
	}
	const float *cache = (const float *)(value ? x->value_cache : x->key_cache);
	*p = cache + ((int64_t)bt[a / bs] * bs + a % bs) * kvw + (int64_t)kvh * D, *stride = kvw;
	const int64_t e = (a / bs + 1) * bs;
	return e < hi ? e : hi;
}

// cv_pa_attend_SFX computes item it: every query row (token × the KV head's query
// heads) against the keys it sees, walked once in tiles along the row's blocks, with an
// online softmax (a running maximum, denominator and weighted sum per query row).
KFN static int N(cv_pa_attend)(const cv_pa_args *x, const cv_pa_item *it) {
	const cv_pa_geom *g = &x->g;
	const int D = (int)g->head_dim, H = (int)x->a.num_heads, G = H / (int)x->a.kv_num_heads;
	const int64_t kvw = x->a.kv_num_heads * g->head_dim, qs = cv_pa_q_stride(x), bs = g->block_size;
	const int b = it->row, kvh = it->kv_head, nt = it->j1 - it->j0, rows = nt * G;
	const int64_t t0 = (int64_t)x->cu_seqlens[b] + it->j0, p0 = (int64_t)x->past_seqlens[b] + it->j0;
	const float scale = x->a.scale != 0 ? x->a.scale : 1.0f / sqrtf((float)D), cap = x->a.softcap;
	const int half = (int)g->rotary_half;

	// A half cache's tile is converted to float32 rows (ktile, vtile) before it is scored.
	const size_t tile = x->cache_half ? (size_t)CV_PA_TILE * D : 0;
	float *buf = cv_pa_alloc((size_t)rows * D * 2 + 2 * (size_t)rows + CV_PA_TILE + 2 * tile);
	if (buf == NULL) {
		return -1;
	}
	float *q = buf, *acc = q + (size_t)rows * D, *m = acc + (size_t)rows * D, *l = m + rows, *s = l + rows;
	float *ktile = s + CV_PA_TILE, *vtile = ktile + tile;
	const int64_t esize = x->cache_half ? 2 : 4; // bytes per cache element
	for (int j = 0; j < nt; j++) {
		for (int gh = 0; gh < G; gh++) {
			const int r = j * G + gh;
			float *qr = q + (size_t)r * D;
			memcpy(qr, x->query + (t0 + j) * qs + (int64_t)(kvh * G + gh) * D, (size_t)D * sizeof(float));
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
	memset(acc, 0, (size_t)rows * D * sizeof(float));

	const int32_t *bt = x->block_table + (int64_t)b * g->max_blocks;
	const int64_t last = p0 + nt - 1;
	for (int64_t pos = cv_pa_first_key(x, p0); pos <= last;) {
		// A tile: at most CV_PA_TILE consecutive positions, over as many blocks as they
		// fill. A half cache's tile is converted into ktile and vtile, one run of rows; a
		// float32 cache's is read where it lies, a run of rows per block.
		int64_t end = pos + CV_PA_TILE;
		end = end < last + 1 ? end : last + 1;
		if (x->cache_half) {
			for (int64_t p = pos; p < end; p++) {
				const int64_t h = ((int64_t)bt[p / bs] * bs + p % bs) * kvw + (int64_t)kvh * D;
				N(halves)(ktile + (p - pos) * D, (const uint16_t *)x->key_cache + h, D);
				N(halves)(vtile + (p - pos) * D, (const uint16_t *)x->value_cache + h, D);
			}
		}
		// Fetch the next tile's blocks while this one is scored.
		for (int64_t p = end, stop = end + CV_PA_TILE < last + 1 ? end + CV_PA_TILE : last + 1; p < stop;) {
			const int64_t next = ((int64_t)bt[p / bs] * bs + p % bs) * kvw + (int64_t)kvh * D;
			const int64_t e = (p / bs + 1) * bs < stop ? (p / bs + 1) * bs : stop;
			N(prefetch)((const char *)x->key_cache + next * esize, kvw * esize, (int)(e - p), D * esize);
			N(prefetch)((const char *)x->value_cache + next * esize, kvw * esize, (int)(e - p), D * esize);
			p = e;
		}
		for (int j = 0; j < nt; j++) {
			const int64_t p = p0 + j, first = cv_pa_first_key(x, p);
			const int64_t lo = pos > first ? pos : first, hi = end < p + 1 ? end : p + 1;
			if (lo >= hi) {
				continue;
			}
			const int n = (int)(hi - lo);
			for (int r = j * G; r < (j + 1) * G; r++) {
				const float *qr = q + (size_t)r * D;
				float *ar = acc + (size_t)r * D;
				float mx = -INFINITY;
				for (int64_t a = lo, e; a < hi; a = e) {
					const float *k;
					int64_t ks; // floats from one key row of the run to the next
					e = N(run)(x, bt, kvh, pos, a, hi, ktile, 0, &k, &ks);
					N(scores)(qr, k, ks, (int)(e - a), D, s + (a - lo));
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
					e = N(run)(x, bt, kvh, pos, a, hi, vtile, 1, &v, &vs);
					N(weigh)(ar, s + (a - lo), v, vs, (int)(e - a), D);
				}
			}
		}
		pos = end;
	}

	for (int j = 0; j < nt; j++) {
		for (int gh = 0; gh < G; gh++) {
			const int r = j * G + gh;
			const float inv = 1.0f / l[r];
			float *o = x->output + (t0 + j) * H * D + (int64_t)(kvh * G + gh) * D;
			for (int d = 0; d < D; d++) {
				o[d] = acc[(size_t)r * D + d] * inv;
			}
		}
	}
	free(buf);
	return 0;
}

#undef N
#undef CV_PA_CAT
#undef CV_PA_CAT2
