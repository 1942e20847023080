// Int8Linear, ONNX Runtime custom operator (domain com.conveyor) over this package's
// kernel: y = x @ dequant(w), x float32 [..., K], w int8 [K, N] in the packed layout
// (attributes K and N; a 1-D constant initializer of cv_i8w_packed_size bytes, read in
// place) with per-column float32 scales [N], a constant initializer. See ortop.go.

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "onnxruntime_c_api.h"
#include "kernel.h"
#include "ortop.h"

typedef struct {
	const OrtApi *api;
	cv_i8w *w;
	int64_t k, n;
} i8op_kernel;

static OrtStatusPtr i8op_fail(const OrtApi *api, OrtErrorCode code, const char *msg) {
	return api->CreateStatus(code, msg);
}

// i8op_shape reads a value's dimensions (at most 8) and returns their count, or -1.
static int i8op_shape(const OrtApi *api, const OrtValue *v, int64_t *dims, OrtStatusPtr *st) {
	OrtTensorTypeAndShapeInfo *info = NULL;
	size_t n = 0;
	if ((*st = api->GetTensorTypeAndShape(v, &info)) != NULL) {
		return -1;
	}
	if ((*st = api->GetDimensionsCount(info, &n)) != NULL || n > 8) {
		api->ReleaseTensorTypeAndShapeInfo(info);
		return -1;
	}
	if ((*st = api->GetDimensions(info, dims, n)) != NULL) {
		api->ReleaseTensorTypeAndShapeInfo(info);
		return -1;
	}
	api->ReleaseTensorTypeAndShapeInfo(info);
	return (int)n;
}

static const OrtValue *i8op_constant(const OrtApi *api, const OrtKernelInfo *info, size_t i, OrtStatusPtr *st) {
	int is_const = 0;
	const OrtValue *v = NULL;
	if ((*st = api->KernelInfoGetConstantInput_tensor(info, i, &is_const, &v)) != NULL) {
		return NULL;
	}
	if (!is_const || v == NULL) {
		*st = i8op_fail(api, ORT_INVALID_ARGUMENT, "Int8Linear: the weights and scales must be constant initializers");
		return NULL;
	}
	return v;
}

static OrtStatusPtr ORT_API_CALL i8op_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
	(void)op;
	OrtStatusPtr st = NULL;
	const OrtValue *wv = i8op_constant(api, info, 1, &st);
	if (wv == NULL) {
		return st;
	}
	const OrtValue *sv = i8op_constant(api, info, 2, &st);
	if (sv == NULL) {
		return st;
	}
	int64_t K = 0, N = 0;
	if ((st = api->KernelInfoGetAttribute_int64(info, "K", &K)) != NULL ||
		(st = api->KernelInfoGetAttribute_int64(info, "N", &N)) != NULL) {
		return st;
	}
	if (K < 1 || N < 1 || K > INT_MAX || N > INT_MAX || cv_i8w_packed_size((int)K, (int)N) < 0) {
		return i8op_fail(api, ORT_INVALID_ARGUMENT, "Int8Linear: attributes K and N out of range");
	}
	int64_t wd[8], sd[8];
	int wn = i8op_shape(api, wv, wd, &st);
	if (wn < 0) {
		return st;
	}
	int sn = i8op_shape(api, sv, sd, &st);
	if (sn < 0) {
		return st;
	}
	if (wn != 1 || wd[0] != cv_i8w_packed_size((int)K, (int)N) || sn != 1 || sd[0] != N) {
		return i8op_fail(api, ORT_INVALID_ARGUMENT, "Int8Linear: want packed weights of the size K and N give, and scales [N]");
	}
	void *w = NULL, *s = NULL;
	if ((st = api->GetTensorMutableData((OrtValue *)wv, &w)) != NULL ||
		(st = api->GetTensorMutableData((OrtValue *)sv, &s)) != NULL) {
		return st;
	}
	i8op_kernel *k = calloc(1, sizeof *k);
	if (k == NULL) {
		return i8op_fail(api, ORT_FAIL, "Int8Linear: out of memory");
	}
	k->api = api;
	k->k = K;
	k->n = N;
	// The initializer lives as long as the session, and so the kernel: read it in place.
	k->w = cv_i8w_wrap((const int8_t *)w, wd[0], (const float *)s, (int)K, (int)N, 1);
	if (k->w == NULL) {
		free(k);
		return i8op_fail(api, ORT_FAIL, "Int8Linear: out of memory");
	}
	*out = k;
	return NULL;
}

