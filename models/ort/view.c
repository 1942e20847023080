// Tensor views: a tensor over part of another tensor's memory, on the same device.
#include <stdlib.h>
#include <string.h>

#include "capi.h"

// cv_ort_tensor_view makes *out a tensor of type and shape over nbytes of base's memory
// from byte_offset on, in base's memory (host or device). The caller checks the bounds.
char *cv_ort_tensor_view(OrtValue *base, size_t byte_offset, size_t nbytes, int type, const int64_t *shape,
			 size_t rank, OrtValue **out) {
	const OrtApi *api = cv_ort_api();
	const OrtMemoryInfo *info = NULL;
	void *data = NULL;
	OrtStatus *st = api->GetTensorMemoryInfo(base, &info);
	if (st == NULL) {
		st = api->GetTensorMutableData(base, &data);
	}
	if (st == NULL) {
		st = api->CreateTensorWithDataAsOrtValue(info, (char *)data + byte_offset, nbytes, shape, rank,
							 (ONNXTensorElementDataType)type, out);
	}
	if (st == NULL) {
		return NULL;
	}
	char *msg = strdup(api->GetErrorMessage(st));
	api->ReleaseStatus(st);
	return msg;
}
