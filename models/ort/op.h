// Conveyor's operators as plain C: what the package that implements them (models/kernels)
// hands models/ort, which makes an ONNX Runtime custom operator of it in the
// com.conveyor domain (ops.c). Nothing here names ONNX Runtime's types, so only
// models/ort compiles against ONNX Runtime's C header.
#ifndef CV_OP_H
#define CV_OP_H

#include <stddef.h>
#include <stdint.h>

// CV_OP_DOMAIN is the operators' domain in a graph.
#define CV_OP_DOMAIN "com.conveyor"

// The element types of operators' inputs and outputs, numbered as ONNX numbers them.
enum { CV_OP_FLOAT = 1, CV_OP_INT8 = 3, CV_OP_INT32 = 6, CV_OP_FLOAT16 = 10 };

// The kinds of failure, numbered as ONNX Runtime's OrtErrorCode.
enum { CV_OP_FAIL = 1, CV_OP_INVALID_ARGUMENT = 2, CV_OP_NOT_IMPLEMENTED = 9 };

// CV_OP_MAX_RANK is the most dimensions an operator's tensor has.
#define CV_OP_MAX_RANK 8

// cv_op_tensor is one input or output of a call: its element type (0 for an optional
// input the node does not give), dimensions (zero past rank) and data.
typedef struct {
	int type;
	int rank;
	int64_t dims[CV_OP_MAX_RANK];
	void *data;
} cv_op_tensor;

// A failure (NULL for success); the operator returns those cv_op_api gives it.
typedef struct cv_op_status cv_op_status;
// A node's attributes and constant inputs, when its kernel is created.
typedef struct cv_op_info cv_op_info;
// One call of a kernel.
typedef struct cv_op_context cv_op_context;

// cv_op_api is what an operator asks of ONNX Runtime through models/ort.
typedef struct {
	// fail makes a failure of the kind code with the message msg.
	cv_op_status *(*fail)(int code, const char *msg);
	// attr_int and attr_float read the node's attribute name into *out; they return 1,
	// or 0 when the node has no such attribute.
	int (*attr_int)(const cv_op_info *info, const char *name, int64_t *out);
	int (*attr_float)(const cv_op_info *info, const char *name, float *out);
	// constant_input reads input i when it is a constant initializer, which lives as
	// long as the kernel; *t has type 0 when it is not one.
	cv_op_status *(*constant_input)(const cv_op_info *info, size_t i, cv_op_tensor *t);
	// input reads input i of a call (type 0 when the node does not give it).
	cv_op_status *(*input)(cv_op_context *ctx, size_t i, cv_op_tensor *t);
	// output allocates output i of a call with rank dims and reads it into *t.
	cv_op_status *(*output)(cv_op_context *ctx, size_t i, const int64_t *dims, int rank, cv_op_tensor *t);
	// parallel_for runs fn(arg, 0), ..., fn(arg, n-1) on the session's intra-op threads
	// and returns when all have.
	cv_op_status *(*parallel_for)(cv_op_context *ctx, void (*fn)(void *arg, size_t i), size_t n, void *arg);
} cv_op_api;

// cv_op_desc describes an operator: its type in the graph, its inputs' and outputs'
// element types, which inputs a node may leave out, and its kernel. A graph may use it
// from version 1 on. One operator of several element types is several descriptors of one
// name, which ONNX Runtime picks among by the node's types.
typedef struct {
	const char *name;
	size_t inputs, outputs;
	const int *input_types, *output_types;
	const int *input_optional; // 1 for an input a node may leave out; NULL: none may
	// create makes the kernel of a node; compute runs it; destroy frees it.
	cv_op_status *(*create)(const cv_op_api *api, const cv_op_info *info, void **kernel);
	cv_op_status *(*compute)(void *kernel, const cv_op_api *api, cv_op_context *ctx);
	void (*destroy)(void *kernel);
} cv_op_desc;

#endif