static OrtStatusPtr ORT_API_CALL i8op_compute(void *kernel, OrtKernelContext *ctx) {
	i8op_kernel *k = kernel;
	const OrtApi *api = k->api;
	OrtStatusPtr st = NULL;
	const OrtValue *x = NULL;
	if ((st = api->KernelContext_GetInput(ctx, 0, &x)) != NULL) {
		return st;
	}
	int64_t dims[8];
	int nd = i8op_shape(api, x, dims, &st);
	if (nd < 0) {
		return st;
	}
	if (nd < 1 || dims[nd - 1] != k->k) {
		return i8op_fail(api, ORT_INVALID_ARGUMENT, "Int8Linear: the input's last dimension is not the weights' K");
	}
	int64_t m = 1;
	for (int i = 0; i < nd - 1; i++) {
		m *= dims[i];
	}
	dims[nd - 1] = k->n;
	OrtValue *y = NULL;
	if ((st = api->KernelContext_GetOutput(ctx, 0, dims, (size_t)nd, &y)) != NULL) {
		return st;
	}
	if (m == 0) {
		return NULL;
	}
	if (m > INT_MAX) {
		return i8op_fail(api, ORT_INVALID_ARGUMENT, "Int8Linear: too many rows");
	}
	void *xp = NULL, *yp = NULL;
	if ((st = api->GetTensorMutableData((OrtValue *)x, &xp)) != NULL || (st = api->GetTensorMutableData(y, &yp)) != NULL) {
		return st;
	}
	if (cv_i8_linear(k->w, (const float *)xp, (int)m, (float *)yp) != 0) {
		return i8op_fail(api, ORT_FAIL, "Int8Linear: the kernel failed (out of memory?)");
	}
	return NULL;
}

static void ORT_API_CALL i8op_destroy(void *kernel) {
	i8op_kernel *k = kernel;
	if (k != NULL) {
		cv_i8w_free(k->w);
		free(k);
	}
}

static const char *ORT_API_CALL i8op_name(const OrtCustomOp *op) { (void)op; return CV_INT8_OP; }
static const char *ORT_API_CALL i8op_ep(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static ONNXTensorElementDataType ORT_API_CALL i8op_in_type(const OrtCustomOp *op, size_t i) {
	(void)op;
	return i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static size_t ORT_API_CALL i8op_in_count(const OrtCustomOp *op) { (void)op; return 3; }
static ONNXTensorElementDataType ORT_API_CALL i8op_out_type(const OrtCustomOp *op, size_t i) {
	(void)op; (void)i;
	return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static size_t ORT_API_CALL i8op_out_count(const OrtCustomOp *op) { (void)op; return 1; }
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL i8op_required(const OrtCustomOp *op, size_t i) {
	(void)op; (void)i;
	return INPUT_OUTPUT_REQUIRED;
}
static OrtMemType ORT_API_CALL i8op_mem(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return OrtMemTypeDefault; }
static int ORT_API_CALL i8op_one(const OrtCustomOp *op) { (void)op; return 1; }
static int ORT_API_CALL i8op_end(const OrtCustomOp *op) { (void)op; return INT_MAX; }
static size_t ORT_API_CALL i8op_no_map(int **in, int **out) { *in = NULL; *out = NULL; return 0; }
static void ORT_API_CALL i8op_release_map(int *in, int *out) { free(in); free(out); }

static OrtCustomOp i8op = {
	.version = ORT_API_VERSION,
	.GetName = i8op_name,
	.GetExecutionProviderType = i8op_ep,
	.GetInputType = i8op_in_type,
	.GetInputTypeCount = i8op_in_count,
	.GetOutputType = i8op_out_type,
	.GetOutputTypeCount = i8op_out_count,
	.KernelDestroy = i8op_destroy,
	.GetInputCharacteristic = i8op_required,
	.GetOutputCharacteristic = i8op_required,
	.GetInputMemoryType = i8op_mem,
	.GetVariadicInputMinArity = i8op_one,
	.GetVariadicInputHomogeneity = i8op_one,
	.GetVariadicOutputMinArity = i8op_one,
	.GetVariadicOutputHomogeneity = i8op_one,
	.CreateKernelV2 = i8op_create,
	.KernelComputeV2 = i8op_compute,
	.GetStartVersion = i8op_one,
	.GetEndVersion = i8op_end,
	.GetMayInplace = i8op_no_map,
	.ReleaseMayInplace = i8op_release_map,
	.GetAliasMap = i8op_no_map,
	.ReleaseAliasMap = i8op_release_map,
};

// cv_i8op_custom_op returns Int8Linear's OrtCustomOp.
const void *cv_i8op_custom_op(void) { return &i8op; }

