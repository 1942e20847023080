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

KFN static inline float N(hsum)(N(vf) v) {
	float s = 0;
	for (int i = 0; i < VW; i++) {
		s += v[i];
	}
	return s;
}

KFN static inline N(vf) N(select)(N(vi) mask, N(vf) a, N(vf) b) {
	return (N(vf))(((N(vi))a & mask) | ((N(vi))b & ~mask));
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

// dst += w * src over n floats.
KFN static inline void N(axpy)(float *dst, float w, const float *src, int n) {
	N(vf) wv = N(splat)(w);
	int d = 0;
	for (; d + VW <= n; d += VW) {
		N(store)(dst + d, N(load)(dst + d) + wv * N(load)(src + d));
	}
	for (; d < n; d++) {
		dst[d] += w * src[d];
	}
}

// Softmax of s[0:n] in place; returns 1/sum.
KFN static inline float N(softmax)(float *s, int n) {
	float m = s[0];
	for (int i = 1; i < n; i++) {
		m = s[i] > m ? s[i] : m;
	}
	N(vf) mv = N(splat)(m), sumv = {0};
	int i = 0;
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

// attend_item computes one work item (see CV_ITEM_*). Query row r = j*group + g is
// token j's query head kv_head*group + g; it sees keys [first(j), pos+j] where first
// honours the sliding window. Scores for all rows are kept in scratch over the item's
// key span, so each K and V row is read from its block once per item.
KFN static void N(attend_item)(const cv_params *p, const float *karena, const float *varena,
	const int32_t *tables, const int32_t *it, const float *qkv, float *att, float *scratch) {
	const int D = p->head_dim, G = p->group, bs = p->block_size;
	const int32_t *table = tables + it[CV_ITEM_TABLE];
	const int kvh = it[CV_ITEM_KVHEAD], pos = it[CV_ITEM_POS], ntok = it[CV_ITEM_TOKENS], row = it[CV_ITEM_ROW];
	const int rows = ntok * G;
	const int last = pos + ntok - 1;
	int lo = 0;
	if (p->window > 0 && pos - p->window + 1 > 0) {
		lo = pos - p->window + 1;
	}
	const int span = last - lo + 1;
	float *scores = scratch;                   // [rows][span]
	float *acc = scratch + (size_t)rows * span; // [rows][D]
	float inv[rows];

	// Scores, key block by key block.
	for (int t0 = lo; t0 <= last;) {
		const int bi = t0 / bs;
		const int t1 = (bi + 1) * bs - 1 < last ? (bi + 1) * bs - 1 : last;
		const float *kblock = karena + ((size_t)table[bi] * p->num_kv_heads + kvh) * bs * D;
		for (int r = 0; r < rows; r++) {
			const int j = r / G, g = r % G;
			const int qpos = pos + j;
			const int first = p->window > 0 && qpos - p->window + 1 > 0 ? qpos - p->window + 1 : 0;
			const int a = t0 > first ? t0 : first, b = t1 < qpos ? t1 : qpos;
			const float *q = qkv + (size_t)(row + j) * p->qkv_stride + (size_t)(kvh * G + g) * D;
			float *s = scores + (size_t)r * span;
			for (int t = a; t <= b; t++) {
				float x = N(dot)(q, kblock + (size_t)(t % bs) * D, D) * p->scale;
				if (p->softcap > 0) {
					x = p->softcap * tanhf(x / p->softcap);
				}
				s[t - lo] = x;
			}
		}
		t0 = t1 + 1;
	}
	for (int r = 0; r < rows; r++) {
		const int qpos = pos + r / G;
		const int first = p->window > 0 && qpos - p->window + 1 > 0 ? qpos - p->window + 1 : 0;
		inv[r] = N(softmax)(scores + (size_t)r * span + (first - lo), qpos - first + 1);
	}

	// Weighted values, block by block.
	memset(acc, 0, sizeof(float) * (size_t)rows * D);
	for (int t0 = lo; t0 <= last;) {
		const int bi = t0 / bs;
		const int t1 = (bi + 1) * bs - 1 < last ? (bi + 1) * bs - 1 : last;
		const float *vblock = varena + ((size_t)table[bi] * p->num_kv_heads + kvh) * bs * D;
		for (int r = 0; r < rows; r++) {
			const int qpos = pos + r / G;
			const int first = p->window > 0 && qpos - p->window + 1 > 0 ? qpos - p->window + 1 : 0;
			const int a = t0 > first ? t0 : first, b = t1 < qpos ? t1 : qpos;
			const float *s = scores + (size_t)r * span;
			float *o = acc + (size_t)r * D;
			for (int t = a; t <= b; t++) {
				N(axpy)(o, s[t - lo], vblock + (size_t)(t % bs) * D, D);
			}
		}
		t0 = t1 + 1;
	}
	for (int r = 0; r < rows; r++) {
		const int j = r / G, g = r % G;
		float *out = att + (size_t)(row + j) * p->att_stride + (size_t)(kvh * G + g) * D;
		const float *o = acc + (size_t)r * D;
		for (int d = 0; d < D; d++) {
			out[d] = o[d] * inv[r];
		}
	}
}

#undef N
#undef CV_CAT
#undef CV_CAT2
