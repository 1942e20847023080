package ort

/*
#include <stdlib.h>
#include "capi.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"unsafe"
)

// CUDAProviderEnv is the environment variable that names ONNX Runtime's CUDA provider
// library when no explicit path is given.
const CUDAProviderEnv = "CONVEYOR_ORT_CUDA_PROVIDER"

// DefaultCUDAProvider is where `make ort-gpu` puts the CUDA provider, relative to the
// working directory. (It also puts libonnxruntime_providers_shared.so next to the core
// library, where ONNX Runtime looks for it.)
const DefaultCUDAProvider = ".ort/gpu/libonnxruntime_providers_cuda.so"

// cudaEP is the execution provider name the CUDA provider's devices carry.
const cudaEP = "CUDAExecutionProvider"

// cudaMajor is the CUDA release the provider `make ort-gpu` fetches is built for.
const cudaMajor = "13"

// ErrNoDevice means the device asked for cannot be used: its provider library is
// missing or does not load (a CUDA or cuDNN library it needs is missing), or there is no
// such device. The error is one line that names what is missing and how to get it.
var ErrNoDevice = errors.New("ort: device unavailable")

// Device is where a session runs and where device tensors live: the host (CPU) or one
// device of an execution provider (an OrtEpDevice of the process's environment).
type Device struct {
	ep     *C.OrtEpDevice // nil for the CPU
	name   string
	cudaID int // the CUDA runtime's device number
}

var cpuDevice = &Device{name: "cpu"}

// CPU returns the host: sessions on ONNX Runtime's CPU provider, tensors in host memory.
func CPU() *Device { return cpuDevice }

// Name returns "cpu", or "cuda:N" followed by the hardware's name in parentheses when
// ONNX Runtime gives one.
func (d *Device) Name() string { return d.name }

// IsCPU reports whether d is the host.
func (d *Device) IsCPU() bool { return d.ep == nil }

// ResolveCUDAProvider returns the CUDA provider library path to use: flagValue when it
// is not empty, else $CONVEYOR_ORT_CUDA_PROVIDER when set, else DefaultCUDAProvider
// relative to the working directory, made absolute when possible.
func ResolveCUDAProvider(flagValue string) string {
	return resolvePath(flagValue, CUDAProviderEnv, DefaultCUDAProvider)
}

// cudaState is the provider library registered under "cuda" (once per process).
var cudaState struct {
	mu   sync.Mutex
	path string
}

// OpenCUDA returns CUDA device deviceID (0 for the first GPU) through ONNX Runtime's
// CUDA provider library at providerLib ("" = ResolveCUDAProvider's choice). The
// library is registered with the environment once per process; Init must have run.
// Every error but a missing Init wraps ErrNoDevice and is one line that names what is
// missing: the provider file, a CUDA or cuDNN library it needs, or the device.
func OpenCUDA(providerLib string, deviceID int) (*Device, error) {
	if err := needInit("OpenCUDA"); err != nil {
		return nil, err
	}
	if deviceID < 0 {
		return nil, fmt.Errorf("%w: CUDA device %d: want 0 or more", ErrNoDevice, deviceID)
	}
	path := ResolveCUDAProvider(providerLib)
	if err := registerCUDA(path); err != nil {
		return nil, err
	}
	d, err := findDevice(cudaEP, "cuda", deviceID)
	if err != nil {
		return nil, err
	}
	d.cudaID = deviceID
	return d, nil
}

// registerCUDA registers the provider library at path under "cuda", unless it is.
func registerCUDA(path string) error {
	cudaState.mu.Lock()
	defer cudaState.mu.Unlock()
	if cudaState.path != "" {
		if !sameFile(cudaState.path, path) {
			return fmt.Errorf("%w: the CUDA provider %s is already registered, cannot also register %s", ErrNoDevice, cudaState.path, path)
		}
		return nil
	}
	if st, err := os.Stat(path); err != nil || st.IsDir() {
		return fmt.Errorf("%w: CUDA provider %s not found: run `make ort-gpu` (or pass --cuda-provider / set %s)", ErrNoDevice, path, CUDAProviderEnv)
	}
	cname, cpath := C.CString("cuda"), C.CString(path)
	defer C.free(unsafe.Pointer(cname))
	defer C.free(unsafe.Pointer(cpath))
	if err := status(C.cv_ort_register_ep(cname, cpath)); err != nil {
		return fmt.Errorf("%w: %s", ErrNoDevice, providerLoadError(path, err.Error()))
	}
	cudaState.path = path
	return nil
}

// findDevice returns the id-th device of the execution provider epName, named
// prefix:id.
func findDevice(epName, prefix string, id int) (*Device, error) {
	var list **C.OrtEpDevice
	var n C.size_t
	if err := status(C.cv_ort_ep_devices(&list, &n)); err != nil {
		return nil, fmt.Errorf("%w: listing devices: %s", ErrNoDevice, err)
	}
	var names []string
	var devs []*C.OrtEpDevice
	if n > 0 {
		devs = unsafe.Slice(list, int(n))
		for _, d := range devs {
			names = append(names, C.GoString(C.cv_ort_ep_name(d)))
		}
	}
	i, err := pickDevice(names, epName, id)
	if err != nil {
		return nil, err
	}
	d := devs[i]
	name := fmt.Sprintf("%s:%d", prefix, id)
	if hw := hardwareName(d); hw != "" {
		name += " (" + hw + ")"
	}
	return &Device{ep: d, name: name}, nil
}

// pickDevice returns the index in names (the execution providers of the environment's
// devices, in ONNX Runtime's order) of the id-th device of epName.
func pickDevice(names []string, epName string, id int) (int, error) {
	var found []int
	for i, n := range names {
		if n == epName {
			found = append(found, i)
		}
	}
	switch {
	case len(found) == 0:
		return 0, fmt.Errorf("%w: no CUDA device: ONNX Runtime's CUDA provider loaded but found no NVIDIA GPU (check nvidia-smi)", ErrNoDevice)
	case id >= len(found):
		return 0, fmt.Errorf("%w: CUDA device %d not found: there are %d (devices 0 to %d)", ErrNoDevice, id, len(found), len(found)-1)
	}
	return found[id], nil
}

// hardwareName describes the device from what ONNX Runtime knows of it: a description
// when the provider gives one, else the vendor and the PCI bus.
func hardwareName(d *C.OrtEpDevice) string {
	meta := func(key string) string {
		k := C.CString(key)
		defer C.free(unsafe.Pointer(k))
		if v := C.cv_ort_ep_meta(d, k); v != nil {
			return C.GoString(v)
		}
		return ""
	}
	if desc := meta("Description"); desc != "" {
		return desc
	}
	var parts []string
	if v := C.cv_ort_ep_vendor(d); v != nil && C.GoString(v) != "" {
		parts = append(parts, C.GoString(v))
	}
	if bus := meta("pci_bus_id"); bus != "" {
		parts = append(parts, "PCI "+bus)
	}
	return strings.Join(parts, ", ")
}

// missingLib finds the library a dlopen message says is missing.
var missingLib = regexp.MustCompile(`([^\s:/]+\.so[0-9.]*): cannot open shared object file`)

// notELF matches dlopen's messages for a file that is not a shared library.
var notELF = regexp.MustCompile(`invalid ELF header|file too short|not an ELF|wrong ELF class|only ET_DYN and ET_EXEC`)

// undefinedSymbol finds the symbol a dlopen or dlsym message says is missing.
var undefinedSymbol = regexp.MustCompile(`undefined symbol: ?([A-Za-z0-9_@.]+)`)

// providerLoadError turns ONNX Runtime's message about the provider library at path
// failing to register into one line that says what is missing and how to get it.
func providerLoadError(path, msg string) string {
	msg = oneLine(msg)
	if m := missingLib.FindStringSubmatch(msg); m != nil {
		lib := m[1]
		switch {
		case lib == filepath.Base(path):
			return fmt.Sprintf("CUDA provider %s not found: run `make ort-gpu` (or pass --cuda-provider / set %s)", path, CUDAProviderEnv)
		case strings.HasPrefix(lib, "libonnxruntime_providers_shared"):
			return fmt.Sprintf("%s not found next to the ONNX Runtime library: run `make ort-gpu`", lib)
		case strings.HasPrefix(lib, "libcuda.so"):
			return fmt.Sprintf("%s not found: the NVIDIA driver is not installed (the CUDA provider needs it and a GPU)", lib)
		case strings.HasPrefix(lib, "libcudnn"):
			cudnn := "cuDNN"
			if v := soMajor(lib); v != "" {
				cudnn += " " + v
			}
			return fmt.Sprintf("%s not found: install %s for CUDA %s (or the nvidia-cudnn-cu%s wheel) and add its directory to LD_LIBRARY_PATH",
				lib, cudnn, cudaMajor, cudaMajor)
		case strings.HasPrefix(lib, "libcu") || strings.HasPrefix(lib, "libnv"):
			return fmt.Sprintf("%s not found: install the CUDA %s libraries (or the nvidia-*-cu%s wheels) and add their directory to LD_LIBRARY_PATH",
				lib, cudaMajor, cudaMajor)
		}
		return fmt.Sprintf("%s not found: the CUDA provider %s needs it; add its directory to LD_LIBRARY_PATH", lib, path)
	}
	if notELF.MatchString(msg) {
		return fmt.Sprintf("%s is not a shared library: want ONNX Runtime's CUDA provider (run `make ort-gpu`)", path)
	}
	if m := undefinedSymbol.FindStringSubmatch(msg); m != nil {
		if strings.HasPrefix(m[1], "Provider_GetHost") || strings.HasPrefix(m[1], "Provider_SetHost") {
			return "libonnxruntime_providers_shared.so is not loaded: it belongs next to the ONNX Runtime library (run `make ort-gpu`)"
		}
		if strings.HasPrefix(m[1], "CreateEpFactories") || strings.HasPrefix(m[1], "ReleaseEpFactory") {
			return fmt.Sprintf("%s is not an ONNX Runtime execution provider library (no %s): want libonnxruntime_providers_cuda.so (run `make ort-gpu`)", path, m[1])
		}
		return fmt.Sprintf("%s does not match this ONNX Runtime (undefined symbol %s): use the CUDA provider of ONNX Runtime %s (run `make ort-gpu`)", path, m[1], VersionWanted)
	}
	return fmt.Sprintf("cannot load the CUDA provider %s: %s", path, msg)
}

// soMajor returns the major version of a library file name: "9" for libcudnn.so.9.
func soMajor(lib string) string {
	_, v, ok := strings.Cut(lib, ".so.")
	if !ok {
		return ""
	}
	major, _, _ := strings.Cut(v, ".")
	return major
}
