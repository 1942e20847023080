package ort

/*
#cgo CFLAGS: -I${SRCDIR}/../../third_party/onnxruntime
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "capi.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	onnxruntime "github.com/yalue/onnxruntime_go"

	"github.com/conveyor-llm/conveyor/models/kernels"
)

// LibEnv is the environment variable that names the ONNX Runtime shared library when
// no explicit path is given.
const LibEnv = "CONVEYOR_ORT_LIB"

// DefaultLib is where `make ort` puts the ONNX Runtime shared library, relative to the
// working directory.
const DefaultLib = ".ort/libonnxruntime.so.1"

// VersionWanted is the ONNX Runtime release the Makefile fetches (`make ort`, and the
// CUDA provider of the same release with `make ort-gpu`) and Conveyor is tested with.
const VersionWanted = "1.29.0"

// ErrUnavailable means the ONNX Runtime shared library could not be found, loaded or
// initialised, or was used before Init.
var ErrUnavailable = errors.New("ort: onnx runtime unavailable")

// state is the process's ONNX Runtime: one library, one environment, one shared pool.
var state struct {
	mu   sync.Mutex
	path string      // absolute path of the loaded library; "" until Init succeeds
	pool PoolOptions // the shared intra-op pool (threads resolved)
}

// ResolveLib returns the ONNX Runtime library path to use: flagValue when it is not
// empty, else $CONVEYOR_ORT_LIB when set, else DefaultLib relative to the working
// directory. The result is made absolute when possible.
func ResolveLib(flagValue string) string {
	return resolvePath(flagValue, LibEnv, DefaultLib)
}

func resolvePath(flagValue, env, def string) string {
	p := flagValue
	if p == "" {
		p = os.Getenv(env)
	}
	if p == "" {
		p = def
	}
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	return p
}

// Init loads the ONNX Runtime shared library and creates the process-wide ONNX Runtime
// environment, with one intra-op thread pool of all cores, spinning between runs, that
// the sessions share (see PoolOptions). libPath follows ResolveLib ("" = environment or
// default). It is idempotent: once a library is loaded, calls with "" or the same
// library return nil. Asking for a different library afterwards is an error, since a
// process holds only one ONNX Runtime environment. Every failure wraps ErrUnavailable
// and is one line that says how to get the library.
func Init(libPath string) error {
	return InitWithPool(libPath, PoolOptions{Spin: true})
}

// InitWithPool is Init with the shared pool's settings, which the first successful call
// of the process fixes; later calls keep the pool they find.
func InitWithPool(libPath string, pool PoolOptions) error {
	path := ResolveLib(libPath)
	state.mu.Lock()
	defer state.mu.Unlock()
	if state.path != "" && (libPath == "" || sameFile(state.path, path)) {
		return nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: library %s not found (run `make ort`, or pass --ort-lib / set %s)", ErrUnavailable, path, LibEnv)
	}
	if st.IsDir() {
		return fmt.Errorf("%w: %s is a directory, not the library (run `make ort`, or pass --ort-lib / set %s)", ErrUnavailable, path, LibEnv)
	}
	if state.path != "" {
		return fmt.Errorf("%w: already initialised from %s, cannot also load %s", ErrUnavailable, state.path, path)
	}
	if pool.Threads <= 0 {
		pool.Threads = runtime.NumCPU()
	}
	if err := createEnv(path, pool); err != nil {
		return fmt.Errorf("%w: cannot load %s: %s (run `make ort` to fetch ONNX Runtime %s)", ErrUnavailable, path, oneLine(err.Error()), VersionWanted)
	}
	// onnxruntime_go (ModelIO) uses the same library, and its environment is this one.
	onnxruntime.SetSharedLibraryPath(path)
	if err := onnxruntime.InitializeEnvironment(onnxruntime.WithLogLevelError()); err != nil {
		return fmt.Errorf("%w: cannot load %s: %s (run `make ort` to fetch ONNX Runtime %s)", ErrUnavailable, path, oneLine(err.Error()), VersionWanted)
	}
	// Conveyor's int8 kernel (the Int8Linear operator) runs on its own threads, as many
	// as ONNX Runtime's intra-op pool.
	kernels.SetInt8Threads(pool.Threads)
	state.path, state.pool = path, pool
	return nil
}

// createEnv loads the library at path and creates the environment with the shared pool.
// It runs once, before onnxruntime_go's own environment, which then is this one (ONNX
// Runtime keeps one environment per process).
func createEnv(path string, pool PoolOptions) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	return status(C.cv_ort_init(cpath, C.int(pool.Threads), C.int(boolInt(pool.Spin))))
}

// Version returns the loaded ONNX Runtime's version string, or "" before Init.
func Version() string {
	if !initialised() {
		return ""
	}
	return C.GoString(C.cv_ort_version())
}

// initialised reports whether Init has succeeded in this process.
func initialised() bool {
	state.mu.Lock()
	defer state.mu.Unlock()
	return state.path != ""
}

// needInit returns the error of a call that needs the environment before Init.
func needInit(what string) error {
	if initialised() {
		return nil
	}
	return fmt.Errorf("%w: %s before ort.Init", ErrUnavailable, what)
}

// status turns a message from capi.c (NULL for success) into an error and frees it.
func status(msg *C.char) error {
	if msg == nil {
		return nil
	}
	defer C.free(unsafe.Pointer(msg))
	return errors.New(oneLine(C.GoString(msg)))
}

// sameFile reports whether a and b name the same file (after following symlinks).
func sameFile(a, b string) bool {
	if a == b {
		return true
	}
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}

// oneLine collapses a multi-line message (ONNX Runtime's often span lines) onto one line.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
