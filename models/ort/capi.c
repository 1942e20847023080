// Conveyor's calls into ONNX Runtime's C API, through the OrtApi table by member name
// (the vendored onnxruntime_c_api.h). See capi.h and the Go side (lib.go, pool.go,
// device.go, session.go, value.go).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi.h"

static const OrtApiBase *base;
static const OrtApi *api;
static OrtEnv *env;		     // the process's environment; lives as long as the process
static OrtMemoryInfo *cpu_info;	     // host memory, for tensors over caller memory
static int idle_workers;	     // the shared pool's workers run at SCHED_IDLE
static char empty_data[8];	     // the backing of zero-sized host tensors

// take turns an OrtStatus into a malloc'ed message (NULL for success) and releases it.
static char *take(OrtStatus *st) {
	if (st == NULL) {
		return NULL;
	}
	char *msg = strdup(api->GetErrorMessage(st));
	api->ReleaseStatus(st);
	return msg;
}

static char *fail(const char *msg) { return strdup(msg); }

typedef struct {
	OrtThreadWorkerFn fn;
	void *param;
} worker_start;

static void *worker_main(void *arg) {
	worker_start s = *(worker_start *)arg;
	free(arg);
	if (idle_workers) {
		struct sched_param sp = {0};
		pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
	}
	s.fn(s.param);
	return NULL;
}

static OrtCustomThreadHandle create_worker(void *opts, OrtThreadWorkerFn fn, void *param) {
	(void)opts;
	pthread_t *t = malloc(sizeof *t);
	worker_start *s = malloc(sizeof *s);
	if (t == NULL || s == NULL) {
		free(t);
		free(s);
		return NULL;
	}
	s->fn = fn;
	s->param = param;
	if (pthread_create(t, NULL, worker_main, s) != 0) {
		free(t);
		free(s);
		return NULL;
	}
	return (OrtCustomThreadHandle)t;
}

static void join_worker(OrtCustomThreadHandle h) {
	pthread_t *t = (pthread_t *)h;
	pthread_join(*t, NULL);
	free(t);
}

const OrtApi *cv_ort_api(void) { return api; }

const char *cv_ort_version(void) { return base == NULL ? "" : base->GetVersionString(); }

// cv_ort_init loads the library at path and creates ONNX Runtime's process environment
// with one intra-op pool of threads threads shared by every session. It must run before
// any other environment exists: a later CreateEnv (onnxruntime_go's) returns this one.
char *cv_ort_init(const char *path, int threads, int spin) {
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		return strdup(dlerror());
	}
	const OrtApiBase *(*get_base)(void) = (const OrtApiBase *(*)(void))dlsym(lib, "OrtGetApiBase");
	if (get_base == NULL) {
		return fail("OrtGetApiBase not found");
	}
	const OrtApiBase *b = get_base();
	const OrtApi *a = b->GetApi(ORT_API_VERSION);
	if (a == NULL) {
		char msg[160];
		snprintf(msg, sizeof msg, "ONNX Runtime %s lacks C API version %d", b->GetVersionString(), ORT_API_VERSION);
		return strdup(msg);
	}
	base = b;
	api = a;
	OrtThreadingOptions *opts = NULL;
	char *msg = take(api->CreateThreadingOptions(&opts));
	if (msg != NULL) {
		return msg;
	}
	msg = take(api->SetGlobalIntraOpNumThreads(opts, threads));
	if (msg == NULL) {
		msg = take(api->SetGlobalInterOpNumThreads(opts, 1));
	}
	if (msg == NULL) {
		msg = take(api->SetGlobalSpinControl(opts, spin));
	}
	idle_workers = spin; // a spinning worker must not keep a core from anyone else
	if (msg == NULL) {
		msg = take(api->SetGlobalCustomCreateThreadFn(opts, create_worker));
	}
	if (msg == NULL) {
		msg = take(api->SetGlobalCustomJoinThreadFn(opts, join_worker));
	}
	if (msg == NULL) {
		msg = take(api->CreateEnvWithGlobalThreadPools(ORT_LOGGING_LEVEL_ERROR, "conveyor", opts, &env));
	}
	api->ReleaseThreadingOptions(opts);
	if (msg == NULL) {
		msg = take(api->CreateCpuMemoryInfo(OrtDeviceAllocator, OrtMemTypeDefault, &cpu_info));
	}
	return msg;
}

char *cv_ort_register_ep(const char *name, const char *path) {
	return take(api->RegisterExecutionProviderLibrary(env, name, path));
}

char *cv_ort_ep_devices(const OrtEpDevice *const **devices, size_t *n) {
	return take(api->GetEpDevices(env, devices, n));
}

const char *cv_ort_ep_name(const OrtEpDevice *d) { return api->EpDevice_EpName(d); }

