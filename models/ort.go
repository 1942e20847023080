package models

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/conveyor-llm/conveyor/models/int8gemm"
)

// ORTLibEnv is the environment variable that names the ONNX Runtime shared library
// when no explicit path is given.
const ORTLibEnv = "CONVEYOR_ORT_LIB"

// DefaultORTLib is where `make ort` puts the ONNX Runtime shared library, relative to
// the working directory.
const DefaultORTLib = ".ort/libonnxruntime.so.1"

// ErrORT means the ONNX Runtime shared library could not be found, loaded or initialised.
var ErrORT = errors.New("models: onnx runtime unavailable")

var ortState struct {
	mu   sync.Mutex
	path string // absolute path of the loaded library; "" until InitORT succeeds
}

// ResolveORTLib returns the ONNX Runtime library path to use: flagValue when it is not
// empty, else $CONVEYOR_ORT_LIB when set, else DefaultORTLib relative to the working
// directory. The result is made absolute when possible.
func ResolveORTLib(flagValue string) string {
	p := flagValue
	if p == "" {
		p = os.Getenv(ORTLibEnv)
	}
	if p == "" {
		p = DefaultORTLib
	}
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	return p
}

// InitORT loads the ONNX Runtime shared library and creates the process-wide ONNX
// Runtime environment, with one intra-op thread pool of all cores shared by the
// sessions (see sharedPool). libPath follows ResolveORTLib ("" = environment or default).
// It is idempotent: once a library is loaded, calls with "" or the same library
// return nil. Asking for a different library afterwards is an error, since a process
// holds only one ONNX Runtime environment. Every failure wraps ErrORT and is one line
// that says how to get the library.
func InitORT(libPath string) error {
	return initORT(libPath, poolOptions{spin: true})
}

// poolOptions size the shared intra-op pool (see sharedPool); threads 0 = all cores.
type poolOptions struct {
	threads int
	spin    bool
}

// initORT is InitORT with the shared pool's settings, which the first call of the
// process fixes.
func initORT(libPath string, pool poolOptions) error {
	path := ResolveORTLib(libPath)
	ortState.mu.Lock()
	defer ortState.mu.Unlock()
	if ortState.path != "" && (libPath == "" || sameFile(ortState.path, path)) {
		return nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: library %s not found (run `make ort`, or pass --ort-lib / set %s)", ErrORT, path, ORTLibEnv)
	}
	if st.IsDir() {
		return fmt.Errorf("%w: %s is a directory, not the library (run `make ort`, or pass --ort-lib / set %s)", ErrORT, path, ORTLibEnv)
	}
	if ortState.path != "" {
		return fmt.Errorf("%w: already initialised from %s, cannot also load %s", ErrORT, ortState.path, path)
	}
	if pool.threads <= 0 {
		pool.threads = runtime.NumCPU()
	}
	if err := createSharedPool(path, pool.threads, pool.spin); err != nil {
		return fmt.Errorf("%w: cannot load %s: %s (run `make ort` to fetch ONNX Runtime %s)", ErrORT, path, oneLine(err.Error()), ortVersionWanted)
	}
	ort.SetSharedLibraryPath(path)
	if err := ort.InitializeEnvironment(ort.WithLogLevelError()); err != nil {
		return fmt.Errorf("%w: cannot load %s: %s (run `make ort` to fetch ONNX Runtime %s)", ErrORT, path, oneLine(err.Error()), ortVersionWanted)
	}
	// Conveyor's int8 kernel (the Int8Linear operator) runs on its own threads, as many
	// as ONNX Runtime's intra-op pool.
	int8gemm.SetThreads(pool.threads)
	ortState.path = path
	return nil
}

// ortVersionWanted is the ONNX Runtime release the Makefile fetches and the runner is tested with.
const ortVersionWanted = "1.24.3"

// ORTVersion returns the loaded ONNX Runtime's version string, or "" before InitORT.
func ORTVersion() string {
	ortState.mu.Lock()
	defer ortState.mu.Unlock()
	if ortState.path == "" {
		return ""
	}
	return ort.GetVersion()
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

// oneLine collapses a multi-line message onto one line.
func oneLine(s string) string {
	out := make([]rune, 0, len(s))
	for _, r := range s {
		if r == '\n' || r == '\r' {
			r = ' '
		}
		out = append(out, r)
	}
	return string(out)
}
