// Conveyor's operators (op.h) as ONNX Runtime custom operators of one com.conveyor
// domain, and the cv_op_api they call ONNX Runtime through. See pool.go (registerOps).
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi.h"
#include "op.h"

#define SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(SAME(CV_OP_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) && SAME(CV_OP_INT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8) &&
		       SAME(CV_OP_INT32, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32) &&
		       SAME(CV_OP_FLOAT16, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16),
	       "op.h numbers element types as ONNX does");
_Static_assert(SAME(CV_OP_FAIL, ORT_FAIL) && SAME(CV_OP_INVALID_ARGUMENT, ORT_INVALID_ARGUMENT) &&
		       SAME(CV_OP_NOT_IMPLEMENTED, ORT_NOT_IMPLEMENTED),
	       "op.h numbers failures as OrtErrorCode does");

// A cv_op_status is an OrtStatus, a cv_op_info an OrtKernelInfo and a cv_op_context an
// OrtKernelContext.
#define STATUS(st) ((cv_op_status *)(st))

static cv_op_status *op_fail(int code, const char *msg) {
	return STATUS(cv_ort_api()->CreateStatus((OrtErrorCode)code, msg));
}

static int op_attr_int(const cv_op_info *info, const char *name, int64_t *out) {
	const OrtApi *api = cv_ort_api();
	OrtStatus *st = api->KernelInfoGetAttribute_int64((const OrtKernelInfo *)info, name, out);
	if (st != NULL) {
		api->ReleaseStatus(st);
		return 0;
	}
	return 1;
}

static int op_attr_float(const cv_op_info *info, const char *name, float *out) {
	const OrtApi *api = cv_ort_api();
	OrtStatus *st = api->KernelInfoGetAttribute_float((const OrtKernelInfo *)info, name, out);
	if (st != NULL) {
		api->ReleaseStatus(st);
		return 0;
	}
	return 1;
}

// op_read fills *t from v (NULL: an input not given): what names it in a failure, with i.
static OrtStatus *op_read(const OrtValue *v, const char *what, size_t i, cv_op_tensor *t) {
	memset(t, 0, sizeof *t);
	if (v == NULL) {
		return NULL;
	}
	const OrtApi *api = cv_ort_api();
	OrtTensorTypeAndShapeInfo *info = NULL;
	OrtStatus *st = api->GetTensorTypeAndShape(v, &info);
	if (st != NULL) {
		return st;
	}
	ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
	size_t rank = 0;
	st = api->GetTensorElementType(info, &type);
	if (st == NULL) {
		st = api->GetDimensionsCount(info, &rank);
	}
	if (st == NULL && rank > CV_OP_MAX_RANK) {
		char msg[96];
		snprintf(msg, sizeof msg, "%s %zu has more than %d dimensions", what, i, CV_OP_MAX_RANK);
		st = api->CreateStatus(ORT_INVALID_ARGUMENT, msg);
	}
	if (st == NULL) {
		st = api->GetDimensions(info, t->dims, rank);
	}
	api->ReleaseTensorTypeAndShapeInfo(info);
	if (st == NULL) {
		st = api->GetTensorMutableData((OrtValue *)v, &t->data);
	}
	if (st != NULL) {
		memset(t, 0, sizeof *t);
		return st;
	}
	t->type = (int)type;
	t->rank = (int)rank;
	return NULL;
}

static cv_op_status *op_constant_input(const cv_op_info *info, size_t i, cv_op_tensor *t) {
	int is_const = 0;
	const OrtValue *v = NULL;
	memset(t, 0, sizeof *t);
	OrtStatus *st = cv_ort_api()->KernelInfoGetConstantInput_tensor((const OrtKernelInfo *)info, i, &is_const, &v);
	if (st == NULL && is_const) {
		st = op_read(v, "input", i, t);
	}
	return STATUS(st);
}

