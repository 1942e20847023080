package ort

/*
#include <stdlib.h>
#include "capi.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/conveyor-llm/conveyor/models/int8gemm"
	"github.com/conveyor-llm/conveyor/models/pagedattn"
)

// PoolOptions size the process's shared intra-op pool. Every session whose thread count
// matches runs on one ONNX Runtime thread pool instead of a pool of its own. The paged
// layout opens a session per layer, and with a pool per session each of a step's 25 or
// so runs woke a different sleeping worker. The shared pool's workers spin between runs
// (unless Spin is false), so the next segment finds them awake; they spin at SCHED_IDLE,
// so any other thread of the machine that wants the core (the attention kernel's
// goroutines, the HTTP server, another process) takes it at once.
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

// registerOps adds Conveyor's operators to the OrtSessionOptions at so (NewSession with
// OwnOps), in one com.conveyor domain: an operator added here is known to every session
// that asks for Conveyor's operators.
func registerOps(so unsafe.Pointer) error {
	api := unsafe.Pointer(C.cv_ort_api())
	if api == nil {
		return needInit("registering operators")
	}
	// One com.conveyor domain holds them all: ONNX Runtime refuses two domains of one name.
	return pagedattn.RegisterOp(api, so, int8gemm.CustomOp())
}
