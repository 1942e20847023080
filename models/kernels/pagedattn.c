// PagedAttention: checks, the cache store, the work plan and the instruction-set
// dispatch. The attention arithmetic is pagedattn_impl.h, compiled once per instruction set.
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagedattn.h"
#include "simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// CV_PA_CHUNK is the most query tokens one work item takes: its tokens share each key
// and value row while it is in L1.
#define CV_PA_CHUNK 16

// CV_PA_TILE is the most keys one step of a prompt chunk's item scores at once, and
// CV_PA_TILE_FLOATS the most floats of keys (and as many of values) a step takes over
// all the item's KV heads: a tile of an item with several heads has fewer positions, at
// least CV_PA_MIN_BLOCK, so that it stays in L1 and L2.
#define CV_PA_TILE 64
#define CV_PA_TILE_FLOATS (CV_PA_TILE * 64)

// CV_PA_PREFETCH_BYTES is how far ahead of its reads a decode item prefetches its keys
// and values: memory latency times the rate the item reads them, with room to spare.
#ifndef CV_PA_PREFETCH_BYTES
#define CV_PA_PREFETCH_BYTES 8192
#endif

// CV_PA_WHOLE_ROWS is the number of token chunks from which each item takes every KV head
// of its chunk: then an item reads each key and value row of its positions whole, as
// it lies in the cache, and there are enough items for the threads. With fewer chunks
// an item takes one KV head.
#ifndef CV_PA_WHOLE_ROWS
#define CV_PA_WHOLE_ROWS 16
#endif

