package ort

/*
#include <stdlib.h>
#include "capi.h"

char *cv_ort_tensor_view(OrtValue *base, size_t byte_offset, size_t nbytes, int type, const int64_t *shape,
			 size_t rank, OrtValue **out);
*/
import "C"

import (
	"fmt"
	"runtime"
)

// NewTensorView returns a tensor of base's element type and shape shape over base's
// memory from byteOffset on, on base's device: copying between views (CopyTensors)
// copies parts of tensors, such as one block of a device KV cache into another. The
// view reads and writes base's memory, so base must outlive it.
func NewTensorView(base *Value, byteOffset int, shape []int64) (*Value, error) {
	if !base.live() {
		return nil, fmt.Errorf("ort: NewTensorView of a nil or released tensor")
	}
	t, bshape, err := base.info()
	if err != nil {
		return nil, err
	}
	total, err := tensorBytes(t, bshape)
	if err != nil {
		return nil, err
	}
	need, err := tensorBytes(t, shape)
	if err != nil {
		return nil, err
	}
	if byteOffset < 0 || byteOffset%t.Size() != 0 || byteOffset > total-need {
		return nil, fmt.Errorf("ort: a view of %d bytes at %d does not fit in %s%v (%d bytes)", need, byteOffset, t, bshape, total)
	}
	h := &valueHandle{}
	err = status(C.cv_ort_tensor_view(base.h.v, C.size_t(byteOffset), C.size_t(need), C.int(t), shapePtr(shape), C.size_t(len(shape)), &h.v))
	runtime.KeepAlive(base)
	if err != nil {
		return nil, fmt.Errorf("ort: tensor view %s%v: %w", t, shape, err)
	}
	return newValue(h), nil
}
