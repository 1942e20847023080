package ort

/*
#include <stdlib.h>
#include <string.h>
#include "capi.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"unsafe"
)

// ElemType is a tensor's element type, numbered as ONNX numbers them
// (TensorProto.DataType, ONNXTensorElementDataType).
type ElemType int

// The element types Conveyor's graphs use. Bool is the use_cache_branch input of
// decoders that Optimum exports with and without a past in one graph.
const (
	Float32  ElemType = 1
	Int32    ElemType = 6
	Int64    ElemType = 7
	Bool     ElemType = 9
	Float16  ElemType = 10
	BFloat16 ElemType = 16
)

// The numbers are ONNX's, which the C API's enum repeats; the compiler checks that here.
var _ = [1]struct{}{}[(Float32-C.ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)|(Int32-C.ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32)|
	(Int64-C.ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64)|(Bool-C.ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL)|
	(Float16-C.ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16)|(BFloat16-C.ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)]

// Size returns the bytes of one element, or 0 for a type this package does not know.
func (t ElemType) Size() int {
	switch t {
	case Float32, Int32:
		return 4
	case Int64:
		return 8
	case Float16, BFloat16:
		return 2
	case Bool:
		return 1
	}
	return 0
}

// String returns the type's ONNX name ("float32", "float16", ...).
func (t ElemType) String() string {
	switch t {
	case Float32:
		return "float32"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Bool:
		return "bool"
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("ElemType(%d)", int(t))
}

// maxRank is the most dimensions a Value's shape is read with.
const maxRank = 16

// Value is a tensor as ONNX Runtime holds it (an OrtValue): over memory the caller owns
// (NewHostTensor) or memory ONNX Runtime allocated on a device (NewDeviceTensor). A
// Value is used by one goroutine at a time; Release frees it (a Value that is dropped
// without Release is freed by the garbage collector, later).
type Value struct {
	h       *valueHandle
	cleanup runtime.Cleanup
}

// valueHandle is what Release and the garbage collector's cleanup free.
type valueHandle struct {
	v      *C.OrtValue
	pinned runtime.Pinner // the caller's Go memory a host tensor wraps
}

func (h *valueHandle) release() {
	if h.v != nil {
		C.cv_ort_release_value(h.v)
		h.v = nil
	}
	h.pinned.Unpin()
}

// newValue wraps h, which holds a new OrtValue, and frees it when the Value is dropped.
func newValue(h *valueHandle) *Value {
	v := &Value{h: h}
	v.cleanup = runtime.AddCleanup(v, (*valueHandle).release, h)
	return v
}

// NewHostTensor wraps nbytes of host memory at data as a tensor of type t and shape
// shape, without copying: ONNX Runtime reads and writes data itself. nbytes must hold
// the shape's elements (it may hold more). data may be C memory or Go memory; Go
// memory is pinned (kept in place and alive) until Release. data may be nil when the
// shape has no elements.
func NewHostTensor(t ElemType, shape []int64, data unsafe.Pointer, nbytes int) (*Value, error) {
	need, err := tensorBytes(t, shape)
	if err != nil {
		return nil, err
	}
	switch {
	case nbytes < 0 || nbytes < need:
		return nil, fmt.Errorf("ort: host tensor %s%v needs %d bytes, given %d", t, shape, need, nbytes)
	case data == nil && need > 0:
		return nil, fmt.Errorf("ort: host tensor %s%v has no data", t, shape)
	}
	if err := needInit("NewHostTensor"); err != nil {
		return nil, err
	}
	h := &valueHandle{}
	if data != nil {
		h.pinned.Pin(data) // C memory is left alone
	} else {
		nbytes = 0
	}
	if err := status(C.cv_ort_host_tensor(C.int(t), shapePtr(shape), C.size_t(len(shape)), data, C.size_t(nbytes), &h.v)); err != nil {
		h.release()
		return nil, fmt.Errorf("ort: host tensor %s%v: %w", t, shape, err)
	}
	return newValue(h), nil
}

// NewDeviceTensor allocates a tensor of type t and shape shape in d's memory with ONNX
// Runtime's shared allocator for the device; for CPU() it is a host tensor ONNX Runtime
// allocates. Its contents are undefined until written (CopyTensors, or Data on the host).
func NewDeviceTensor(d *Device, t ElemType, shape []int64) (*Value, error) {
	if d == nil {
		return nil, errors.New("ort: NewDeviceTensor without a device")
	}
	if _, err := tensorBytes(t, shape); err != nil {
		return nil, err
	}
	if err := needInit("NewDeviceTensor"); err != nil {
		return nil, err
	}
	h := &valueHandle{}
	if err := status(C.cv_ort_device_tensor(d.ep, C.int(t), shapePtr(shape), C.size_t(len(shape)), &h.v)); err != nil {
		return nil, fmt.Errorf("ort: %s tensor %s%v: %w", d.Name(), t, shape, err)
	}
	return newValue(h), nil
}

// CopyTensors copies each src[i] into dst[i] (same type and shape): between host and
// device memory through the data transfer of the execution provider that owns the
// device (ONNX Runtime's CopyTensors), and from host to host itself. All of src must
// live on one device, and all of dst on one device.
func CopyTensors(src, dst []*Value) error {
	if len(src) != len(dst) {
		return fmt.Errorf("ort: CopyTensors: %d sources, %d destinations", len(src), len(dst))
	}
	if len(src) == 0 {
		return nil
	}
	cs := make([]*C.OrtValue, len(src))
	cd := make([]*C.OrtValue, len(dst))
	sizes := make([]int, len(src))
	onHost := true
	for i := range src {
		if !src[i].live() || !dst[i].live() {
			return fmt.Errorf("ort: CopyTensors: tensor %d is nil or released", i)
		}
		st, ss, err := src[i].info()
		if err != nil {
			return err
		}
		dt, ds, err := dst[i].info()
		if err != nil {
			return err
		}
		if st != dt || !slices.Equal(ss, ds) {
			return fmt.Errorf("ort: CopyTensors: tensor %d: %s%v into %s%v", i, st, ss, dt, ds)
		}
		cs[i], cd[i] = src[i].h.v, dst[i].h.v
		sizes[i], _ = tensorBytes(st, ss)
		onHost = onHost && C.cv_ort_tensor_on_host(cs[i]) != 0 && C.cv_ort_tensor_on_host(cd[i]) != 0
	}
	if onHost { // ONNX Runtime has no data transfer from the host to itself
		for i := range src {
			if sizes[i] > 0 {
				C.memmove(dst[i].Data(), src[i].Data(), C.size_t(sizes[i]))
			}
		}
		runtime.KeepAlive(src)
		runtime.KeepAlive(dst)
		return nil
	}
	err := status(C.cv_ort_copy(&cs[0], &cd[0], C.size_t(len(cs))))
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
	if err != nil {
		return fmt.Errorf("ort: CopyTensors: %w", err)
	}
	return nil
}

// Shape returns the tensor's dimensions (nil after Release).
func (v *Value) Shape() []int64 {
	if !v.live() {
		return nil
	}
	_, shape, err := v.info()
	if err != nil {
		return nil
	}
	return shape
}

// Type returns the tensor's element type (0 after Release).
func (v *Value) Type() ElemType {
	if !v.live() {
		return 0
	}
	t, _, err := v.info()
	if err != nil {
		return 0
	}
	return t
}

// Data returns the address of a host tensor's first element: the caller's memory for
// NewHostTensor, ONNX Runtime's for NewDeviceTensor(CPU(), ...). It is nil for a tensor
// in device memory and after Release.
func (v *Value) Data() unsafe.Pointer {
	if !v.live() || C.cv_ort_tensor_on_host(v.h.v) == 0 {
		return nil
	}
	var p unsafe.Pointer
	err := status(C.cv_ort_tensor_data(v.h.v, &p))
	runtime.KeepAlive(v)
	if err != nil {
		return nil
	}
	return p
}

// Release frees the tensor (and unpins the Go memory a host tensor wraps). It is
// idempotent; a released Value must not be given to Run or CopyTensors.
func (v *Value) Release() {
	if !v.live() {
		return
	}
	v.cleanup.Stop()
	v.h.release()
}

func (v *Value) live() bool { return v != nil && v.h != nil && v.h.v != nil }

// info reads the tensor's type and shape from ONNX Runtime.
func (v *Value) info() (ElemType, []int64, error) {
	var dims [maxRank]C.int64_t
	var t C.int
	var rank C.size_t
	err := status(C.cv_ort_tensor_info(v.h.v, &t, &dims[0], maxRank, &rank))
	runtime.KeepAlive(v)
	if err != nil {
		return 0, nil, fmt.Errorf("ort: tensor shape: %w", err)
	}
	if rank > maxRank {
		return 0, nil, fmt.Errorf("ort: tensor of rank %d (at most %d)", rank, maxRank)
	}
	shape := make([]int64, rank)
	for i := range shape {
		shape[i] = int64(dims[i])
	}
	return ElemType(t), shape, nil
}

// tensorBytes checks a tensor's type and shape and returns its size in bytes.
func tensorBytes(t ElemType, shape []int64) (int, error) {
	if t.Size() == 0 {
		return 0, fmt.Errorf("ort: element type %s not supported", t)
	}
	if len(shape) > maxRank {
		return 0, fmt.Errorf("ort: shape %v has more than %d dimensions", shape, maxRank)
	}
	n := int64(t.Size())
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("ort: shape %v has a negative dimension", shape)
		}
		if d > 0 && n > math.MaxInt64/d {
			return 0, fmt.Errorf("ort: shape %v is too large", shape)
		}
		n *= d
	}
	if n > math.MaxInt {
		return 0, fmt.Errorf("ort: shape %v is too large", shape)
	}
	return int(n), nil
}

// shapePtr returns the C view of a shape (nil for a scalar).
func shapePtr(shape []int64) *C.int64_t {
	if len(shape) == 0 {
		return nil
	}
	return (*C.int64_t)(unsafe.Pointer(&shape[0]))
}
