// PagedAttention, ONNX Runtime custom operator (domain com.conveyor) over this package's
// kernel, with com.microsoft.PagedAttention's 17 inputs (10-15 declared and refused),
// outputs and attributes in float32, the caches in float32 or float16. See doc.go for the contract and ortop.go for the registration.

#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnxruntime_c_api.h"
#include "kernel.h"
#include "ortop.h"

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
	const OrtApi *api;
	cv_pa_attrs a;
} paop_kernel;

static OrtStatusPtr paop_fail(const OrtApi *api, OrtErrorCode code, const char *msg) {
	return api->CreateStatus(code, msg);
}

// paop_int reads an int attribute into *out: def when absent, an error when absent and
// required.
static OrtStatusPtr paop_int(const OrtApi *api, const OrtKernelInfo *info, const char *name, int required, int64_t def,
	int64_t *out) {
	OrtStatusPtr st = api->KernelInfoGetAttribute_int64(info, name, out);
	if (st == NULL) {
		return NULL;
	}
	api->ReleaseStatus(st);
	if (required) {
		char msg[128];
		snprintf(msg, sizeof msg, "PagedAttention: the attribute %s is required", name);
		return paop_fail(api, ORT_INVALID_ARGUMENT, msg);
	}
	*out = def;
	return NULL;
}

// paop_float reads a float attribute into *out, 0 when absent.
static void paop_float(const OrtApi *api, const OrtKernelInfo *info, const char *name, float *out) {
	OrtStatusPtr st = api->KernelInfoGetAttribute_float(info, name, out);
	if (st != NULL) {
		api->ReleaseStatus(st);
		*out = 0;
	}
}

static OrtStatusPtr ORT_API_CALL paop_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
	(void)op;
	cv_pa_attrs a = {0};
	OrtStatusPtr st = NULL;
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
			return paop_fail(api, ORT_NOT_IMPLEMENTED, msg);
		}
	}
	char err[CV_PA_ERR_LEN];
	if (cv_pa_check_attrs(&a, err) != 0) {
		return paop_fail(api, ORT_INVALID_ARGUMENT, err);
	}
	paop_kernel *k = calloc(1, sizeof *k);
	if (k == NULL) {
		return paop_fail(api, ORT_FAIL, "PagedAttention: out of memory");
	}
	k->api = api;
	k->a = a;
	*out = k;
	return NULL;
}

// paop_shape reads a value's dimensions (at most 4) and returns their count, or -1 with
// *st set (NULL for a value of more than 4 dimensions).
static int paop_shape(const OrtApi *api, const OrtValue *v, int64_t *dims, OrtStatusPtr *st) {
	OrtTensorTypeAndShapeInfo *info = NULL;
	size_t n = 0;
	if ((*st = api->GetTensorTypeAndShape(v, &info)) != NULL) {
		return -1;
	}
	if ((*st = api->GetDimensionsCount(info, &n)) == NULL && n <= 4) {
		*st = api->GetDimensions(info, dims, n);
	}
	api->ReleaseTensorTypeAndShapeInfo(info);
	return *st != NULL || n > 4 ? -1 : (int)n;
}

// paop_elem_type reads a value's element type into *t.
static OrtStatusPtr paop_elem_type(const OrtApi *api, const OrtValue *v, ONNXTensorElementDataType *t) {
	OrtTensorTypeAndShapeInfo *info = NULL;
	OrtStatusPtr st = api->GetTensorTypeAndShape(v, &info);
	if (st == NULL) {
		st = api->GetTensorElementType(info, t);
		api->ReleaseTensorTypeAndShapeInfo(info);
	}
	return st;
}

