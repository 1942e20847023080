// Package ort owns Conveyor's use of ONNX Runtime: the shared library, the process's one
// environment and its shared intra-op thread pool, Conveyor's own operators,
// execution providers and their devices, device memory, and sessions that run with
// pre-allocated outputs. The runners in models open their sessions and make their
// tensors here, and no other package imports github.com/yalue/onnxruntime_go: this one
// builds on it where it has what Conveyor needs (ModelIO), and calls ONNX Runtime's C
// API itself for the rest (capi.c), by member name through the vendored
// third_party/onnxruntime header, never by a position in the function table.
//
// # The process
//
// Init loads the library (ResolveLib: --ort-lib, $CONVEYOR_ORT_LIB or .ort/) and creates
// the environment with one intra-op pool that sessions share (PoolOptions). It also
// initialises onnxruntime_go on the same library and environment.
//
// # Conveyor's operators
//
// The package that implements Conveyor's ONNX Runtime operators (models/kernels:
// Int8Linear, PagedAttention) hands this one plain C descriptors (op.h: the operator's
// types, and a kernel that reads its attributes, inputs and outputs through a table of
// functions this package fills), and ops.c makes ONNX Runtime custom operators of them
// in one com.conveyor domain, which a session gets with SessionConfig.OwnOps. So this
// package alone compiles against ONNX Runtime's header.
//
// # Devices, sessions and tensors
//
// A Device is the host (CPU) or a device of an execution provider. OpenCUDA attaches
// ONNX Runtime's CUDA provider the way its plugin interface works (the provider library
// registered once per process with RegisterExecutionProviderLibrary, its OrtEpDevice
// picked from GetEpDevices, and SessionOptionsAppendExecutionProvider_V2 on each
// session); what is missing for it (the provider, a CUDA or cuDNN library, a GPU) is one
// line wrapping ErrNoDevice.
//
// NewSession opens a session of this package's own on a device: on the shared pool or
// a pool of its own (SessionConfig.Threads, NoSpin), with Conveyor's operators when asked
// (OwnOps), at a graph optimisation level. Its Run is ONNX Runtime's plain Run with every
// output pre-allocated by the caller; an output may be the very Value given as an input,
// which is how a KV cache on the device is updated in place. ModelIO reads a graph's
// inputs and outputs (names, element types, shapes) before a session is opened. A Value
// wraps host memory the caller owns (NewHostTensor, no copy) or memory ONNX Runtime
// allocates on a device (NewDeviceTensor); CopyTensors moves data between them.
//
//	if err := ort.Init(""); err != nil { ... }
//	dev, err := ort.OpenCUDA("", 0) // or ort.CPU()
//	sess, err := ort.NewSession("step.onnx", ort.SessionConfig{Device: dev, OwnOps: true})
//	cache, err := ort.NewDeviceTensor(dev, ort.Float16, []int64{blocks, 16, kvHeads, headDim})
//	ids, err := ort.NewHostTensor(ort.Int64, []int64{1, n}, unsafe.Pointer(&idsBuf[0]), 8*n)
//	logits, err := ort.NewHostTensor(ort.Float32, []int64{1, vocab}, unsafe.Pointer(&out[0]), 4*vocab)
//	err = sess.Run([]string{"input_ids", "key_cache"}, []*ort.Value{ids, cache},
//		[]string{"logits", "key_cache_out"}, []*ort.Value{logits, cache})
package ort
