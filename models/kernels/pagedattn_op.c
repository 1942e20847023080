// PagedAttention, Conveyor's operator (domain com.conveyor; models/ort makes it an ONNX
// Runtime custom operator) over the PagedAttention kernel (pagedattn.c), with
// com.microsoft.PagedAttention's 17 inputs (10-15 declared and refused), outputs and
// attributes in float32, the caches in float32 or float16. See pagedattn_doc.go for the contract.

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op.h"
#include "pagedattn.h"
#include "pagedattn_op.h"

// com.microsoft.PagedAttention's 17 inputs. Those from IN_SLOT_MAPPING to IN_V_SCALE
// (slot mapping, attention sinks, fused q/k norms, a quantized cache's scales) are
// declared, so that a graph written for CUDA loads here, and refused when given.
enum {
	IN_QUERY, IN_KEY, IN_VALUE, IN_KEY_CACHE, IN_VALUE_CACHE, IN_CU, IN_PAST, IN_BLOCK_TABLE, IN_COS, IN_SIN,
	IN_SLOT_MAPPING, IN_HEAD_SINK, IN_Q_NORM, IN_K_NORM, IN_K_SCALE, IN_V_SCALE, IN_METADATA,
	IN_COUNT
};

static const char *const paop_unsupported[] = {
	[IN_SLOT_MAPPING] = "slot_mapping", [IN_HEAD_SINK] = "head_sink", [IN_Q_NORM] = "q_norm_weight",
	[IN_K_NORM] = "k_norm_weight", [IN_K_SCALE] = "k_scale", [IN_V_SCALE] = "v_scale",
};

typedef struct {
	cv_pa_attrs a;
} paop_kernel;

// paop_int reads an int attribute into *out: def when absent, an error when absent and
// required.
static cv_op_status *paop_int(const cv_op_api *api, const cv_op_info *info, const char *name, int required, int64_t def,
	int64_t *out) {
	if (api->attr_int(info, name, out)) {
		return NULL;
	}
	if (required) {
		char msg[128];
		snprintf(msg, sizeof msg, "PagedAttention: the attribute %s is required", name);
		return api->fail(CV_OP_INVALID_ARGUMENT, msg);
	}
	*out = def;
	return NULL;
}

// paop_float reads a float attribute into *out, 0 when absent.
static void paop_float(const cv_op_api *api, const cv_op_info *info, const char *name, float *out) {
	if (!api->attr_float(info, name, out)) {
		*out = 0;
	}
}

static cv_op_status *paop_create(const cv_op_api *api, const cv_op_info *info, void **out) {
	cv_pa_attrs a = {0};
	cv_op_status *st = NULL;
	if ((st = paop_int(api, info, "num_heads", 1, 0, &a.num_heads)) != NULL ||
		(st = paop_int(api, info, "kv_num_heads", 1, 0, &a.kv_num_heads)) != NULL ||
		(st = paop_int(api, info, "local_window_size", 0, -1, &a.window)) != NULL ||
		(st = paop_int(api, info, "do_rotary", 0, 0, &a.do_rotary)) != NULL ||
		(st = paop_int(api, info, "rotary_interleaved", 0, 0, &a.rotary_interleaved)) != NULL) {
		return st;
	}
	paop_float(api, info, "scale", &a.scale);
	paop_float(api, info, "softcap", &a.softcap);
	// com.microsoft.PagedAttention attributes whose other values this kernel does not
	// implement: refused, never ignored.
	static const struct {
		const char *name;
		int64_t only;
	} fixed[] = {{"is_causal", 1}, {"smooth_softmax", 0}, {"rotary_offset", 0}};
	for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
		int64_t v = 0;
		if ((st = paop_int(api, info, fixed[i].name, 0, fixed[i].only, &v)) != NULL) {
			return st;
		}
		if (v != fixed[i].only) {
			char msg[128];
			snprintf(msg, sizeof msg, "PagedAttention: %s = %lld is not supported (only %lld)", fixed[i].name, (long long)v,
				(long long)fixed[i].only);
			return api->fail(CV_OP_NOT_IMPLEMENTED, msg);
		}
	}
	char err[CV_PA_ERR_LEN];
	if (cv_pa_check_attrs(&a, err) != 0) {
		return api->fail(CV_OP_INVALID_ARGUMENT, err);
	}
	paop_kernel *k = calloc(1, sizeof *k);
	if (k == NULL) {
		return api->fail(CV_OP_FAIL, "PagedAttention: out of memory");
	}
	k->a = a;
	*out = k;
	return NULL;
}

