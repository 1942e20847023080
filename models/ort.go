package models

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/conveyor-llm/conveyor/models/ort"
)

// Package ort (models/ort) owns ONNX Runtime: the library, its environment and shared
// pool, Conveyor's operators, devices, sessions and tensors. The names below are its,
// kept here for the packages that load ONNX Runtime through models.

// ORTLibEnv is the environment variable that names the ONNX Runtime shared library
// when no explicit path is given (ort.LibEnv).
const ORTLibEnv = ort.LibEnv

// DefaultORTLib is where `make ort` puts the ONNX Runtime shared library, relative to
// the working directory (ort.DefaultLib).
const DefaultORTLib = ort.DefaultLib

// ErrORT means the ONNX Runtime shared library could not be found, loaded or
// initialised (ort.ErrUnavailable).
var ErrORT = ort.ErrUnavailable

// InitORT loads the ONNX Runtime shared library and creates the process's environment
// with its shared pool of all cores (ort.Init).
func InitORT(libPath string) error { return ort.Init(libPath) }

// ORTVersion returns the loaded ONNX Runtime's version string, or "" before InitORT
// (ort.Version).
func ORTVersion() string { return ort.Version() }

// oneLine collapses a multi-line message (ONNX Runtime's often span lines) onto one line.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

// pool returns the shared pool's settings these options ask for.
func (o RunnerOptions) pool() ort.PoolOptions {
	return ort.PoolOptions{Threads: o.IntraOpThreads, Spin: !o.NoSpin}
}

// openSession opens the ONNX model at path in a session on the CPU for a runner of
// opts, with Conveyor's operators: on the shared pool when its size and spinning are
// what opts ask for, else on a pool of the session's own, which never spins. A runner
// that asks to spin is refused when the shared pool was made without spinning.
func openSession(path string, opts RunnerOptions) (*ort.Session, error) {
	threads := opts.IntraOpThreads
	if threads == 0 {
		threads = runtime.NumCPU()
	}
	if _, err := ort.SharesPool(threads, !opts.NoSpin); err != nil {
		return nil, err
	}
	s, err := ort.NewSession(path, ort.SessionConfig{Threads: threads, NoSpin: opts.NoSpin, OwnOps: true})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrModelDir, err)
	}
	return s, nil
}

// hostTensor wraps xs, Go memory, as a tensor of type t and shape shape, without a
// copy (ort.NewHostTensor); the caller releases it.
func hostTensor[E any](t ort.ElemType, shape []int64, xs []E) (*ort.Value, error) {
	var p unsafe.Pointer
	if len(xs) > 0 {
		p = unsafe.Pointer(&xs[0])
	}
	return ort.NewHostTensor(t, shape, p, len(xs)*int(unsafe.Sizeof(*new(E))))
}
