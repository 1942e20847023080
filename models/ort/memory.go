package ort

/*
#include <stdlib.h>

char *cv_cuda_mem_info(const char *cudart, int id, size_t *free_bytes, size_t *total_bytes);
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// cudart is the CUDA runtime the CUDA provider links (CUDA 13).
const cudart = "libcudart.so.13"

// Memory returns the device's free and total memory in bytes, as the CUDA runtime reports
// them now (what the process's sessions and tensors hold is not free). The host has no
// such figure: for CPU() it is an error.
func (d *Device) Memory() (free, total int64, err error) {
	if d.IsCPU() {
		return 0, 0, errors.New("ort: the host has no device memory figures")
	}
	name := C.CString(cudart)
	defer C.free(unsafe.Pointer(name))
	var f, t C.size_t
	if msg := C.cv_cuda_mem_info(name, C.int(d.cudaID), &f, &t); msg != nil {
		defer C.free(unsafe.Pointer(msg))
		return 0, 0, fmt.Errorf("%w: %s memory: %s", ErrNoDevice, d.name, oneLine(C.GoString(msg)))
	}
	return int64(f), int64(t), nil
}