typedef struct {
	const cv_pa_args *x;
	const cv_pa_item *items;
	atomic_int failed;
} paop_job;

static void paop_run_item(void *job, size_t i) {
	paop_job *j = job;
	if (cv_pa_attend(j->x, &j->items[i]) != 0) {
		atomic_store(&j->failed, 1);
	}
}

// paop_geom reads the call's dimensions from its inputs' shapes into *g (and the length of
// attention_metadata into *metadata_len), checking the ranks and that the shapes agree.
// It returns 0, or -1 with a message in err.
static int paop_geom(const paop_kernel *k, const cv_op_tensor *in, cv_pa_geom *g, int64_t *metadata_len, char *err) {
	int64_t d[IN_COUNT][4] = {{0}};
	int r[IN_COUNT];
	for (int i = 0; i < IN_COUNT; i++) {
		r[i] = in[i].rank;
		if (r[i] > 4) {
			snprintf(err, CV_PA_ERR_LEN, "PagedAttention: input %d has more than 4 dimensions", i);
			return -1;
		}
		memcpy(d[i], in[i].dims, (size_t)r[i] * sizeof d[i][0]);
	}
	const int64_t H = k->a.num_heads, KV = k->a.kv_num_heads;
	const int64_t *kc = d[IN_KEY_CACHE], *vc = d[IN_VALUE_CACHE];
	if (r[IN_KEY_CACHE] != 4 || r[IN_VALUE_CACHE] != 4 || memcmp(kc, vc, sizeof d[0]) != 0 || kc[2] != KV) {
		snprintf(err, CV_PA_ERR_LEN,
			"PagedAttention: key_cache and value_cache must both be [num_blocks, block_size, kv_num_heads (%lld), head_size]",
			(long long)KV);
		return -1;
	}
	*g = (cv_pa_geom){.head_dim = kc[3], .num_blocks = kc[0], .block_size = kc[1]};
	const int64_t D = kc[3];
	g->packed = in[IN_KEY].type == 0;
	if ((in[IN_KEY].type == 0) != (in[IN_VALUE].type == 0)) {
		snprintf(err, CV_PA_ERR_LEN, "PagedAttention: key and value must both be given, or both be absent (packed q|k|v)");
		return -1;
	}
	g->tokens = d[IN_QUERY][0];
	const int64_t qcols = (g->packed ? H + 2 * KV : H) * D;
	if (r[IN_QUERY] != 2 || d[IN_QUERY][1] != qcols) {
		snprintf(err, CV_PA_ERR_LEN, "PagedAttention: query must be [tokens, %lld]%s", (long long)qcols,
			g->packed ? " (packed q|k|v)" : "");
		return -1;
	}
	for (int i = IN_KEY; i <= IN_VALUE && !g->packed; i++) {
		if (r[i] != 2 || d[i][0] != g->tokens || d[i][1] != KV * D) {
			snprintf(err, CV_PA_ERR_LEN, "PagedAttention: key and value must be [%lld, %lld]", (long long)g->tokens,
				(long long)(KV * D));
			return -1;
		}
	}
	g->batch = d[IN_PAST][0];
	if (r[IN_PAST] != 1 || r[IN_CU] != 1 || d[IN_CU][0] != g->batch + 1 || r[IN_BLOCK_TABLE] != 2 ||
		d[IN_BLOCK_TABLE][0] != g->batch) {
		snprintf(err, CV_PA_ERR_LEN,
			"PagedAttention: want past_seqlens [batch], cumulative_sequence_length [batch+1] and block_table [batch, max_blocks]");
		return -1;
	}
	g->max_blocks = d[IN_BLOCK_TABLE][1];
	if ((in[IN_COS].type == 0) != (in[IN_SIN].type == 0) ||
		(in[IN_COS].type != 0 && (r[IN_COS] != 2 || r[IN_SIN] != 2 || memcmp(d[IN_COS], d[IN_SIN], sizeof d[0]) != 0))) {
		snprintf(err, CV_PA_ERR_LEN, "PagedAttention: cos_cache and sin_cache must both be [max_positions, rotary_dim/2], or both be absent");
		return -1;
	}
	g->max_pos = d[IN_COS][0];
	g->rotary_half = d[IN_COS][1];
	if (in[IN_METADATA].type != 0 && r[IN_METADATA] != 1) {
		snprintf(err, CV_PA_ERR_LEN, "PagedAttention: Input 'attention_metadata' must have shape (2), got rank %d",
			r[IN_METADATA]);
		return -1;
	}
	*metadata_len = in[IN_METADATA].type != 0 ? d[IN_METADATA][0] : 0;
	return 0;
}

