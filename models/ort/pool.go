package ort

/*
#include <stdlib.h>
#include "capi.h"
*/
import "C"

import (
	"fmt"
	"sync"

	"github.com/conveyor-llm/conveyor/models/kernels"
)

// PoolOptions size the process's shared intra-op pool. Every session whose thread count
// matches runs on one ONNX Runtime thread pool instead of a pool of its own: a served
// model and its draft model, or the sessions a process reopens, share its workers. The
// pool's workers spin between runs (unless Spin is false), so the next run finds them
// awake; they spin at SCHED_IDLE, so any other thread of the machine that wants the core
// (Conveyor's kernel threads, the HTTP server, another process) takes it at once.
//
// Measured on a 2-core EPYC (Zen 4), Qwen2.5-0.5B shape, int8, DecodeStepInt8 past 128:
// batch 1 23.6 ms against 27.6 ms with a pool per session, batch 16 64 against 70 ms.
type PoolOptions struct {
	// Threads is the pool's intra-op thread count; 0 = all cores.
	Threads int
	// Spin lets idle workers spin (at SCHED_IDLE) between runs instead of sleeping.
	Spin bool
}

// SharedPool returns the shared pool Init created (Threads 0 before Init).
func SharedPool() PoolOptions {
	state.mu.Lock()
	defer state.mu.Unlock()
	return state.pool
}

// SharesPool reports whether a session of threads intra-op threads that wants its
// workers to spin (or not) runs on the shared pool: when the sizes match and the pool
// spins as asked. One that must not spin gets a pool of its own (which never spins);
// spinning cannot be had once the process's pool was made without it.
func SharesPool(threads int, spin bool) (bool, error) {
	return sharesPool(SharedPool(), threads, spin)
}

func sharesPool(pool PoolOptions, threads int, spin bool) (bool, error) {
	switch {
	case threads != pool.Threads:
		return false, nil
	case spin && !pool.Spin:
		return false, fmt.Errorf("%w: this process's ONNX Runtime pool was created without spinning; open the runner with NoSpin", ErrUnavailable)
	}
	return spin == pool.Spin, nil
}

// ownOps are the descriptors (op.h) of Conveyor's operators (models/kernels): PagedAttention,
// one per cache type, and Int8Linear.
func ownOps() []*C.cv_op_desc {
	var descs []*C.cv_op_desc
	for _, d := range append(kernels.PagedOpDescs(), kernels.Int8OpDesc()) {
		descs = append(descs, (*C.cv_op_desc)(d))
	}
	return descs
}

// registering serialises registerOps, which makes the com.conveyor domain at its first
// call.
var registering sync.Mutex

// registerOps adds Conveyor's operators to so (NewSession with OwnOps), in one
// com.conveyor domain (ONNX Runtime refuses two domains of one name): an operator added
// to ownOps is known to every session that asks for Conveyor's operators.
func registerOps(so *C.OrtSessionOptions) error {
	if C.cv_ort_api() == nil {
		return needInit("registering operators")
	}
	descs := ownOps()
	registering.Lock()
	defer registering.Unlock()
	if err := status(C.cv_ort_register_ops(so, &descs[0], C.size_t(len(descs)))); err != nil {
		return fmt.Errorf("registering %s's operators: %w", C.CV_OP_DOMAIN, err)
	}
	return nil
}
