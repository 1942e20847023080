package ort

/*
#include <stdlib.h>
#include "capi.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"
)

// SessionConfig configures NewSession.
type SessionConfig struct {
	// Device runs the session: CPU() (nil means CPU()) or a device from OpenCUDA.
	Device *Device
	// Threads is the session's intra-op thread count: 0 (or the shared pool's size) runs
	// it on the process's shared pool, any other count on a pool of its own that never
	// spins.
	Threads int
	// NoSpin keeps the session off a shared pool whose workers spin: a session of the
	// shared pool's size then runs on a pool of its own, which never spins.
	NoSpin bool
	// OwnOps registers Conveyor's own operators with the session (models/kernels): Int8Linear,
	// which int8 step graphs use, and PagedAttention, the CPU's stand-in for
	// com.microsoft.PagedAttention in step graphs.
	OwnOps bool
	// GraphOptLevel is ONNX Runtime's graph optimisation level: 0 = the default (all
	// optimisations), -1 = none, or GraphOptimizationLevel's 1 (basic), 2 (extended),
	// 3 (layout) or 99 (all).
	GraphOptLevel int
	// OptimizedModel, when not empty, is where ONNX Runtime writes the graph as it
	// optimised it when the session is created, to show which fusions it applied.
	OptimizedModel string
	// ProviderOptions are the execution provider's options (the CUDA provider's
	// "enable_cuda_graph", "arena_extend_strategy", ...), for a device other than the CPU.
	ProviderOptions map[string]string
}

// Session is an ONNX Runtime session of its own (not onnxruntime_go's): Run takes
// pre-allocated outputs, which may be inputs too, and tensors in device memory. Run may
// be called from several goroutines at once; Close must not race with Run.
type Session struct {
	mu       sync.RWMutex
	s        *C.OrtSession
	device   *Device
	ins      []string
	outs     []string
	inNames  map[string]*C.char // the C names Run passes, from ONNX Runtime
	outNames map[string]*C.char
}

// NewSession loads the ONNX model at modelPath into a session on cfg.Device.
func NewSession(modelPath string, cfg SessionConfig) (*Session, error) {
	if err := needInit("NewSession"); err != nil {
		return nil, err
	}
	d := cfg.Device
	if d == nil {
		d = CPU()
	}
	level, err := optLevel(cfg.GraphOptLevel)
	if err != nil {
		return nil, err
	}
	threads, err := sessionThreads(SharedPool(), cfg)
	if err != nil {
		return nil, err
	}
	if d.IsCPU() && len(cfg.ProviderOptions) > 0 {
		return nil, fmt.Errorf("ort: provider options %v on the CPU: they are for a device's execution provider", slices.Sorted(maps.Keys(cfg.ProviderOptions)))
	}

	var so *C.OrtSessionOptions
	if err := status(C.cv_ort_session_options(&so, C.int(threads), C.int(level))); err != nil {
		return nil, fmt.Errorf("ort: session options: %w", err)
	}
	defer C.cv_ort_release_session_options(so)
	if cfg.OwnOps {
		if err := registerOps(so); err != nil {
			return nil, fmt.Errorf("ort: session options: %w", err)
		}
	}
	if profile := os.Getenv(ProfileEnv); !d.IsCPU() || profile != "" {
		if err := diagnostics(so, modelPath, d, profile); err != nil {
			return nil, err
		}
	}
	if cfg.OptimizedModel != "" {
		cpath := C.CString(cfg.OptimizedModel)
		defer C.free(unsafe.Pointer(cpath))
		if err := status(C.cv_ort_optimized_model(so, cpath)); err != nil {
			return nil, fmt.Errorf("ort: session options: %w", err)
		}
	}
	if !d.IsCPU() {
		if err := appendProvider(so, d, cfg.ProviderOptions); err != nil {
			return nil, err
		}
	}
	cpath := C.CString(modelPath)
	defer C.free(unsafe.Pointer(cpath))
	s := &Session{device: d}
	sessionCreation.Lock()
	err = status(C.cv_ort_create_session(cpath, so, &s.s))
	sessionCreation.Unlock()
	if err != nil {
		return nil, fmt.Errorf("ort: cannot load %s on %s: %w", modelPath, d.Name(), err)
	}
	var nameErr error
	if s.ins, s.inNames, nameErr = sessionNames(s.s, false); nameErr == nil {
		s.outs, s.outNames, nameErr = sessionNames(s.s, true)
	}
	if nameErr != nil {
		_ = s.Close()
		return nil, fmt.Errorf("ort: %s: %w", modelPath, nameErr)
	}
	return s, nil
}

// sessionThreads returns the own pool's thread count of a session of cfg, or 0 when it
// runs on the shared pool.
func sessionThreads(pool PoolOptions, cfg SessionConfig) (int, error) {
	threads := cfg.Threads
	switch {
	case threads < 0:
		return 0, fmt.Errorf("ort: session threads %d < 0", threads)
	case threads == 0:
		threads = pool.Threads
	}
	if threads == pool.Threads && !(cfg.NoSpin && pool.Spin) {
		return 0, nil
	}
	return threads, nil
}

// sessionCreation serialises the creation of sessions: a session that asks for a
// custom-operator domain registers it in ONNX Runtime's process-wide schema registry as
// it is created, checking first whether it is there, so two sessions created at once
// can both try to add com.conveyor, and the second fails ("the domain is already
// exist").
var sessionCreation sync.Mutex

// ProfileEnv names the environment variable that turns ONNX Runtime's profiler on: every
// session then writes a Chrome trace of its runs (each node's time and execution
// provider) to <value>_<model>_<date>.json when it closes.
const ProfileEnv = "CONVEYOR_ORT_PROFILE"

// diagnostics makes a session on a device log ONNX Runtime's warnings, among them the
// nodes its execution provider could not take and left to the CPU, and turns the profiler
// on when profile is not empty.
func diagnostics(so *C.OrtSessionOptions, modelPath string, d *Device, profile string) error {
	id := C.CString(filepath.Base(filepath.Dir(modelPath)) + "/" + filepath.Base(modelPath))
	defer C.free(unsafe.Pointer(id))
	var prefix *C.char
	if profile != "" {
		name := strings.TrimSuffix(filepath.Base(modelPath), filepath.Ext(modelPath))
		prefix = C.CString(profile + "_" + name)
		defer C.free(unsafe.Pointer(prefix))
	}
	if d.IsCPU() && prefix == nil {
		return nil
	}
	if err := status(C.cv_ort_session_diagnostics(so, id, prefix)); err != nil {
		return fmt.Errorf("ort: session diagnostics: %w", err)
	}
	return nil
}

// optLevel maps SessionConfig.GraphOptLevel to ONNX Runtime's GraphOptimizationLevel.
func optLevel(l int) (int, error) {
	switch l {
	case 0:
		return C.ORT_ENABLE_ALL, nil
	case -1:
		return C.ORT_DISABLE_ALL, nil
	case C.ORT_ENABLE_BASIC, C.ORT_ENABLE_EXTENDED, C.ORT_ENABLE_LAYOUT, C.ORT_ENABLE_ALL:
		return l, nil
	}
	return 0, fmt.Errorf("ort: graph optimisation level %d: want 0 (default), -1 (none), 1, 2, 3 or 99", l)
}

// appendProvider attaches the execution provider of device d, with its options, to so.
func appendProvider(so *C.OrtSessionOptions, d *Device, opts map[string]string) error {
	keys := slices.Sorted(maps.Keys(opts))
	ck := make([]*C.char, len(keys))
	cv := make([]*C.char, len(keys))
	for i, k := range keys {
		ck[i], cv[i] = C.CString(k), C.CString(opts[k])
	}
	defer func() {
		for i := range ck {
			C.free(unsafe.Pointer(ck[i]))
			C.free(unsafe.Pointer(cv[i]))
		}
	}()
	var kp, vp **C.char
	if len(keys) > 0 {
		kp, vp = &ck[0], &cv[0]
	}
	if err := status(C.cv_ort_append_ep(so, d.ep, kp, vp, C.size_t(len(keys)))); err != nil {
		return fmt.Errorf("ort: %s's execution provider: %w", d.Name(), err)
	}
	return nil
}

// sessionNames reads the session's input (outputs false) or output names.
func sessionNames(s *C.OrtSession, outputs bool) ([]string, map[string]*C.char, error) {
	var list **C.char
	var n C.size_t
	if err := status(C.cv_ort_session_names(s, C.int(boolInt(outputs)), &list, &n)); err != nil {
		return nil, nil, err
	}
	defer C.free(unsafe.Pointer(list))
	names := make([]string, int(n))
	byName := make(map[string]*C.char, int(n))
	for i, p := range unsafe.Slice(list, int(n)) {
		names[i] = C.GoString(p)
		byName[names[i]] = p // freed by Close
	}
	return names, byName, nil
}

// Device returns the device the session runs on.
func (s *Session) Device() *Device { return s.device }

// InputNames returns the graph's input names in order.
func (s *Session) InputNames() []string { return slices.Clone(s.ins) }

// OutputNames returns the graph's output names in order.
func (s *Session) OutputNames() []string { return slices.Clone(s.outs) }

// Run runs the graph once. inputs[i] feeds the input named inputNames[i]; outputs[j]
// receives the output named outputNames[j]. Every output is pre-allocated by the caller
// with the output's type and shape (NewHostTensor, NewDeviceTensor), on the device the
// graph produces it on; ONNX Runtime writes into it. An output may be the very Value
// given as an input: a KV cache is updated in place that way.
func (s *Session) Run(inputNames []string, inputs []*Value, outputNames []string, outputs []*Value) error {
	switch {
	case len(inputNames) != len(inputs):
		return fmt.Errorf("ort: Run: %d input names, %d inputs", len(inputNames), len(inputs))
	case len(outputNames) != len(outputs):
		return fmt.Errorf("ort: Run: %d output names, %d outputs", len(outputNames), len(outputs))
	case len(outputs) == 0:
		return errors.New("ort: Run: no outputs")
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.s == nil {
		return errors.New("ort: Run on a closed session")
	}
	cin, vin, err := runArgs("input", s.inNames, inputNames, inputs)
	if err != nil {
		return err
	}
	cout, vout, err := runArgs("output", s.outNames, outputNames, outputs)
	if err != nil {
		return err
	}
	var cinp **C.char
	var vinp **C.OrtValue
	if len(cin) > 0 {
		cinp, vinp = &cin[0], &vin[0]
	}
	err = status(C.cv_ort_run(s.s, cinp, vinp, C.size_t(len(cin)), &cout[0], &vout[0], C.size_t(len(cout))))
	runtime.KeepAlive(inputs)
	runtime.KeepAlive(outputs)
	if err != nil {
		return fmt.Errorf("ort: Run: %w", err)
	}
	return nil
}

// runArgs returns the C names and values of one side of a Run.
func runArgs(side string, known map[string]*C.char, names []string, values []*Value) ([]*C.char, []*C.OrtValue, error) {
	cn := make([]*C.char, len(names))
	cv := make([]*C.OrtValue, len(values))
	for i, name := range names {
		p, ok := known[name]
		if !ok {
			return nil, nil, fmt.Errorf("ort: Run: the graph has no %s %q", side, name)
		}
		if !values[i].live() {
			return nil, nil, fmt.Errorf("ort: Run: %s %q is nil or released", side, name)
		}
		cn[i], cv[i] = p, values[i].h.v
	}
	return cn, cv, nil
}

// Close releases the session. It is idempotent.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.s == nil {
		return nil
	}
	C.cv_ort_release_session(s.s)
	s.s = nil
	for _, m := range []map[string]*C.char{s.inNames, s.outNames} {
		for _, p := range m {
			C.free(unsafe.Pointer(p))
		}
	}
	s.inNames, s.outNames = nil, nil
	return nil
}