static cv_op_status *paop_compute(void *kernel, const cv_op_api *api, cv_op_context *ctx) {
	paop_kernel *k = kernel;
	cv_op_status *st = NULL;
	cv_op_tensor in[IN_COUNT];
	for (size_t i = 0; i < IN_COUNT; i++) {
		if ((st = api->input(ctx, i, &in[i])) != NULL) {
			return st;
		}
	}
	for (int i = IN_SLOT_MAPPING; i <= IN_V_SCALE; i++) {
		if (in[i].type != 0) {
			char msg[160];
			snprintf(msg, sizeof msg, "PagedAttention: input %d (%s) is not supported by Conveyor's CPU operator (inputs 0-9 and 16 are)",
				i, paop_unsupported[i]);
			return api->fail(CV_OP_NOT_IMPLEMENTED, msg);
		}
	}
	const int required[] = {IN_QUERY, IN_KEY_CACHE, IN_VALUE_CACHE, IN_CU, IN_PAST, IN_BLOCK_TABLE};
	for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
		if (in[required[i]].type == 0) {
			return api->fail(CV_OP_INVALID_ARGUMENT, "PagedAttention: inputs 0 and 3-7 are required");
		}
	}
	char err[CV_PA_ERR_LEN];
	cv_pa_args x = {.a = k->a};
	if (paop_geom(k, in, &x.g, &x.metadata_len, err) != 0) {
		return api->fail(CV_OP_INVALID_ARGUMENT, err);
	}
	const int kt = in[IN_KEY_CACHE].type, vt = in[IN_VALUE_CACHE].type;
	if (kt != vt || (kt != CV_OP_FLOAT && kt != CV_OP_FLOAT16)) {
		return api->fail(CV_OP_INVALID_ARGUMENT, "PagedAttention: key_cache and value_cache must both be float32 or both float16 on the CPU");
	}
	x.cache_half = kt == CV_OP_FLOAT16;

	// The cache outputs must be the caches given as inputs, as in com.microsoft.PagedAttention.
	int64_t cache_dims[4] = {x.g.num_blocks, x.g.block_size, k->a.kv_num_heads, x.g.head_dim};
	int64_t out_dims[2] = {x.g.tokens, k->a.num_heads * x.g.head_dim};
	cv_op_tensor out, kc_out, vc_out;
	if ((st = api->output(ctx, 0, out_dims, 2, &out)) != NULL || (st = api->output(ctx, 1, cache_dims, 4, &kc_out)) != NULL ||
		(st = api->output(ctx, 2, cache_dims, 4, &vc_out)) != NULL) {
		return st;
	}
	x.key_cache = in[IN_KEY_CACHE].data;
	x.value_cache = in[IN_VALUE_CACHE].data;
	x.output = out.data;
	x.query = in[IN_QUERY].data;
	x.key = in[IN_KEY].data;
	x.value = in[IN_VALUE].data;
	x.cu_seqlens = in[IN_CU].data;
	x.past_seqlens = in[IN_PAST].data;
	x.block_table = in[IN_BLOCK_TABLE].data;
	x.cos_cache = in[IN_COS].data;
	x.sin_cache = in[IN_SIN].data;
	x.metadata = in[IN_METADATA].data;
	if (x.key_cache != kc_out.data) {
		return api->fail(CV_OP_INVALID_ARGUMENT, "PagedAttention: key_cache and key_cache_out must be the same buffer");
	}
	if (x.value_cache != vc_out.data) {
		return api->fail(CV_OP_INVALID_ARGUMENT, "PagedAttention: value_cache and value_cache_out must be the same buffer");
	}
	if (cv_pa_check(&x, err) != 0) {
		return api->fail(CV_OP_INVALID_ARGUMENT, err);
	}

	if (cv_pa_store(&x) != 0) {
		return api->fail(CV_OP_FAIL, "PagedAttention: out of memory");
	}
	const int64_t n = cv_pa_plan(&x, NULL);
	if (n == 0) {
		return NULL;
	}
	cv_pa_item *items = malloc((size_t)n * sizeof *items);
	if (items == NULL) {
		return api->fail(CV_OP_FAIL, "PagedAttention: out of memory");
	}
	cv_pa_plan(&x, items);
	paop_job job = {.x = &x, .items = items};
	atomic_init(&job.failed, 0);
	st = api->parallel_for(ctx, paop_run_item, (size_t)n, &job);
	free(items);
	if (st == NULL && atomic_load(&job.failed)) {
		st = api->fail(CV_OP_FAIL, "PagedAttention: out of memory");
	}
	return st;
}