static cv_op_status *op_input(cv_op_context *ctx, size_t i, cv_op_tensor *t) {
	const OrtApi *api = cv_ort_api();
	size_t n = 0;
	const OrtValue *v = NULL;
	memset(t, 0, sizeof *t);
	OrtStatus *st = api->KernelContext_GetInputCount((const OrtKernelContext *)ctx, &n);
	if (st == NULL && i < n) {
		st = api->KernelContext_GetInput((const OrtKernelContext *)ctx, i, &v);
	}
	if (st == NULL) {
		st = op_read(v, "input", i, t);
	}
	return STATUS(st);
}

static cv_op_status *op_output(cv_op_context *ctx, size_t i, const int64_t *dims, int rank, cv_op_tensor *t) {
	OrtValue *v = NULL;
	memset(t, 0, sizeof *t);
	OrtStatus *st = cv_ort_api()->KernelContext_GetOutput((OrtKernelContext *)ctx, i, dims, (size_t)rank, &v);
	if (st == NULL) {
		st = op_read(v, "output", i, t);
	}
	return STATUS(st);
}

static cv_op_status *op_parallel_for(cv_op_context *ctx, void (*fn)(void *arg, size_t i), size_t n, void *arg) {
	return STATUS(cv_ort_api()->KernelContext_ParallelFor((const OrtKernelContext *)ctx, fn, n, 0, arg));
}

static const cv_op_api op_api = {
	.fail = op_fail,
	.attr_int = op_attr_int,
	.attr_float = op_attr_float,
	.constant_input = op_constant_input,
	.input = op_input,
	.output = op_output,
	.parallel_for = op_parallel_for,
};

// ops_op is one operator's OrtCustomOp with its descriptor; ONNX Runtime hands the
// OrtCustomOp, its first member, back to every callback.
typedef struct {
	OrtCustomOp op;
	const cv_op_desc *d;
} ops_op;

static const cv_op_desc *desc_of(const OrtCustomOp *op) { return ((const ops_op *)op)->d; }

// ops_kernel is a kernel with the descriptor that made it, for KernelDestroy.
typedef struct {
	const cv_op_desc *d;
	void *k;
} ops_kernel;

static OrtStatusPtr ORT_API_CALL ops_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
	ops_kernel *w = calloc(1, sizeof *w);
	if (w == NULL) {
		return api->CreateStatus(ORT_FAIL, "out of memory");
	}
	w->d = desc_of(op);
	OrtStatus *st = (OrtStatus *)w->d->create(&op_api, (const cv_op_info *)info, &w->k);
	if (st != NULL) {
		free(w);
		return st;
	}
	*out = w;
	return NULL;
}

static OrtStatusPtr ORT_API_CALL ops_compute(void *kernel, OrtKernelContext *ctx) {
	ops_kernel *w = kernel;
	return (OrtStatus *)w->d->compute(w->k, &op_api, (cv_op_context *)ctx);
}

static void ORT_API_CALL ops_destroy(void *kernel) {
	ops_kernel *w = kernel;
	if (w != NULL) {
		w->d->destroy(w->k);
		free(w);
	}
}

