package models

/*
#cgo LDFLAGS: -ldl -lpthread
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The members of ONNX Runtime's OrtApi function table used here, by position. The
// table only ever grows at its end (onnxruntime_c_api.h: "the order of the functions
// must never change"), so these positions hold for every release since 1.16.
enum {
	apiGetErrorMessage = 2,
	apiReleaseEnv = 92,
	apiReleaseStatus = 93,
	apiCreateEnvWithGlobalThreadPools = 119,
	apiDisablePerSessionThreads = 120,
	apiCreateThreadingOptions = 121,
	apiReleaseThreadingOptions = 122,
	apiSetGlobalIntraOpNumThreads = 147,
	apiSetGlobalInterOpNumThreads = 148,
	apiSetGlobalSpinControl = 149,
	apiSetGlobalCustomCreateThreadFn = 199,
	apiSetGlobalCustomJoinThreadFn = 201,
	apiVersionWanted = 16, // the oldest C API version that has all of the above
};

typedef void *(*getApiFn)(uint32_t);
typedef struct { getApiFn GetApi; const char *(*GetVersionString)(void); } apiBase;
typedef void *(*statusFn1)(void *);
typedef void *(*statusFn2)(void *, int);
typedef void *(*createEnvFn)(int, const char *, const void *, void **);
typedef const char *(*errorMessageFn)(const void *);
typedef void (*releaseFn)(void *);

static void *const *ortApi;
static int idleWorkers;

typedef struct { void (*fn)(void *); void *param; } workerStart;

static void *workerMain(void *arg) {
	workerStart s = *(workerStart *)arg;
	free(arg);
	if (idleWorkers) {
		struct sched_param sp = {0};
		pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
	}
	s.fn(s.param);
	return NULL;
}

static const void *createWorker(void *opts, void (*fn)(void *), void *param) {
	pthread_t *t = malloc(sizeof *t);
	workerStart *s = malloc(sizeof *s);
	if (t == NULL || s == NULL) {
		free(t);
		free(s);
		return NULL;
	}
	s->fn = fn;
	s->param = param;
	if (pthread_create(t, NULL, workerMain, s) != 0) {
		free(t);
		free(s);
		return NULL;
	}
	return t;
}

static void joinWorker(const void *h) {
	pthread_t *t = (pthread_t *)h;
	pthread_join(*t, NULL);
	free(t);
}
typedef void *(*setFnFn)(void *, const void *);

// takeStatus turns an OrtStatus into a malloc'ed message (NULL for success) and
// releases it.
static char *takeStatus(void *st) {
	if (st == NULL) {
		return NULL;
	}
	char *msg = strdup(((errorMessageFn)ortApi[apiGetErrorMessage])(st));
	((releaseFn)ortApi[apiReleaseStatus])(st);
	return msg;
}

// conveyorOrtApi returns the OrtApi function table (NULL before conveyorGlobalPools).
static const void *conveyorOrtApi(void) { return (const void *)ortApi; }

// conveyorGlobalPools loads the library at path and creates ONNX Runtime's process
// environment with one intra-op pool of threads threads shared by every session.
// It must run before any other environment exists: a later CreateEnv returns this one.
static char *conveyorGlobalPools(const char *path, int threads, int spin) {
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		return strdup(dlerror());
	}
	const apiBase *(*getBase)(void) = (const apiBase *(*)(void))dlsym(lib, "OrtGetApiBase");
	if (getBase == NULL) {
		return strdup("OrtGetApiBase not found");
	}
	ortApi = (void *const *)getBase()->GetApi(apiVersionWanted);
	if (ortApi == NULL) {
		return strdup("the library does not offer the C API version needed");
	}
	void *opts = NULL;
	char *msg = takeStatus(((statusFn1)ortApi[apiCreateThreadingOptions])(&opts));
	if (msg != NULL) {
		return msg;
	}
	msg = takeStatus(((statusFn2)ortApi[apiSetGlobalIntraOpNumThreads])(opts, threads));
	if (msg == NULL) {
		msg = takeStatus(((statusFn2)ortApi[apiSetGlobalInterOpNumThreads])(opts, 1));
	}
	if (msg == NULL) {
		msg = takeStatus(((statusFn2)ortApi[apiSetGlobalSpinControl])(opts, spin));
	}
	idleWorkers = spin; // a spinning worker must not keep a core from anyone else
	if (msg == NULL) {
		msg = takeStatus(((setFnFn)ortApi[apiSetGlobalCustomCreateThreadFn])(opts, (const void *)createWorker));
	}
	if (msg == NULL) {
		msg = takeStatus(((setFnFn)ortApi[apiSetGlobalCustomJoinThreadFn])(opts, (const void *)joinWorker));
	}
	void *env = NULL;
	if (msg == NULL) {
		// ORT_LOGGING_LEVEL_ERROR = 3. The environment lives as long as the process.
		msg = takeStatus(((createEnvFn)ortApi[apiCreateEnvWithGlobalThreadPools])(3, "conveyor", opts, &env));
	}
	((releaseFn)ortApi[apiReleaseThreadingOptions])(opts);
	return msg;
}

static char *conveyorSharePools(void *sessionOptions) {
	return takeStatus(((statusFn1)ortApi[apiDisablePerSessionThreads])(sessionOptions));
}
*/
import "C"

