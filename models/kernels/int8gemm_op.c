// Int8Linear, Conveyor's operator (domain com.conveyor; models/ort makes it an ONNX
// Runtime custom operator) over the int8 kernel (int8gemm.c): y = x @ dequant(w), x float32
// [..., K], w int8 [K, N] in the packed layout (attributes K and N; a 1-D constant
// initializer of cv_i8w_packed_size bytes, read in place) with per-column float32 scales
// [N], a constant initializer. See int8gemm_op.go.

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "op.h"
#include "int8gemm.h"
#include "int8gemm_op.h"

typedef struct {
	cv_i8w *w;
	int64_t k, n;
} i8op_kernel;

static cv_op_status *i8op_create(const cv_op_api *api, const cv_op_info *info, void **out) {
	cv_op_tensor w, s;
	cv_op_status *st = NULL;
	if ((st = api->constant_input(info, 1, &w)) != NULL || (st = api->constant_input(info, 2, &s)) != NULL) {
		return st;
	}
	if (w.type == 0 || s.type == 0) {
		return api->fail(CV_OP_INVALID_ARGUMENT, "Int8Linear: the weights and scales must be constant initializers");
	}
	int64_t K = 0, N = 0;
	if (!api->attr_int(info, "K", &K) || !api->attr_int(info, "N", &N)) {
		return api->fail(CV_OP_INVALID_ARGUMENT, "Int8Linear: the attributes K and N are required");
	}
	if (K < 1 || N < 1 || K > INT_MAX || N > INT_MAX || cv_i8w_packed_size((int)K, (int)N) < 0) {
		return api->fail(CV_OP_INVALID_ARGUMENT, "Int8Linear: attributes K and N out of range");
	}
	if (w.rank != 1 || w.dims[0] != cv_i8w_packed_size((int)K, (int)N) || s.rank != 1 || s.dims[0] != N) {
		return api->fail(CV_OP_INVALID_ARGUMENT, "Int8Linear: want packed weights of the size K and N give, and scales [N]");
	}
	i8op_kernel *k = calloc(1, sizeof *k);
	if (k == NULL) {
		return api->fail(CV_OP_FAIL, "Int8Linear: out of memory");
	}
	k->k = K;
	k->n = N;
	// The initializer lives as long as the session, and so the kernel: read it in place.
	k->w = cv_i8w_wrap((const int8_t *)w.data, w.dims[0], (const float *)s.data, (int)K, (int)N, 1);
	if (k->w == NULL) {
		free(k);
		return api->fail(CV_OP_FAIL, "Int8Linear: out of memory");
	}
	*out = k;
	return NULL;
}

static cv_op_status *i8op_compute(void *kernel, const cv_op_api *api, cv_op_context *ctx) {
	i8op_kernel *k = kernel;
	cv_op_tensor x, y;
	cv_op_status *st = api->input(ctx, 0, &x);
	if (st != NULL) {
		return st;
	}
	if (x.rank < 1 || x.dims[x.rank - 1] != k->k) {
		return api->fail(CV_OP_INVALID_ARGUMENT, "Int8Linear: the input's last dimension is not the weights' K");
	}
	int64_t m = 1;
	for (int i = 0; i < x.rank - 1; i++) {
		m *= x.dims[i];
	}
	int64_t dims[CV_OP_MAX_RANK];
	memcpy(dims, x.dims, sizeof dims);
	dims[x.rank - 1] = k->n;
	if ((st = api->output(ctx, 0, dims, x.rank, &y)) != NULL) {
		return st;
	}
	if (m == 0) {
		return NULL;
	}
	if (m > INT_MAX) {
		return api->fail(CV_OP_INVALID_ARGUMENT, "Int8Linear: too many rows");
	}
	if (cv_i8_linear(k->w, (const float *)x.data, (int)m, (float *)y.data) != 0) {
		return api->fail(CV_OP_FAIL, "Int8Linear: the kernel failed (out of memory?)");
	}
	return NULL;
}

static void i8op_destroy(void *kernel) {
	i8op_kernel *k = kernel;
	if (k != NULL) {
		cv_i8w_free(k->w);
		free(k);
	}
}

static const int i8op_inputs[] = {CV_OP_FLOAT, CV_OP_INT8, CV_OP_FLOAT};
static const int i8op_outputs[] = {CV_OP_FLOAT};

static const cv_op_desc i8op = {
	.name = CV_INT8_OP,
	.inputs = 3,
	.outputs = 1,
	.input_types = i8op_inputs,
	.output_types = i8op_outputs,
	.create = i8op_create,
	.compute = i8op_compute,
	.destroy = i8op_destroy,
};

// cv_i8op_desc returns Int8Linear's descriptor.
const void *cv_i8op_desc(void) { return &i8op; }