const char *cv_ort_ep_vendor(const OrtEpDevice *d) {
	const OrtHardwareDevice *hw = api->EpDevice_Device(d);
	return hw == NULL ? NULL : api->HardwareDevice_Vendor(hw);
}

// cv_ort_ep_meta returns the value of key in the device's hardware metadata, then in the
// execution provider's, or NULL.
const char *cv_ort_ep_meta(const OrtEpDevice *d, const char *key) {
	const OrtHardwareDevice *hw = api->EpDevice_Device(d);
	const char *v = NULL;
	if (hw != NULL && api->HardwareDevice_Metadata(hw) != NULL) {
		v = api->GetKeyValue(api->HardwareDevice_Metadata(hw), key);
	}
	if (v == NULL && api->EpDevice_EpMetadata(d) != NULL) {
		v = api->GetKeyValue(api->EpDevice_EpMetadata(d), key);
	}
	return v;
}

// cv_ort_session_diagnostics makes a session log ONNX Runtime's warnings from its
// creation on (which nodes an execution provider could not take, say), with log_id naming
// it, and, when profile_prefix is not empty, write a Chrome trace of every run's nodes to
// profile_prefix_<date>.json when the session is released.
char *cv_ort_session_diagnostics(OrtSessionOptions *so, const char *log_id, const char *profile_prefix) {
	char *msg = take(api->SetSessionLogSeverityLevel(so, ORT_LOGGING_LEVEL_WARNING));
	if (msg == NULL) {
		msg = take(api->SetSessionLogId(so, log_id));
	}
	if (msg == NULL && profile_prefix != NULL && profile_prefix[0] != 0) {
		msg = take(api->EnableProfiling(so, profile_prefix));
	}
	return msg;
}

// cv_ort_session_options makes session options for a sequential session: on the shared
// pool when own_threads is 0, else on a pool of own_threads threads that never spins.
char *cv_ort_session_options(OrtSessionOptions **out, int own_threads, int opt_level) {
	OrtSessionOptions *so = NULL;
	char *msg = take(api->CreateSessionOptions(&so));
	if (msg != NULL) {
		return msg;
	}
	msg = take(api->SetSessionExecutionMode(so, ORT_SEQUENTIAL));
	if (msg == NULL) {
		msg = take(api->SetSessionGraphOptimizationLevel(so, (GraphOptimizationLevel)opt_level));
	}
	if (msg == NULL && own_threads == 0) {
		msg = take(api->DisablePerSessionThreads(so));
	}
	if (msg == NULL && own_threads > 0) {
		msg = take(api->SetIntraOpNumThreads(so, own_threads));
		if (msg == NULL) {
			msg = take(api->SetInterOpNumThreads(so, 1));
		}
		if (msg == NULL) {
			msg = take(api->AddSessionConfigEntry(so, "session.intra_op.allow_spinning", "0"));
		}
		if (msg == NULL) {
			msg = take(api->AddSessionConfigEntry(so, "session.inter_op.allow_spinning", "0"));
		}
	}
	if (msg != NULL) {
		api->ReleaseSessionOptions(so);
		return msg;
	}
	*out = so;
	return NULL;
}

char *cv_ort_optimized_model(OrtSessionOptions *so, const char *path) {
	return take(api->SetOptimizedModelFilePath(so, path));
}

char *cv_ort_append_ep(OrtSessionOptions *so, const OrtEpDevice *d, const char *const *keys,
		       const char *const *values, size_t n) {
	return take(api->SessionOptionsAppendExecutionProvider_V2(so, env, &d, 1, keys, values, n));
}

char *cv_ort_create_session(const char *model, OrtSessionOptions *so, OrtSession **out) {
	return take(api->CreateSession(env, model, so, out));
}

void cv_ort_release_session_options(OrtSessionOptions *so) { api->ReleaseSessionOptions(so); }

void cv_ort_release_session(OrtSession *s) { api->ReleaseSession(s); }

// cv_ort_session_names returns the session's input (outputs 0) or output names as a
// malloc'ed array of malloc'ed strings.
char *cv_ort_session_names(const OrtSession *s, int outputs, char ***names, size_t *n) {
	OrtAllocator *alloc = NULL;
	char *msg = take(api->GetAllocatorWithDefaultOptions(&alloc));
	if (msg == NULL) {
		msg = take(outputs ? api->SessionGetOutputCount(s, n) : api->SessionGetInputCount(s, n));
	}
	if (msg != NULL) {
		return msg;
	}
	char **out = calloc(*n == 0 ? 1 : *n, sizeof *out);
	if (out == NULL) {
		return fail("out of memory");
	}
	for (size_t i = 0; i < *n && msg == NULL; i++) {
		char *name = NULL;
		msg = take(outputs ? api->SessionGetOutputName(s, i, alloc, &name) : api->SessionGetInputName(s, i, alloc, &name));
		if (msg == NULL) {
			out[i] = strdup(name);
			msg = take(api->AllocatorFree(alloc, name));
		}
	}
	if (msg != NULL) {
		for (size_t i = 0; i < *n; i++) {
			free(out[i]);
		}
		free(out);
		return msg;
	}
	*names = out;
	return NULL;
}

