package ort

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// oneLineNoDevice fails t unless err wraps ErrNoDevice in one line mentioning want.
func oneLineNoDevice(t *testing.T, what string, err error, want string) {
	t.Helper()
	if !errors.Is(err, ErrNoDevice) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: err = %v, want one line wrapping ErrNoDevice mentioning %q", what, err, want)
	}
}

func TestCPU(t *testing.T) {
	if d := CPU(); !d.IsCPU() || d.Name() != "cpu" || CPU() != d {
		t.Errorf("CPU() = %q, IsCPU %v", d.Name(), d.IsCPU())
	}
}

// TestOpenCUDAErrors: without a usable provider OpenCUDA fails in one line that says
// what is missing: the file, a library that is not a provider, or no CUDA device.
func TestOpenCUDAErrors(t *testing.T) {
	notLib := filepath.Join(t.TempDir(), "libonnxruntime_providers_cuda.so")
	if err := os.WriteFile(notLib, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(t.TempDir(), "libonnxruntime_providers_cuda.so"), "make ort-gpu"},
		{"directory", t.TempDir(), "make ort-gpu"},
		{"not a library", notLib, "is not a shared library"},
		// A shared library that is not an execution provider: the ONNX Runtime core.
		{"not a provider", testLib, "not an ONNX Runtime execution provider"},
	} {
		_, err := OpenCUDA(tc.path, 0)
		oneLineNoDevice(t, tc.name, err, tc.want)
		t.Logf("%s: %v", tc.name, err)
	}
	_, err := OpenCUDA(notLib, -1)
	oneLineNoDevice(t, "negative device", err, "device -1")
}

// TestNoCUDADevice: the process's devices (the CPU provider's, on a machine without a
// registered CUDA provider) hold no CUDA device.
func TestNoCUDADevice(t *testing.T) {
	cudaState.mu.Lock()
	registered := cudaState.path != ""
	cudaState.mu.Unlock()
	if registered {
		t.Skip("a CUDA provider is registered in this process")
	}
	_, err := findDevice(cudaEP, "cuda", 0)
	oneLineNoDevice(t, "findDevice", err, "no CUDA device")
}

// TestPickDevice: the id-th device of the provider, in ONNX Runtime's order.
func TestPickDevice(t *testing.T) {
	names := []string{"CPUExecutionProvider", cudaEP, "OtherEP", cudaEP}
	for _, tc := range []struct {
		names []string
		id    int
		want  int
		err   string
	}{
		{names, 0, 1, ""},
		{names, 1, 3, ""},
		{names, 2, 0, "CUDA device 2 not found: there are 2"},
		{names[:1], 0, 0, "no CUDA device"},
		{nil, 0, 0, "no CUDA device"},
	} {
		got, err := pickDevice(tc.names, cudaEP, tc.id)
		if tc.err != "" {
			oneLineNoDevice(t, strings.Join(tc.names, ","), err, tc.err)
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("pickDevice(%v, %d) = %d, %v; want %d", tc.names, tc.id, got, err, tc.want)
		}
	}
}

// TestProviderLoadError: ONNX Runtime's messages about a provider that does not load
// become one line naming what is missing and how to get it.
func TestProviderLoadError(t *testing.T) {
	const p = "/x/.ort/gpu/libonnxruntime_providers_cuda.so"
	fail := func(detail string) string {
		return "Failed to load library " + p + " with error: " + detail
	}
	for _, tc := range []struct {
		msg  string
		want []string
	}{
		{fail("libcublasLt.so.13: cannot open shared object file: No such file or directory"),
			[]string{"libcublasLt.so.13 not found: install the CUDA 13 libraries (or the nvidia-*-cu13 wheels) and add their directory to LD_LIBRARY_PATH"}},
		{fail("libcurand.so.10: cannot open shared object file: No such file or directory"),
			[]string{"libcurand.so.10 not found", "CUDA 13 libraries"}},
		{fail("libcudart.so.13: cannot open shared object file: No such file or directory"),
			[]string{"libcudart.so.13 not found", "CUDA 13"}},
		{fail("libcudnn.so.9: cannot open shared object file: No such file or directory"),
			[]string{"libcudnn.so.9 not found: install cuDNN 9 for CUDA 13", "nvidia-cudnn-cu13", "LD_LIBRARY_PATH"}},
		{fail("libcuda.so.1: cannot open shared object file: No such file or directory"),
			[]string{"libcuda.so.1 not found", "NVIDIA driver"}},
		{"/x/.ort/libonnxruntime_providers_shared.so: cannot open shared object file: No such file or directory",
			[]string{"libonnxruntime_providers_shared.so not found", "make ort-gpu"}},
		{fail(p + ": cannot open shared object file: No such file or directory"),
			[]string{"CUDA provider " + p + " not found", "make ort-gpu"}},
		{fail("libfoo.so.2: cannot open shared object file: No such file or directory"),
			[]string{"libfoo.so.2 not found", "LD_LIBRARY_PATH"}},
		{fail(p + ": invalid ELF header"), []string{p + " is not a shared library"}},
		{fail(p + ": file too short"), []string{"is not a shared library"}},
		{fail(p + ": undefined symbol: CreateEpFactories"), []string{"not an ONNX Runtime execution provider library"}},
		{fail(p + ": undefined symbol: Provider_GetHost"), []string{"libonnxruntime_providers_shared.so is not loaded", "make ort-gpu"}},
		{fail(p + ": undefined symbol: _ZN11onnxruntime8Provider5GetHostEv"), []string{"does not match this ONNX Runtime", VersionWanted}},
		{"something else\nentirely", []string{"cannot load the CUDA provider " + p + ": something else entirely"}},
	} {
		got := providerLoadError(p, tc.msg)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("providerLoadError(%q) = %q, want it to contain %q", tc.msg, got, w)
			}
		}
		if strings.Contains(got, "\n") {
			t.Errorf("providerLoadError(%q) spans lines: %q", tc.msg, got)
		}
	}
}

// TestOpenCUDA opens the CUDA device when `make ort-gpu` has fetched the provider: on a
// machine with a GPU and the CUDA libraries it works, anywhere else it fails in one line
// naming what is missing. It runs after this file's error tests: a registered provider
// stays for the process.
func TestOpenCUDA(t *testing.T) {
	path := os.Getenv(CUDAProviderEnv)
	if path == "" {
		// Where `make ort-gpu` puts it: gpu/ beside the core library.
		path = filepath.Join(filepath.Dir(testLib), "gpu", filepath.Base(DefaultCUDAProvider))
	}
	if _, err := os.Stat(path); err != nil {
		t.Skipf("no CUDA provider at %s (`make ort-gpu` fetches it)", path)
	}
	d, err := OpenCUDA(path, 0)
	if err != nil {
		oneLineNoDevice(t, "OpenCUDA", err, "")
		t.Logf("OpenCUDA: %v", err)
		return
	}
	if d.IsCPU() || !strings.HasPrefix(d.Name(), "cuda:0") {
		t.Errorf("device %q", d.Name())
	}
	t.Logf("device %s", d.Name())
}

func TestHostHasNoDeviceMemory(t *testing.T) {
	if _, _, err := CPU().Memory(); err == nil {
		t.Fatal("CPU().Memory() answered")
	}
}
