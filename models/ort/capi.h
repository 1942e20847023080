// Conveyor's calls into ONNX Runtime's C API (capi.c), named through the vendored
// onnxruntime_c_api.h. Every function that can fail returns NULL or an error message the
// caller frees.
#ifndef CV_ORT_CAPI_H
#define CV_ORT_CAPI_H

#include <stddef.h>
#include <stdint.h>

#include "onnxruntime_c_api.h"
#include "op.h"

// The process: library, environment, shared pool.
char *cv_ort_init(const char *path, int threads, int spin);
const OrtApi *cv_ort_api(void);
const char *cv_ort_version(void);

// Execution providers and their devices.
char *cv_ort_register_ep(const char *name, const char *path);
char *cv_ort_ep_devices(const OrtEpDevice *const **devices, size_t *n);
const char *cv_ort_ep_name(const OrtEpDevice *d);
const char *cv_ort_ep_vendor(const OrtEpDevice *d);
const char *cv_ort_ep_meta(const OrtEpDevice *d, const char *key);

// Sessions.
char *cv_ort_session_options(OrtSessionOptions **out, int own_threads, int opt_level);
char *cv_ort_session_diagnostics(OrtSessionOptions *so, const char *log_id, const char *profile_prefix);
char *cv_ort_optimized_model(OrtSessionOptions *so, const char *path);
char *cv_ort_append_ep(OrtSessionOptions *so, const OrtEpDevice *d, const char *const *keys,
		       const char *const *values, size_t n);
char *cv_ort_create_session(const char *model, OrtSessionOptions *so, OrtSession **out);
void cv_ort_release_session_options(OrtSessionOptions *so);
void cv_ort_release_session(OrtSession *s);
char *cv_ort_session_names(const OrtSession *s, int outputs, char ***names, size_t *n);
char *cv_ort_run(OrtSession *s, const char *const *in_names, const OrtValue *const *ins, size_t nin,
		 const char *const *out_names, OrtValue **outs, size_t nout);

// Conveyor's operators (ops.c).
char *cv_ort_register_ops(OrtSessionOptions *so, const cv_op_desc *const *descs, size_t n);

// Tensors.
char *cv_ort_host_tensor(int type, const int64_t *shape, size_t rank, void *data, size_t nbytes, OrtValue **out);
char *cv_ort_device_tensor(const OrtEpDevice *d, int type, const int64_t *shape, size_t rank, OrtValue **out);
char *cv_ort_tensor_info(const OrtValue *v, int *type, int64_t *dims, size_t cap, size_t *rank);
char *cv_ort_tensor_data(OrtValue *v, void **out);
int cv_ort_tensor_on_host(const OrtValue *v);
void cv_ort_release_value(OrtValue *v);
char *cv_ort_copy(const OrtValue *const *src, OrtValue *const *dst, size_t n);

#endif