// cv_ort_run runs the session with every output pre-allocated by the caller.
char *cv_ort_run(OrtSession *s, const char *const *in_names, const OrtValue *const *ins, size_t nin,
		 const char *const *out_names, OrtValue **outs, size_t nout) {
	OrtValue *few[64];
	OrtValue **given = few; // a decoder of more than 31 layers has more outputs
	if (nout > sizeof few / sizeof few[0]) {
		given = malloc(nout * sizeof *given);
		if (given == NULL) {
			return fail("out of memory");
		}
	}
	memcpy(given, outs, nout * sizeof *outs);
	char *msg = take(api->Run(s, NULL, in_names, ins, nin, out_names, nout, outs));
	for (size_t i = 0; i < nout; i++) {
		if (outs[i] != given[i]) { // never expected: ONNX Runtime fills pre-allocated outputs
			api->ReleaseValue(outs[i]);
			outs[i] = given[i];
			if (msg == NULL) {
				msg = fail("ONNX Runtime replaced a pre-allocated output");
			}
		}
	}
	if (given != few) {
		free(given);
	}
	return msg;
}

char *cv_ort_host_tensor(int type, const int64_t *shape, size_t rank, void *data, size_t nbytes, OrtValue **out) {
	if (data == NULL) {
		data = empty_data; // ONNX Runtime wants memory even for no elements
	}
	return take(api->CreateTensorWithDataAsOrtValue(cpu_info, data, nbytes, shape, rank,
							(ONNXTensorElementDataType)type, out));
}

// cv_ort_device_tensor allocates a tensor in the device's memory (d NULL: host memory)
// with ONNX Runtime's shared allocator for it.
char *cv_ort_device_tensor(const OrtEpDevice *d, int type, const int64_t *shape, size_t rank, OrtValue **out) {
	OrtAllocator *alloc = NULL;
	const OrtMemoryInfo *info = d == NULL ? NULL : api->EpDevice_MemoryInfo(d, OrtDeviceMemoryType_DEFAULT);
	char *msg = NULL;
	if (info == NULL) { // the host, or a device whose provider works in host memory
		msg = take(api->GetAllocatorWithDefaultOptions(&alloc));
	} else {
		msg = take(api->GetSharedAllocator(env, info, &alloc));
		if (msg == NULL && alloc == NULL) {
			msg = fail("the device has no shared allocator");
		}
	}
	if (msg != NULL) {
		return msg;
	}
	return take(api->CreateTensorAsOrtValue(alloc, shape, rank, (ONNXTensorElementDataType)type, out));
}

// cv_ort_tensor_info reads a tensor's element type and up to cap dimensions; rank gets
// the tensor's full rank.
char *cv_ort_tensor_info(const OrtValue *v, int *type, int64_t *dims, size_t cap, size_t *rank) {
	OrtTensorTypeAndShapeInfo *info = NULL;
	char *msg = take(api->GetTensorTypeAndShape(v, &info));
	if (msg != NULL) {
		return msg;
	}
	ONNXTensorElementDataType t = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
	msg = take(api->GetTensorElementType(info, &t));
	if (msg == NULL) {
		msg = take(api->GetDimensionsCount(info, rank));
	}
	if (msg == NULL) {
		msg = take(api->GetDimensions(info, dims, *rank < cap ? *rank : cap));
	}
	api->ReleaseTensorTypeAndShapeInfo(info);
	*type = (int)t;
	return msg;
}

char *cv_ort_tensor_data(OrtValue *v, void **out) { return take(api->GetTensorMutableData(v, out)); }

int cv_ort_tensor_on_host(const OrtValue *v) {
	const OrtMemoryInfo *info = NULL;
	char *msg = take(api->GetTensorMemoryInfo(v, &info));
	if (msg != NULL) {
		free(msg);
		return 0;
	}
	OrtMemoryInfoDeviceType t = OrtMemoryInfoDeviceType_GPU;
	api->MemoryInfoGetDeviceType(info, &t);
	return t == OrtMemoryInfoDeviceType_CPU;
}

void cv_ort_release_value(OrtValue *v) { api->ReleaseValue(v); }

char *cv_ort_copy(const OrtValue *const *src, OrtValue *const *dst, size_t n) {
	return take(api->CopyTensors(env, src, dst, NULL, n));
}