import (
	"errors"
	"unsafe"

	ort "github.com/yalue/onnxruntime_go"

	"github.com/conveyor-llm/conveyor/models/int8gemm"
	"github.com/conveyor-llm/conveyor/models/pagedattn"
)

// The shared intra-op pool. Every session of the process whose thread count matches
// runs on one ONNX Runtime thread pool instead of a pool of its own. The paged layout
// opens a session per layer, and with a pool per session each of a step's 25 or so
// runs woke a different sleeping worker. The shared pool's workers spin between runs
// (unless RunnerOptions.NoSpin), so the next segment finds them awake; they spin at
// SCHED_IDLE, so any other thread of the machine that wants the core (the attention
// kernel's goroutines, the HTTP server, another process) takes it at once.
//
// Measured on a 2-core EPYC (Zen 4), Qwen2.5-0.5B shape, int8, DecodeStepInt8 past 128:
// batch 1 23.6 ms against 27.6 ms with a pool per session, batch 16 64 against 70 ms.
var sharedPool struct {
	threads int // 0 = none: sessions keep per-session pools
	spin    bool
}

// createSharedPool creates the process's ONNX Runtime environment with a shared pool
// of threads intra-op threads. It runs once, before onnxruntime_go's own environment,
// which then is this one (ONNX Runtime keeps one environment per process).
func createSharedPool(path string, threads int, spin bool) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	s := 0
	if spin {
		s = 1
	}
	if msg := C.conveyorGlobalPools(cpath, C.int(threads), C.int(s)); msg != nil {
		defer C.free(unsafe.Pointer(msg))
		return errors.New(C.GoString(msg))
	}
	sharedPool.threads, sharedPool.spin = threads, spin
	return nil
}

// sessionOptionsPtr returns the C OrtSessionOptions pointer of so: onnxruntime_go's
// SessionOptions holds it as its only field.
func sessionOptionsPtr(so *ort.SessionOptions) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(so))
}

// registerOps adds Conveyor's own ONNX Runtime operators (int8gemm's Int8Linear, which
// the paged segments of int8 builds use, and pagedattn's PagedAttention, the CPU's
// stand-in for com.microsoft.PagedAttention in one-graph steps) to so.
func registerOps(so *ort.SessionOptions) error {
	// One com.conveyor domain holds both: ONNX Runtime refuses two domains of one name.
	return pagedattn.RegisterOp(C.conveyorOrtApi(), sessionOptionsPtr(so), int8gemm.CustomOp())
}

// useSharedPool makes a session opened with so run on the shared pool.
func useSharedPool(so *ort.SessionOptions) error {
	if sharedPool.threads == 0 {
		return errors.New("no shared thread pool")
	}
	p := sessionOptionsPtr(so)
	if p == nil {
		return errors.New("session options not initialised")
	}
	if msg := C.conveyorSharePools(p); msg != nil {
		defer C.free(unsafe.Pointer(msg))
		return errors.New(C.GoString(msg))
	}
	return nil
}
