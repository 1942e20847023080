// CPU feature detection for every kernel of the package (simd.h), done once.
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "simd.h"

#if defined(__x86_64__)
#include <cpuid.h>

// cv_cpu_amx reports whether the CPU has AMX-TILE and AMX-INT8 and the OS enabled their
// state (XCR0 bits 17 and 18).
static int cv_cpu_amx(void) {
	unsigned a, b, c, d;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || (d & (1u << 24)) == 0 || (d & (1u << 25)) == 0) {
		return 0;
	}
	if (!__get_cpuid(1, &a, &b, &c, &d) || (c & (1u << 27)) == 0) { // OSXSAVE
		return 0;
	}
	unsigned lo, hi;
	__asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (lo & (3u << 17)) == (3u << 17);
}
#endif

// cv_cpu_detect asks the CPU. __builtin_cpu_supports checks XCR0 for the AVX and AVX-512
// register state as well as CPUID.
static unsigned cv_cpu_detect(void) {
	unsigned f = 0;
#if defined(__x86_64__)
	__builtin_cpu_init();
	f |= __builtin_cpu_supports("avx2") ? CV_CPU_AVX2 : 0;
	f |= __builtin_cpu_supports("fma") ? CV_CPU_FMA : 0;
	f |= __builtin_cpu_supports("f16c") ? CV_CPU_F16C : 0;
	f |= __builtin_cpu_supports("avx512f") ? CV_CPU_AVX512F : 0;
	f |= __builtin_cpu_supports("avx512bw") ? CV_CPU_AVX512BW : 0;
	f |= __builtin_cpu_supports("avx512vnni") ? CV_CPU_AVX512VNNI : 0;
	f |= cv_cpu_amx() ? CV_CPU_AMX : 0;
#endif
	return f;
}

// cv_cpu holds the features with CV_CPU_KNOWN set once detected. Two threads of the first
// calls may both detect; they store the same value.
#define CV_CPU_KNOWN (1u << 31)
static atomic_uint cv_cpu;

unsigned cv_cpu_features(void) {
	unsigned f = atomic_load_explicit(&cv_cpu, memory_order_relaxed);
	if ((f & CV_CPU_KNOWN) == 0) {
		f = cv_cpu_detect() | CV_CPU_KNOWN;
		atomic_store_explicit(&cv_cpu, f, memory_order_relaxed);
	}
	return f & ~CV_CPU_KNOWN;
}

static pthread_key_t cv_scratch_key[CV_SCRATCH_SLOTS];
static pthread_once_t cv_scratch_once = PTHREAD_ONCE_INIT;
static __thread void *cv_scratch_buf[CV_SCRATCH_SLOTS];
static __thread size_t cv_scratch_cap[CV_SCRATCH_SLOTS];

static void cv_scratch_init(void) {
	for (int i = 0; i < CV_SCRATCH_SLOTS; i++) {
		pthread_key_create(&cv_scratch_key[i], free);
	}
}

void *cv_scratch(int slot, size_t bytes) {
	if (bytes <= cv_scratch_cap[slot]) {
		return cv_scratch_buf[slot];
	}
	pthread_once(&cv_scratch_once, cv_scratch_init);
	void *p = NULL;
	if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63) != 0) {
		return NULL;
	}
	free(cv_scratch_buf[slot]);
	cv_scratch_buf[slot] = p;
	cv_scratch_cap[slot] = bytes;
	pthread_setspecific(cv_scratch_key[slot], p);
	return p;
}
