// The CUDA runtime's memory figures, read through libcudart (loaded with the CUDA
// provider, which links it), without linking it at build time.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// cv_cuda_mem_info writes device id's free and total memory in bytes. It returns NULL, or
// a message the caller frees.
char *cv_cuda_mem_info(const char *cudart, int id, size_t *free_bytes, size_t *total_bytes) {
	void *lib = dlopen(cudart, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		return strdup(dlerror());
	}
	int (*set_device)(int) = (int (*)(int))dlsym(lib, "cudaSetDevice");
	int (*mem_get_info)(size_t *, size_t *) = (int (*)(size_t *, size_t *))dlsym(lib, "cudaMemGetInfo");
	if (set_device == NULL || mem_get_info == NULL) {
		return strdup("cudaSetDevice or cudaMemGetInfo not found");
	}
	char buf[96];
	int rc = set_device(id);
	if (rc == 0) {
		rc = mem_get_info(free_bytes, total_bytes);
	}
	if (rc != 0) {
		snprintf(buf, sizeof buf, "CUDA error %d", rc);
		return strdup(buf);
	}
	return NULL;
}