// fail writes "PagedAttention: " and the formatted message to err and returns -1.
static int fail(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(char *err, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	int n = snprintf(err, CV_PA_ERR_LEN, "PagedAttention: ");
	vsnprintf(err + n, CV_PA_ERR_LEN - (size_t)n, fmt, ap);
	va_end(ap);
	return -1;
}

int cv_pa_check_attrs(const cv_pa_attrs *a, char *err) {
	// CUDA: PagedAttention's constructor (num_heads, kv_num_heads > 0) and
	// paged_attention_helper::CheckInputs (the limit, then the multiple).
	if (a->num_heads < 1 || a->kv_num_heads < 1) {
		return fail(err, "num_heads (%lld) and kv_num_heads (%lld) must be positive", (long long)a->num_heads,
			(long long)a->kv_num_heads);
	}
	if (a->num_heads > CV_PA_MAX_HEADS) {
		return fail(err, "num_heads should be no larger than %d", CV_PA_MAX_HEADS);
	}
	if (a->num_heads % a->kv_num_heads != 0) {
		return fail(err, "num_heads must be a multiple of kv_num_heads. Got num_heads %% kv_num_heads == %lld",
			(long long)(a->num_heads % a->kv_num_heads));
	}
	if (!isfinite(a->scale)) {
		return fail(err, "scale must be finite (0 for 1/sqrt(head_size))");
	}
	if (!isfinite(a->softcap) || a->softcap < 0) {
		return fail(err, "softcap must be finite and >= 0 (0 for none)");
	}
	if ((a->do_rotary != 0 && a->do_rotary != 1) || (a->rotary_interleaved != 0 && a->rotary_interleaved != 1)) {
		return fail(err, "do_rotary and rotary_interleaved must be 0 or 1");
	}
	return 0;
}

// cv_pa_check_geom checks the dimensions against each other and the attributes.
static int cv_pa_check_geom(const cv_pa_args *x, char *err) {
	const cv_pa_attrs *a = &x->a;
	const cv_pa_geom *g = &x->g;
	if (g->head_dim < 1 || g->head_dim % CV_PA_HEAD_ALIGN != 0) {
		return fail(err, "head_size must be a multiple of %d. Got head_size %% %d == %lld", CV_PA_HEAD_ALIGN, CV_PA_HEAD_ALIGN,
			(long long)(g->head_dim < 1 ? g->head_dim : g->head_dim % CV_PA_HEAD_ALIGN));
	}
	if (g->head_dim > CV_PA_MAX_DIM) {
		return fail(err, "head_size %lld is above %d, which no CUDA PagedAttention backend takes", (long long)g->head_dim,
			CV_PA_MAX_DIM);
	}
	if (g->block_size < CV_PA_MIN_BLOCK || (g->block_size & (g->block_size - 1)) != 0) {
		return fail(err, "block_size must be a power of two and at least %d. Got block_size == %lld", CV_PA_MIN_BLOCK,
			(long long)g->block_size);
	}
	if (g->tokens < 0 || g->tokens > INT_MAX || g->batch < 0 || g->batch > INT_MAX - 1 || g->num_blocks < 0 ||
		g->max_blocks < 0 || g->rotary_half < 0 || g->max_pos < 0) {
		return fail(err, "dimensions out of range (tokens %lld, batch %lld, blocks %lld of %lld tokens, block_table columns %lld)",
			(long long)g->tokens, (long long)g->batch, (long long)g->num_blocks, (long long)g->block_size,
			(long long)g->max_blocks);
	}
	// CUDA: group_query_attention_helper::CheckRotaryCaches, run whenever both caches are
	// given, do_rotary or not.
	if (x->cos_cache != NULL || g->rotary_half > 0) {
		if (g->head_dim % CV_PA_ROTARY_HEAD_ALIGN != 0) {
			return fail(err, "head_size shall be a multiple of %d. Got head_size %% %d == %lld", CV_PA_ROTARY_HEAD_ALIGN,
				CV_PA_ROTARY_HEAD_ALIGN, (long long)(g->head_dim % CV_PA_ROTARY_HEAD_ALIGN));
		}
		if (g->rotary_half > (g->head_dim / CV_PA_ROTARY_HEAD_ALIGN) * CV_PA_ROTARY_ALIGN ||
			g->rotary_half % CV_PA_ROTARY_ALIGN != 0) {
			return fail(err, "cos_cache dimension 1 must be <= head_size / 2 and a multiple of %d. Got %lld for head_size %lld",
				CV_PA_ROTARY_ALIGN, (long long)g->rotary_half, (long long)g->head_dim);
		}
	}
	if (a->do_rotary && (g->rotary_half < 1 || x->cos_cache == NULL || x->sin_cache == NULL)) {
		return fail(err, "cos_cache and sin_cache must be passed to PagedAttention when do_rotary = 1");
	}
	if (x->cu_seqlens == NULL || (g->batch > 0 && x->past_seqlens == NULL) ||
		(g->batch * g->max_blocks > 0 && x->block_table == NULL) ||
		(g->num_blocks > 0 && (x->key_cache == NULL || x->value_cache == NULL)) ||
		(g->tokens > 0 && (x->query == NULL || x->output == NULL || (!g->packed && (x->key == NULL || x->value == NULL))))) {
		return fail(err, "a required input is missing");
	}
	return 0;
}

// cv_pa_check_metadata checks attention_metadata as ONNX Runtime 1.29's CUDA
// PagedAttention does: shape (2) (CheckInputs) and, for a call with tokens, no negative
// entry (ComputeInternal; 0 is unknown).
static int cv_pa_check_metadata(const cv_pa_args *x, char *err) {
	const int32_t *m = x->metadata;
	if (x->metadata_len != 2) {
		return fail(err, "Input 'attention_metadata' must have shape (2), got (%lld)", (long long)x->metadata_len);
	}
	if (x->g.tokens > 0 && (m[0] < 0 || m[1] < 0)) {
		return fail(err, "'attention_metadata' entries must be non-negative, got [%d, %d]. Use 0 for 'unknown'.", m[0], m[1]);
	}
	return 0;
}

int cv_pa_check(const cv_pa_args *x, char *err) {
	if (cv_pa_check_attrs(&x->a, err) != 0 || cv_pa_check_geom(x, err) != 0) {
		return -1;
	}
	const cv_pa_geom *g = &x->g;
	const int32_t *cu = x->cu_seqlens, *past = x->past_seqlens;
	if (cu[0] != 0) {
		return fail(err, "cumulative_sequence_length[0] is %d, want 0", cu[0]);
	}
	for (int64_t b = 0; b < g->batch; b++) {
		if (cu[b + 1] < cu[b]) {
			return fail(err, "cumulative_sequence_length decreases at %lld (%d after %d)", (long long)(b + 1), cu[b + 1], cu[b]);
		}
	}
	if (cu[g->batch] != g->tokens) {
		return fail(err, "cumulative_sequence_length ends at %d, the query has %lld tokens", cu[g->batch], (long long)g->tokens);
	}
	if (x->metadata != NULL && cv_pa_check_metadata(x, err) != 0) {
		return -1;
	}
	const int64_t capacity = g->max_blocks * g->block_size;
	for (int64_t b = 0; b < g->batch; b++) {
		const int64_t n = (int64_t)cu[b + 1] - cu[b];
		if (past[b] < 0) {
			return fail(err, "past_seqlens[%lld] is negative (%d)", (long long)b, past[b]);
		}
		if (n == 0) {
			continue; // a row without new tokens reads and writes nothing
		}
		const int64_t last = (int64_t)past[b] + n - 1; // the row's last position
		if (last > INT_MAX - 1) {
			return fail(err, "row %lld's positions overflow int32", (long long)b);
		}
		if (last >= capacity) {
			return fail(err, "row %lld reaches position %lld, but block_table's %lld columns of %lld-token blocks hold %lld",
				(long long)b, (long long)last, (long long)g->max_blocks, (long long)g->block_size, (long long)capacity);
		}
		if (x->a.do_rotary && last >= g->max_pos) {
			return fail(err, "row %lld reaches position %lld, but cos_cache and sin_cache have %lld rows",
				(long long)b, (long long)last, (long long)g->max_pos);
		}
		const int32_t *bt = x->block_table + b * g->max_blocks;
		for (int64_t i = 0; i <= last / g->block_size; i++) {
			if (bt[i] < 0 || bt[i] >= g->num_blocks) {
				return fail(err, "block_table[%lld][%lld] = %d is outside [0, %lld)", (long long)b, (long long)i, bt[i],
					(long long)g->num_blocks);
			}
		}
	}
	return 0;
}

// cv_pa_rotate rotates x's first 2*half values by the angles of one position: rotate-half
// pairs (i, i+half), or adjacent pairs (2i, 2i+1) when interleaved.
static void cv_pa_rotate(float *x, const float *cs, const float *sn, int half, int interleaved) {
	if (interleaved) {
		for (int i = 0; i < half; i++) {
			const float a = x[2 * i], b = x[2 * i + 1];
			x[2 * i] = a * cs[i] - b * sn[i];
			x[2 * i + 1] = b * cs[i] + a * sn[i];
		}
		return;
	}
	for (int i = 0; i < half; i++) {
		const float a = x[i], b = x[i + half];
		x[i] = a * cs[i] - b * sn[i];
		x[i + half] = b * cs[i] + a * sn[i];
	}
}

// cv_pa_q_stride returns the floats between one token's rows of query (and of key and
// value when packed).
static int64_t cv_pa_q_stride(const cv_pa_args *x) {
	const int64_t heads = x->g.packed ? x->a.num_heads + 2 * x->a.kv_num_heads : x->a.num_heads;
	return heads * x->g.head_dim;
}

int cv_pa_store(const cv_pa_args *x) {
	const cv_pa_geom *g = &x->g;
	const int64_t D = g->head_dim, KV = x->a.kv_num_heads, kvw = KV * D, qs = cv_pa_q_stride(x);
	const int half = (int)g->rotary_half;
	float *row = NULL; // a half cache's new key row, rotated in float32 before it is rounded
	if (x->cache_half && x->a.do_rotary && (row = malloc((size_t)kvw * sizeof(float))) == NULL) {
		return -1;
	}
	for (int64_t b = 0; b < g->batch; b++) {
		const int32_t *bt = x->block_table + b * g->max_blocks;
		for (int64_t t = x->cu_seqlens[b]; t < x->cu_seqlens[b + 1]; t++) {
			const int64_t p = x->past_seqlens[b] + (t - x->cu_seqlens[b]);
			const int64_t slot = (int64_t)bt[p / g->block_size] * g->block_size + p % g->block_size;
			const float *k, *v;
			if (g->packed) {
				k = x->query + t * qs + x->a.num_heads * D;
				v = k + kvw;
			} else {
				k = x->key + t * kvw;
				v = x->value + t * kvw;
			}
			if (x->cache_half) {
				uint16_t *kd = (uint16_t *)x->key_cache + slot * kvw, *vd = (uint16_t *)x->value_cache + slot * kvw;
				if (x->a.do_rotary) {
					memcpy(row, k, (size_t)kvw * sizeof(float));
					for (int64_t h = 0; h < KV; h++) {
						cv_pa_rotate(row + h * D, x->cos_cache + p * half, x->sin_cache + p * half, half,
							(int)x->a.rotary_interleaved);
					}
					k = row;
				}
				for (int64_t i = 0; i < kvw; i++) {
					kd[i] = cv_float_to_half(k[i]);
					vd[i] = cv_float_to_half(v[i]);
				}
				continue;
			}
			float *kd = (float *)x->key_cache + slot * kvw, *vd = (float *)x->value_cache + slot * kvw;
			memcpy(kd, k, (size_t)kvw * sizeof(float));
			memcpy(vd, v, (size_t)kvw * sizeof(float));
			if (x->a.do_rotary) {
				for (int64_t h = 0; h < KV; h++) {
					cv_pa_rotate(kd + h * D, x->cos_cache + p * half, x->sin_cache + p * half, half,
						(int)x->a.rotary_interleaved);
				}
			}
		}
	}
	free(row);
	return 0;
}

int64_t cv_pa_plan(const cv_pa_args *x, cv_pa_item *items) {
	int64_t chunks = 0;
	for (int64_t b = 0; b < x->g.batch; b++) {
		chunks += (x->cu_seqlens[b + 1] - x->cu_seqlens[b] + CV_PA_CHUNK - 1) / CV_PA_CHUNK;
	}
	const int32_t KV = (int32_t)x->a.kv_num_heads, step = chunks >= CV_PA_WHOLE_ROWS ? KV : 1;
	int64_t n = 0;
	for (int32_t b = 0; b < (int32_t)x->g.batch; b++) {
		const int32_t tokens = x->cu_seqlens[b + 1] - x->cu_seqlens[b];
		for (int32_t h = 0; h < KV; h += step) {
			for (int32_t j = 0; j < tokens; j += CV_PA_CHUNK) {
				if (items != NULL) {
					items[n] = (cv_pa_item){b, h, h + step, j, j + CV_PA_CHUNK < tokens ? j + CV_PA_CHUNK : tokens};
				}
				n++;
			}
		}
	}
	return n;
}

// cv_pa_first_key returns the first position a query at position p sees.
static inline int64_t cv_pa_first_key(const cv_pa_args *x, int64_t p) {
	return x->a.window > 0 && p - x->a.window + 1 > 0 ? p - x->a.window + 1 : 0;
}

// cv_pa_scratch returns the calling thread's scratch of n floats for an item's query
// rows, accumulators and scores (simd.h's cv_scratch), or NULL.
static float *cv_pa_scratch(size_t n) { return cv_scratch(CV_SCRATCH_PAGED, n * sizeof(float)); }

#define VW 4
#define SFX _generic
#define KFN
#include "pagedattn_impl.h"
#undef VW
#undef SFX
#undef KFN

#if defined(__x86_64__)
#define VW 8
#define SFX _avx2
#define KFN __attribute__((target("avx2,fma,f16c")))
#include "pagedattn_impl.h"
#undef VW
#undef SFX
#undef KFN

#define VW 16
#define SFX _avx512
#define KFN __attribute__((target("avx512f,avx2,fma,f16c")))
#include "pagedattn_impl.h"
#undef VW
#undef SFX
#undef KFN
#endif

// cv_pa_supported reports whether this CPU runs isa.
static int cv_pa_supported(int isa) {
	switch (isa) {
	case CV_PA_GENERIC:
		return 1;
#if defined(__x86_64__)
	case CV_PA_AVX2:
		return cv_cpu_has(CV_CPU_AVX2 | CV_CPU_FMA | CV_CPU_F16C);
	case CV_PA_AVX512:
		return cv_cpu_has(CV_CPU_AVX512F | CV_CPU_AVX2 | CV_CPU_FMA | CV_CPU_F16C);
#endif
	}
	return 0;
}

static atomic_int cv_pa_chosen = -1;

int cv_pa_isa(void) {
	int isa = atomic_load_explicit(&cv_pa_chosen, memory_order_relaxed);
	if (isa < 0) {
		isa = cv_pa_supported(CV_PA_AVX512) ? CV_PA_AVX512 : cv_pa_supported(CV_PA_AVX2) ? CV_PA_AVX2 : CV_PA_GENERIC;
		atomic_store_explicit(&cv_pa_chosen, isa, memory_order_relaxed);
	}
	return isa;
}

int cv_pa_set_isa(int isa) {
	if (!cv_pa_supported(isa)) {
		return -1;
	}
	atomic_store_explicit(&cv_pa_chosen, isa, memory_order_relaxed);
	return 0;
}

int cv_pa_attend(const cv_pa_args *x, const cv_pa_item *it) {
	switch (cv_pa_isa()) {
#if defined(__x86_64__)
	case CV_PA_AVX512:
		return cv_pa_attend_avx512(x, it);
	case CV_PA_AVX2:
		return cv_pa_attend_avx2(x, it);
#endif
	}
	return cv_pa_attend_generic(x, it);
}