static void paop_destroy(void *kernel) { free(kernel); }

// The operator's inputs and outputs with caches of type cache (inputs 3 and 4, outputs 1
// and 2); every other float is float32.
#define PAOP_INPUTS(cache) \
	{ \
		[IN_QUERY] = CV_OP_FLOAT, [IN_KEY] = CV_OP_FLOAT, [IN_VALUE] = CV_OP_FLOAT, \
		[IN_KEY_CACHE] = (cache), [IN_VALUE_CACHE] = (cache), \
		[IN_CU] = CV_OP_INT32, [IN_PAST] = CV_OP_INT32, [IN_BLOCK_TABLE] = CV_OP_INT32, \
		[IN_COS] = CV_OP_FLOAT, [IN_SIN] = CV_OP_FLOAT, [IN_SLOT_MAPPING] = CV_OP_INT32, \
		[IN_HEAD_SINK] = CV_OP_FLOAT, [IN_Q_NORM] = CV_OP_FLOAT, [IN_K_NORM] = CV_OP_FLOAT, \
		[IN_K_SCALE] = CV_OP_FLOAT, [IN_V_SCALE] = CV_OP_FLOAT, [IN_METADATA] = CV_OP_INT32, \
	}
static const int paop_inputs[IN_COUNT] = PAOP_INPUTS(CV_OP_FLOAT);
static const int paop_inputs_half[IN_COUNT] = PAOP_INPUTS(CV_OP_FLOAT16);
static const int paop_outputs[] = {CV_OP_FLOAT, CV_OP_FLOAT, CV_OP_FLOAT};
static const int paop_outputs_half[] = {CV_OP_FLOAT, CV_OP_FLOAT16, CV_OP_FLOAT16};
// key, value (packed q|k|v without them) and inputs 8-16 may be left out.
static const int paop_optional[IN_COUNT] = {
	[IN_KEY] = 1, [IN_VALUE] = 1, [IN_COS] = 1, [IN_SIN] = 1, [IN_SLOT_MAPPING] = 1, [IN_HEAD_SINK] = 1,
	[IN_Q_NORM] = 1, [IN_K_NORM] = 1, [IN_K_SCALE] = 1, [IN_V_SCALE] = 1, [IN_METADATA] = 1,
};

// The operator is two descriptors, one per cache type: ONNX Runtime makes one schema of
// the two and picks the kernel by the caches' type.
static const cv_op_desc paop[2] = {
	{
		.name = CV_PA_OP,
		.inputs = IN_COUNT,
		.outputs = 3,
		.input_types = paop_inputs,
		.output_types = paop_outputs,
		.input_optional = paop_optional,
		.create = paop_create,
		.compute = paop_compute,
		.destroy = paop_destroy,
	},
	{
		.name = CV_PA_OP,
		.inputs = IN_COUNT,
		.outputs = 3,
		.input_types = paop_inputs_half,
		.output_types = paop_outputs_half,
		.input_optional = paop_optional,
		.create = paop_create,
		.compute = paop_compute,
		.destroy = paop_destroy,
	},
};

// cv_paop_desc returns PagedAttention's descriptor for float32 caches (half 0) or
// float16 ones (half 1).
const void *cv_paop_desc(int half) { return &paop[half != 0]; }
