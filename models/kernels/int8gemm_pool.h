// The persistent worker pool, included by int8gemm.c. One call at a time drives the
// workers (cv_pool_acquire ... cv_pool_release); a call that finds them busy runs on
// its own thread. Between calls a worker spins for CV_SPIN_NS and then sleeps on a
// futex, so an idle process burns no CPU.

enum { CV_MAX_THREADS = 64 };
#define CV_SPIN_NS 50000L

static struct {
	pthread_mutex_t lock; // held by the call driving the workers
	atomic_int want;      // threads per call, caller included; 0 = online CPUs
	int started;          // workers running (thread ids 1..started)
	atomic_uint gen;      // bumped once per dispatch; the futex word
	atomic_int left;      // workers still inside the current dispatch
	atomic_int sleepers;  // workers asleep (or about to be) on gen
	void (*fn)(void *arg, int tid, int nthr);
	void *arg;
	int nthr;
} cv_pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static inline void cv_pause(void) {
#if defined(__x86_64__)
	__builtin_ia32_pause();
#endif
}

static long cv_now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void cv_futex_wait(atomic_uint *addr, unsigned val) {
#if defined(__linux__)
	syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
	(void)addr;
	(void)val;
	struct timespec t = {0, 50000};
	nanosleep(&t, NULL);
#endif
}

static void cv_futex_wake_all(atomic_uint *addr) {
#if defined(__linux__)
	syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
	(void)addr;
#endif
}

typedef struct {
	int tid;
	unsigned seen; // the generation current when the worker was started
} cv_worker_arg;

static void *cv_worker(void *argp) {
	cv_worker_arg a = *(cv_worker_arg *)argp;
	free(argp);
	unsigned seen = a.seen;
	for (;;) {
		unsigned g = atomic_load(&cv_pool.gen);
		if (g == seen) {
			long t0 = cv_now_ns();
			for (int i = 1; (g = atomic_load(&cv_pool.gen)) == seen; i++) {
				cv_pause();
				if (i % 64 == 0 && cv_now_ns() - t0 > CV_SPIN_NS) {
					break;
				}
			}
		}
		if (g == seen) {
			atomic_fetch_add(&cv_pool.sleepers, 1);
			while ((g = atomic_load(&cv_pool.gen)) == seen) {
				cv_futex_wait(&cv_pool.gen, seen);
			}
			atomic_fetch_sub(&cv_pool.sleepers, 1);
		}
		seen = g;
		if (a.tid < cv_pool.nthr) {
			cv_pool.fn(cv_pool.arg, a.tid, cv_pool.nthr);
		}
		atomic_fetch_sub(&cv_pool.left, 1);
	}
	return NULL;
}

void cv_i8_set_threads(int n) {
	atomic_store(&cv_pool.want, n < 1 ? 0 : n > CV_MAX_THREADS ? CV_MAX_THREADS : n);
}

static int cv_pool_threads(void) {
	int n = atomic_load(&cv_pool.want);
	if (n > 0) {
		return n;
	}
	long c = sysconf(_SC_NPROCESSORS_ONLN);
	return c < 1 ? 1 : c > CV_MAX_THREADS ? CV_MAX_THREADS : (int)c;
}

// cv_pool_acquire takes the pool for one call, starting workers as needed, and
// returns the threads the call may use (the caller included). It returns 1, holding
// nothing, when a single thread is wanted or another call has the pool.
static int cv_pool_acquire(void) {
	int n = cv_pool_threads();
	if (n <= 1 || pthread_mutex_trylock(&cv_pool.lock) != 0) {
		return 1;
	}
	while (cv_pool.started < n - 1) {
		cv_worker_arg *a = malloc(sizeof *a);
		if (a == NULL) {
			break;
		}
		a->tid = cv_pool.started + 1;
		a->seen = atomic_load(&cv_pool.gen);
		pthread_attr_t attr;
		pthread_t th;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		int err = pthread_create(&th, &attr, cv_worker, a);
		pthread_attr_destroy(&attr);
		if (err != 0) {
			free(a);
			break;
		}
		cv_pool.started++;
	}
	if (n > cv_pool.started + 1) {
		n = cv_pool.started + 1;
	}
	if (n <= 1) {
		pthread_mutex_unlock(&cv_pool.lock);
	}
	return n;
}

static void cv_pool_release(void) { pthread_mutex_unlock(&cv_pool.lock); }

// cv_pool_run runs fn(arg, tid, nthr) for tid in [0, nthr), 0 on the calling thread,
// and returns when all are done. REQUIRES: the pool is held (cv_pool_acquire).
static void cv_pool_run(void (*fn)(void *, int, int), void *arg, int nthr) {
	cv_pool.fn = fn;
	cv_pool.arg = arg;
	cv_pool.nthr = nthr;
	atomic_store(&cv_pool.left, cv_pool.started);
	atomic_fetch_add(&cv_pool.gen, 1);
	if (atomic_load(&cv_pool.sleepers) > 0) {
		cv_futex_wake_all(&cv_pool.gen);
	}
	fn(arg, 0, nthr);
	for (int i = 1; atomic_load(&cv_pool.left) != 0; i++) {
		if (i < 4096) {
			cv_pause();
		} else {
			sched_yield();
		}
	}
}