// paop_data returns a value's data, or NULL for an absent value.
static void *paop_data(const OrtApi *api, const OrtValue *v, OrtStatusPtr *st) {
	void *p = NULL;
	if (v != NULL && *st == NULL) {
		*st = api->GetTensorMutableData((OrtValue *)v, &p);
	}
	return p;
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
// attention_metadata into *metadata_len), checking the
// ranks and that the shapes agree. It returns 0, or -1 with a message in err.
static int paop_geom(const paop_kernel *k, const OrtValue *const *in, cv_pa_geom *g, int64_t *metadata_len, char *err,
	OrtStatusPtr *st) {
	const OrtApi *api = k->api;
	int64_t d[IN_COUNT][4] = {{0}};
	int r[IN_COUNT];
	for (int i = 0; i < IN_COUNT; i++) {
		r[i] = 0;
		if (in[i] != NULL && (r[i] = paop_shape(api, in[i], d[i], st)) < 0) {
			if (*st == NULL) {
				snprintf(err, CV_PA_ERR_LEN, "PagedAttention: input %d has more than 4 dimensions", i);
			}
			return -1;
		}
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
	g->packed = in[IN_KEY] == NULL;
	if ((in[IN_KEY] == NULL) != (in[IN_VALUE] == NULL)) {
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
	if ((in[IN_COS] == NULL) != (in[IN_SIN] == NULL) ||
		(in[IN_COS] != NULL && (r[IN_COS] != 2 || r[IN_SIN] != 2 || memcmp(d[IN_COS], d[IN_SIN], sizeof d[0]) != 0))) {
		snprintf(err, CV_PA_ERR_LEN, "PagedAttention: cos_cache and sin_cache must both be [max_positions, rotary_dim/2], or both be absent");
		return -1;
	}
	g->max_pos = d[IN_COS][0];
	g->rotary_half = d[IN_COS][1];
	if (in[IN_METADATA] != NULL && r[IN_METADATA] != 1) {
		snprintf(err, CV_PA_ERR_LEN, "PagedAttention: Input 'attention_metadata' must have shape (2), got rank %d",
			r[IN_METADATA]);
		return -1;
	}
	*metadata_len = in[IN_METADATA] != NULL ? d[IN_METADATA][0] : 0;
	return 0;
}

static OrtStatusPtr ORT_API_CALL paop_compute(void *kernel, OrtKernelContext *ctx) {
	paop_kernel *k = kernel;
	const OrtApi *api = k->api;
	OrtStatusPtr st = NULL;
	size_t nin = 0;
	if ((st = api->KernelContext_GetInputCount(ctx, &nin)) != NULL) {
		return st;
	}
	const OrtValue *in[IN_COUNT] = {NULL};
	for (size_t i = 0; i < nin && i < IN_COUNT; i++) {
		if ((st = api->KernelContext_GetInput(ctx, i, &in[i])) != NULL) {
			return st;
		}
	}
	for (int i = IN_SLOT_MAPPING; i <= IN_V_SCALE; i++) {
		if (in[i] != NULL) {
			char msg[160];
			snprintf(msg, sizeof msg, "PagedAttention: input %d (%s) is not supported by Conveyor's CPU operator (inputs 0-9 and 16 are)",
				i, paop_unsupported[i]);
			return paop_fail(api, ORT_NOT_IMPLEMENTED, msg);
		}
	}
	const int required[] = {IN_QUERY, IN_KEY_CACHE, IN_VALUE_CACHE, IN_CU, IN_PAST, IN_BLOCK_TABLE};
	for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
		if (in[required[i]] == NULL) {
			return paop_fail(api, ORT_INVALID_ARGUMENT, "PagedAttention: inputs 0 and 3-7 are required");
		}
	}
	char err[CV_PA_ERR_LEN];
	cv_pa_args x = {.a = k->a};
	if (paop_geom(k, in, &x.g, &x.metadata_len, err, &st) != 0) {
		return st != NULL ? st : paop_fail(api, ORT_INVALID_ARGUMENT, err);
	}
	ONNXTensorElementDataType kt, vt;
	if ((st = paop_elem_type(api, in[IN_KEY_CACHE], &kt)) != NULL || (st = paop_elem_type(api, in[IN_VALUE_CACHE], &vt)) != NULL) {
		return st;
	}
	if (kt != vt || (kt != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && kt != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16)) {
		return paop_fail(api, ORT_INVALID_ARGUMENT, "PagedAttention: key_cache and value_cache must both be float32 or both float16 on the CPU");
	}
	x.cache_half = kt == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;

	// The cache outputs must be the caches given as inputs, as in com.microsoft.PagedAttention.
	int64_t cache_dims[4] = {x.g.num_blocks, x.g.block_size, k->a.kv_num_heads, x.g.head_dim};
	int64_t out_dims[2] = {x.g.tokens, k->a.num_heads * x.g.head_dim};
	OrtValue *out = NULL, *kc_out = NULL, *vc_out = NULL;
	if ((st = api->KernelContext_GetOutput(ctx, 0, out_dims, 2, &out)) != NULL ||
		(st = api->KernelContext_GetOutput(ctx, 1, cache_dims, 4, &kc_out)) != NULL ||
		(st = api->KernelContext_GetOutput(ctx, 2, cache_dims, 4, &vc_out)) != NULL) {
		return st;
	}
	x.key_cache = paop_data(api, in[IN_KEY_CACHE], &st);
	x.value_cache = paop_data(api, in[IN_VALUE_CACHE], &st);
	void *kc_out_data = paop_data(api, kc_out, &st), *vc_out_data = paop_data(api, vc_out, &st);
	x.output = paop_data(api, out, &st);
	x.query = paop_data(api, in[IN_QUERY], &st);
	x.key = paop_data(api, in[IN_KEY], &st);
	x.value = paop_data(api, in[IN_VALUE], &st);
	x.cu_seqlens = paop_data(api, in[IN_CU], &st);
	x.past_seqlens = paop_data(api, in[IN_PAST], &st);
	x.block_table = paop_data(api, in[IN_BLOCK_TABLE], &st);
	x.cos_cache = paop_data(api, in[IN_COS], &st);
	x.sin_cache = paop_data(api, in[IN_SIN], &st);
	x.metadata = paop_data(api, in[IN_METADATA], &st);
	if (st != NULL) {
		return st;
	}
	if ((void *)x.key_cache != kc_out_data) {
		return paop_fail(api, ORT_INVALID_ARGUMENT, "PagedAttention: key_cache and key_cache_out must be the same buffer");
	}
	if ((void *)x.value_cache != vc_out_data) {
		return paop_fail(api, ORT_INVALID_ARGUMENT, "PagedAttention: value_cache and value_cache_out must be the same buffer");
	}
	if (cv_pa_check(&x, err) != 0) {
		return paop_fail(api, ORT_INVALID_ARGUMENT, err);
	}

	if (cv_pa_store(&x) != 0) {
		return paop_fail(api, ORT_FAIL, "PagedAttention: out of memory");
	}
	const int64_t n = cv_pa_plan(&x, NULL);
	if (n == 0) {
		return NULL;
	}
	cv_pa_item *items = malloc((size_t)n * sizeof *items);
	if (items == NULL) {
		return paop_fail(api, ORT_FAIL, "PagedAttention: out of memory");
	}
	cv_pa_plan(&x, items);
	paop_job job = {.x = &x, .items = items};
	atomic_init(&job.failed, 0);
	st = api->KernelContext_ParallelFor(ctx, paop_run_item, (size_t)n, 0, &job);
	free(items);
	if (st == NULL && atomic_load(&job.failed)) {
		st = paop_fail(api, ORT_FAIL, "PagedAttention: out of memory");
	}
	return st;
}

static void ORT_API_CALL paop_destroy(void *kernel) { free(kernel); }

static const char *ORT_API_CALL paop_name(const OrtCustomOp *op) { (void)op; return CV_PA_OP; }
static const char *ORT_API_CALL paop_ep(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
// The operator is registered twice, once per cache type (paop, paop_half): ONNX Runtime
// makes one schema of the two and picks the kernel by the caches' type (inputs 3 and 4,
// outputs 1 and 2). Every other float is float32.
static ONNXTensorElementDataType paop_cache_type(const OrtCustomOp *op);
static ONNXTensorElementDataType ORT_API_CALL paop_in_type(const OrtCustomOp *op, size_t i) {
	if (i == IN_KEY_CACHE || i == IN_VALUE_CACHE) {
		return paop_cache_type(op);
	}
	return i == IN_CU || i == IN_PAST || i == IN_BLOCK_TABLE || i == IN_SLOT_MAPPING || i == IN_METADATA
		       ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32
		       : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static size_t ORT_API_CALL paop_in_count(const OrtCustomOp *op) { (void)op; return IN_COUNT; }
static ONNXTensorElementDataType ORT_API_CALL paop_out_type(const OrtCustomOp *op, size_t i) {
	return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : paop_cache_type(op);
}
static size_t ORT_API_CALL paop_out_count(const OrtCustomOp *op) { (void)op; return 3; }
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL paop_in_required(const OrtCustomOp *op, size_t i) {
	(void)op;
	return i == IN_KEY || i == IN_VALUE || i >= IN_COS ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL paop_out_required(const OrtCustomOp *op, size_t i) {
	(void)op; (void)i;
	return INPUT_OUTPUT_REQUIRED;
}
static OrtMemType ORT_API_CALL paop_mem(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return OrtMemTypeDefault; }
static int ORT_API_CALL paop_one(const OrtCustomOp *op) { (void)op; return 1; }
static int ORT_API_CALL paop_end(const OrtCustomOp *op) { (void)op; return INT_MAX; }
static size_t ORT_API_CALL paop_no_map(int **in, int **out) { *in = NULL; *out = NULL; return 0; }
static void ORT_API_CALL paop_release_map(int *in, int *out) { free(in); free(out); }

static OrtCustomOp paop = {
	.version = ORT_API_VERSION,
	.GetName = paop_name,
	.GetExecutionProviderType = paop_ep,
	.GetInputType = paop_in_type,
	.GetInputTypeCount = paop_in_count,
	.GetOutputType = paop_out_type,
	.GetOutputTypeCount = paop_out_count,
	.KernelDestroy = paop_destroy,
	.GetInputCharacteristic = paop_in_required,
	.GetOutputCharacteristic = paop_out_required,
	.GetInputMemoryType = paop_mem,
	.GetVariadicInputMinArity = paop_one,
	.GetVariadicInputHomogeneity = paop_one,
	.GetVariadicOutputMinArity = paop_one,
	.GetVariadicOutputHomogeneity = paop_one,
	.CreateKernelV2 = paop_create,
	.KernelComputeV2 = paop_compute,
	.GetStartVersion = paop_one,
	.GetEndVersion = paop_end,
	.GetMayInplace = paop_no_map,
	.ReleaseMayInplace = paop_release_map,
	.GetAliasMap = paop_no_map,
	.ReleaseAliasMap = paop_release_map,
};

// paop_half is paop for float16 caches: a copy made at registration (paop_cache_type
// tells the two apart by address).
static OrtCustomOp paop_half;

static ONNXTensorElementDataType paop_cache_type(const OrtCustomOp *op) {
	return op == &paop_half ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

// CV_PAOP_MAX_OPS bounds the operators of the domain.
#define CV_PAOP_MAX_OPS 16

// The process's com.conveyor domain, made on the first registration and kept for the
// life of the process (sessions refer to it), and the operators it holds.
static OrtCustomOpDomain *paop_domain;
static const void *paop_ops[CV_PAOP_MAX_OPS];
static int paop_nops;


// cv_paop_register adds the com.conveyor domain, holding PagedAttention and the n
// OrtCustomOps of others, to the session options. Every call must name the same others.
// It returns NULL, or an error message to free.
char *cv_paop_register(const void *api_ptr, void *session_options, const void *const *others, int n) {
	const OrtApi *api = api_ptr;
	if (n < 0 || n >= CV_PAOP_MAX_OPS) {
		return strdup("too many operators");
	}
	if (paop_domain != NULL && (n + 1 != paop_nops || memcmp(paop_ops + 1, others, (size_t)n * sizeof *others) != 0)) {
		return strdup("the com.conveyor domain was made with other operators");
	}
	OrtStatusPtr st = NULL;
	if (paop_domain == NULL) {
		OrtCustomOpDomain *d = NULL;
		paop_half = paop;
		if ((st = api->CreateCustomOpDomain(CV_PA_DOMAIN, &d)) == NULL) {
			st = api->CustomOpDomain_Add(d, &paop);
			if (st == NULL) {
				st = api->CustomOpDomain_Add(d, &paop_half);
			}
			for (int i = 0; i < n && st == NULL; i++) {
				st = api->CustomOpDomain_Add(d, (OrtCustomOp *)others[i]);
			}
		}
		if (st == NULL) {
			paop_domain = d;
			paop_ops[0] = &paop;
			memcpy(paop_ops + 1, others, (size_t)n * sizeof *others);
			paop_nops = n + 1;
		} else if (d != NULL) {
			api->ReleaseCustomOpDomain(d);
		}
	}
	if (st == NULL) {
		st = api->AddCustomOpDomain((OrtSessionOptions *)session_options, paop_domain);
	}
	if (st == NULL) {
		return NULL;
	}
	char *out = strdup(api->GetErrorMessage(st));
	api->ReleaseStatus(st);
	return out;
}
