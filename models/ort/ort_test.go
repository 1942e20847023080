package ort

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// testPool is the shared pool the tests' process creates: two workers that spin.
var testPool = PoolOptions{Threads: 2, Spin: true}

// testLib is the ONNX Runtime library the tests' process loads.
var testLib string

func TestMain(m *testing.M) {
	var err error
	testLib, err = findLib()
	if err == nil {
		err = InitWithPool(testLib, testPool)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// findLib returns the ONNX Runtime library for tests: $CONVEYOR_ORT_LIB, else
// <repo>/.ort/libonnxruntime.so.1. A missing library fails the tests and says how to
// get it.
func findLib() (string, error) {
	if p := os.Getenv(LibEnv); p != "" {
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, DefaultLib)
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("ONNX Runtime library %s not found: run `make ort` (or set %s)", p, LibEnv)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above the test directory; set %s", LibEnv)
		}
		dir = parent
	}
}

// TestInit: Init is idempotent with the library loaded, refuses another one, and says
// to run `make ort` about a missing one, in one line wrapping ErrUnavailable.
func TestInit(t *testing.T) {
	for _, p := range []string{testLib, ""} {
		if err := Init(p); err != nil {
			t.Fatalf("Init(%q): %v", p, err)
		}
	}
	if v := Version(); v == "" {
		t.Error("Version is empty after Init")
	}
	if got := SharedPool(); got != testPool {
		t.Errorf("SharedPool() = %+v, want the first Init's %+v", got, testPool)
	}
	other := filepath.Join(t.TempDir(), "libonnxruntime.so.1")
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		filepath.Join(t.TempDir(), "missing.so"): "make ort",
		t.TempDir():                              "is a directory",
		other:                                    "already initialised",
	} {
		err := Init(path)
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Init(%s): err = %v, want one line wrapping ErrUnavailable mentioning %q", path, err, want)
		}
	}
}

// TestResolve: a flag wins over the environment, which wins over the default.
func TestResolve(t *testing.T) {
	t.Setenv(CUDAProviderEnv, "/from/env.so")
	if got := ResolveCUDAProvider("/from/flag.so"); got != "/from/flag.so" {
		t.Errorf("flag: %s", got)
	}
	if got := ResolveCUDAProvider(""); got != "/from/env.so" {
		t.Errorf("env: %s", got)
	}
	t.Setenv(CUDAProviderEnv, "")
	if got, want := ResolveCUDAProvider(""), DefaultCUDAProvider; !filepath.IsAbs(got) || !strings.HasSuffix(got, want) {
		t.Errorf("default: %s, want an absolute path ending in %s", got, want)
	}
}

// TestSharesPool: a runner shares the pool only when its thread count and spinning
// match; NoSpin against a spinning pool gets a pool of its own, and spinning against a
// pool made without it is refused rather than ignored.
func TestSharesPool(t *testing.T) {
	for _, tc := range []struct {
		threads   int
		spin      bool
		poolSpins bool
		share     bool
		err       bool
	}{
		{2, true, true, true, false},
		{2, false, true, false, false}, // NoSpin honoured: its own pool
		{3, true, true, false, false},  // another size: its own pool
		{2, false, false, true, false},
		{2, true, false, false, true}, // cannot spin: refused
	} {
		share, err := sharesPool(PoolOptions{Threads: 2, Spin: tc.poolSpins}, tc.threads, tc.spin)
		if share != tc.share || (err != nil) != tc.err {
			t.Errorf("sharesPool(%d, spin %v) with a pool that spins=%v: %v, %v; want share %v, error %v",
				tc.threads, tc.spin, tc.poolSpins, share, err, tc.share, tc.err)
		}
	}
}

// TestSharedPoolWorkersIdle: the shared pool's spinning workers run at SCHED_IDLE, so
// they never keep a core from another thread.
func TestSharedPoolWorkersIdle(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SCHED_IDLE is Linux's")
	}
	s, err := NewSession(addModel(t), SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n := idleThreads(t); n != testPool.Threads-1 {
		t.Errorf("%d threads run at SCHED_IDLE, want the shared pool's %d workers", n, testPool.Threads-1)
	}
}

// idleThreads counts the process's threads whose scheduling policy is SCHED_IDLE.
func idleThreads(t *testing.T) int {
	t.Helper()
	const schedIdle = 5
	stats, err := filepath.Glob("/proc/self/task/*/stat")
	if err != nil || len(stats) == 0 {
		t.Skipf("cannot list threads: %v", err)
	}
	n := 0
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		// Fields after the parenthesised command name; policy is field 41 of stat.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 39 {
			t.Fatalf("short %s: %q", p, s)
		}
		if policy, _ := strconv.Atoi(fields[38]); policy == schedIdle {
			n++
		}
	}
	return n
}