static const char *ORT_API_CALL ops_name(const OrtCustomOp *op) { return desc_of(op)->name; }
static const char *ORT_API_CALL ops_ep(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static ONNXTensorElementDataType ORT_API_CALL ops_in_type(const OrtCustomOp *op, size_t i) {
	return (ONNXTensorElementDataType)desc_of(op)->input_types[i];
}
static size_t ORT_API_CALL ops_in_count(const OrtCustomOp *op) { return desc_of(op)->inputs; }
static ONNXTensorElementDataType ORT_API_CALL ops_out_type(const OrtCustomOp *op, size_t i) {
	return (ONNXTensorElementDataType)desc_of(op)->output_types[i];
}
static size_t ORT_API_CALL ops_out_count(const OrtCustomOp *op) { return desc_of(op)->outputs; }
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL ops_in_required(const OrtCustomOp *op, size_t i) {
	const int *optional = desc_of(op)->input_optional;
	return optional != NULL && optional[i] ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL ops_out_required(const OrtCustomOp *op, size_t i) {
	(void)op; (void)i;
	return INPUT_OUTPUT_REQUIRED;
}
static OrtMemType ORT_API_CALL ops_mem(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return OrtMemTypeDefault; }
static int ORT_API_CALL ops_one(const OrtCustomOp *op) { (void)op; return 1; }
static int ORT_API_CALL ops_end(const OrtCustomOp *op) { (void)op; return INT_MAX; }
static size_t ORT_API_CALL ops_no_map(int **in, int **out) { *in = NULL; *out = NULL; return 0; }
static void ORT_API_CALL ops_release_map(int *in, int *out) { free(in); free(out); }

// OPS_MAX bounds the operators of the domain.
#define OPS_MAX 16

// The process's com.conveyor domain, made at the first registration and kept for the
// life of the process (sessions refer to it), and the operators it holds.
static OrtCustomOpDomain *ops_domain;
static ops_op ops[OPS_MAX];
static size_t ops_n;

static char *ops_take(OrtStatus *st) {
	if (st == NULL) {
		return NULL;
	}
	const OrtApi *api = cv_ort_api();
	char *msg = strdup(api->GetErrorMessage(st));
	api->ReleaseStatus(st);
	return msg;
}

// ops_make makes the domain of the n operators descs.
static char *ops_make(const cv_op_desc *const *descs, size_t n) {
	const OrtApi *api = cv_ort_api();
	if (n > OPS_MAX) {
		return strdup("too many operators");
	}
	OrtCustomOpDomain *d = NULL;
	char *msg = ops_take(api->CreateCustomOpDomain(CV_OP_DOMAIN, &d));
	for (size_t i = 0; i < n && msg == NULL; i++) {
		ops[i] = (ops_op){
			.op = {
				.version = ORT_API_VERSION,
				.GetName = ops_name,
				.GetExecutionProviderType = ops_ep,
				.GetInputType = ops_in_type,
				.GetInputTypeCount = ops_in_count,
				.GetOutputType = ops_out_type,
				.GetOutputTypeCount = ops_out_count,
				.KernelDestroy = ops_destroy,
				.GetInputCharacteristic = ops_in_required,
				.GetOutputCharacteristic = ops_out_required,
				.GetInputMemoryType = ops_mem,
				.GetVariadicInputMinArity = ops_one,
				.GetVariadicInputHomogeneity = ops_one,
				.GetVariadicOutputMinArity = ops_one,
				.GetVariadicOutputHomogeneity = ops_one,
				.CreateKernelV2 = ops_create,
				.KernelComputeV2 = ops_compute,
				.GetStartVersion = ops_one,
				.GetEndVersion = ops_end,
				.GetMayInplace = ops_no_map,
				.ReleaseMayInplace = ops_release_map,
				.GetAliasMap = ops_no_map,
				.ReleaseAliasMap = ops_release_map,
			},
			.d = descs[i],
		};
		msg = ops_take(api->CustomOpDomain_Add(d, &ops[i].op));
	}
	if (msg != NULL) {
		if (d != NULL) {
			api->ReleaseCustomOpDomain(d);
		}
		return msg;
	}
	ops_domain = d;
	ops_n = n;
	return NULL;
}

// cv_ort_register_ops adds the com.conveyor domain of the n operators descs to so; every
// call passes the same operators (the domain is made once). The caller serialises the
// calls.
char *cv_ort_register_ops(OrtSessionOptions *so, const cv_op_desc *const *descs, size_t n) {
	if (ops_domain == NULL) {
		char *msg = ops_make(descs, n);
		if (msg != NULL) {
			return msg;
		}
	}
	if (n != ops_n) {
		return strdup("the com.conveyor domain was made with other operators");
	}
	for (size_t i = 0; i < n; i++) {
		if (ops[i].d != descs[i]) {
			return strdup("the com.conveyor domain was made with other operators");
		}
	}
	return ops_take(cv_ort_api()->AddCustomOpDomain(so, ops_domain));
}
