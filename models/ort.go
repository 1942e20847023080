package models

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/conveyor-llm/conveyor/models/ort"
	onnx "github.com/yalue/onnxruntime_go"
)

// Package ort (models/ort) owns ONNX Runtime: the library, its environment and shared
// pool, Conveyor's operators, devices. The names below are its, kept here for the
// packages that load ONNX Runtime through models.

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

// newSessionOptions returns ONNX Runtime session options for opts; the caller destroys them.
func newSessionOptions(opts RunnerOptions) (*onnx.SessionOptions, error) {
	so, err := onnx.NewSessionOptions()
	if err != nil {
		return nil, fmt.Errorf("%w: session options: %s", ErrORT, oneLine(err.Error()))
	}
	threads := opts.IntraOpThreads
	if threads == 0 {
		threads = runtime.NumCPU()
	}
	for _, set := range []func() error{
		func() error { return so.SetIntraOpNumThreads(threads) },
		func() error { return so.SetInterOpNumThreads(1) },
		func() error { return so.SetExecutionMode(onnx.ExecutionModeSequential) },
		func() error { return so.SetGraphOptimizationLevel(onnx.GraphOptimizationLevelEnableAll) },
		// A pool of the session's own would be one more thread spinning per session.
		func() error { return so.AddSessionConfigEntry("session.intra_op.allow_spinning", "0") },
		func() error { return so.AddSessionConfigEntry("session.inter_op.allow_spinning", "0") },
	} {
		if err := set(); err != nil {
			so.Destroy()
			return nil, fmt.Errorf("%w: session options: %s", ErrORT, oneLine(err.Error()))
		}
	}
	if err := ort.RegisterOps(so); err != nil {
		so.Destroy()
		return nil, fmt.Errorf("%w: session options: %s", ErrORT, oneLine(err.Error()))
	}
	share, err := ort.SharesPool(threads, !opts.NoSpin)
	if err != nil {
		so.Destroy()
		return nil, err
	}
	if share {
		if err := ort.UseSharedPool(so); err != nil {
			so.Destroy()
			return nil, fmt.Errorf("%w: session options: %s", ErrORT, oneLine(err.Error()))
		}
	}
	return so, nil
}
