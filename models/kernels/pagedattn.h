// The PagedAttention kernel: what the Go entry point (pagedattn.go) and the ONNX Runtime
// operator (pagedattn_op.c) share. See pagedattn_doc.go for the contract.
#ifndef CV_PA_KERNEL_H
#define CV_PA_KERNEL_H

#include <stddef.h>
#include <stdint.h>

// cv_pa_attrs are the operator's attributes.
typedef struct {
	int64_t num_heads, kv_num_heads;
	float scale;   // 0 = 1/sqrt(head_dim)
	float softcap; // 0 = none
	int64_t window; // local_window_size: keys a query sees, itself included; <= 0 = all
	int64_t do_rotary, rotary_interleaved;
} cv_pa_attrs;

// cv_pa_geom are the tensors' dimensions.
typedef struct {
	int64_t tokens;      // T: rows of query (and key, value, output)
	int64_t head_dim;    // D
	int64_t num_blocks;  // key_cache.dims[0]
	int64_t block_size;  // key_cache.dims[1]
	int64_t batch;       // B: past_seqlens.dims[0]
	int64_t max_blocks;  // block_table.dims[1]
	int64_t rotary_half; // cos_cache.dims[1], 0 when cos_cache is absent
	int64_t max_pos;     // cos_cache.dims[0]
	int packed;          // 1: query is q|k|v and key, value are absent
} cv_pa_geom;

// cv_pa_args is one call: attributes, dimensions and the tensors' data (float32 and
// int32, row-major, of the sizes geom gives; the caches float32, or IEEE half floats when
// cache_half). key_cache and value_cache are updated in place.
typedef struct {
	cv_pa_attrs a;
	cv_pa_geom g;
	const float *query, *key, *value; // key, value NULL when packed
	void *key_cache, *value_cache;
	int cache_half; // 1: the caches hold float16 (uint16_t bits), written rounded to nearest even
	const int32_t *cu_seqlens, *past_seqlens, *block_table;
	const float *cos_cache, *sin_cache; // NULL when absent
	// attention_metadata (input 16): [max_query_len, max_kv_len] bounds, 0 for unknown;
	// NULL when absent. Checked as CUDA checks it; the CPU kernel needs none.
	const int32_t *metadata;
	int64_t metadata_len;
	float *output;
} cv_pa_args;

// cv_pa_item is one unit of attention work: query tokens [j0, j1) of batch row `row`,
// every query head of KV heads [h0, h1).
typedef struct {
	int32_t row, h0, h1, j0, j1;
} cv_pa_item;

// CV_PA_ERR_LEN is the size of the buffer cv_pa_check writes its message into.
#define CV_PA_ERR_LEN 256

// CUDA's limits, which this operator enforces too (pagedattn_doc.go lists each rule and where ONNX
// Runtime states it): num_heads at most CUDA's threads per block; head sizes a multiple
// of 8 up to memory-efficient attention's largest; blocks a power of two of at least
// CV_PA_MIN_BLOCK tokens; with cos and sin caches, head sizes a multiple of 16 and
// caches CV_PA_ROTARY_ALIGN columns wide at a time.
#define CV_PA_MAX_HEADS 1024
#define CV_PA_MAX_DIM 1024
#define CV_PA_HEAD_ALIGN 8
#define CV_PA_MIN_BLOCK 16
#define CV_PA_ROTARY_HEAD_ALIGN 16
#define CV_PA_ROTARY_ALIGN 8

// cv_pa_check_attrs checks the attributes alone; cv_pa_check checks a whole call: the
// attributes, the dimensions against each other and the contents of the small inputs
// (sequence lengths, block table entries of the positions used, positions against
// cos_cache's rows). Each returns 0, or -1 with a message in err.
int cv_pa_check_attrs(const cv_pa_attrs *a, char *err);
int cv_pa_check(const cv_pa_args *x, char *err);

// cv_pa_store writes the new keys (rotated when do_rotary) and values into their cache
// slots. It must finish before any cv_pa_attend of the call runs. It returns 0, or -1
// when out of memory, before writing anything.
int cv_pa_store(const cv_pa_args *x);

// cv_pa_plan writes the call's work items to items (when not NULL) and returns their
// count. The call must have passed cv_pa_check.
int64_t cv_pa_plan(const cv_pa_args *x, cv_pa_item *items);

// cv_pa_attend computes one item's rows of the output. Items of one call may run at the
// same time on different threads. It returns 0, or -1 when out of memory.
int cv_pa_attend(const cv_pa_args *x, const cv_pa_item *it);

// Instruction sets, best last.
enum { CV_PA_GENERIC = 0, CV_PA_AVX2 = 1, CV_PA_AVX512 = 2 };

// cv_pa_isa returns the instruction set cv_pa_attend uses; cv_pa_set_isa selects one
// (for tests) and returns 0, or -1 when this CPU lacks it.
int cv_pa_isa(void);
int cv_pa_set_isa(int isa);

#endif
