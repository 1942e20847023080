package models

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestSharedPool checks that sessions on the shared intra-op pool and a session on a
// pool of its own compute the same logits, and that the shared pool's spinning
// workers run at SCHED_IDLE, so they never keep a core from another thread.
func TestSharedPool(t *testing.T) {
	dir := t.TempDir()
	buildPagedTestModel(t, tinyConfig(64, 2, 4, 2, 128, 97, false), 5, dir)
	lib := testORTLib(t)
	if err := InitORT(lib); err != nil {
		t.Fatal(err)
	}
	shared, err := Open(dir, RunnerOptions{ORTLib: lib, IntraOpThreads: sharedPool.threads, Attention: AttentionPaged})
	if err != nil {
		t.Fatalf("Open on the shared pool: %v", err)
	}
	defer shared.Close()
	own, err := Open(dir, RunnerOptions{ORTLib: lib, IntraOpThreads: sharedPool.threads + 1, Attention: AttentionPaged})
	if err != nil {
		t.Fatalf("Open with its own pool: %v", err)
	}
	defer own.Close()

	batch := &Batch{Seqs: []SeqInput{{Tokens: []int32{3, 14, 15, 92, 65}}, {Tokens: []int32{35}}}}
	want, err := own.Forward(batch)
	if err != nil {
		t.Fatalf("Forward (own pool): %v", err)
	}
	wantRows := cloneRows(want.Logits)
	got, err := shared.Forward(batch)
	if err != nil {
		t.Fatalf("Forward (shared pool): %v", err)
	}
	for i := range wantRows {
		if d := relErr32(got.Logits[i], wantRows[i]); d > 1e-5 {
			t.Errorf("row %d: shared-pool logits differ from own-pool ones by %g", i, d)
		}
	}

	if runtime.GOOS != "linux" || !sharedPool.spin {
		return
	}
	if n := idleThreads(t); n != sharedPool.threads-1 {
		t.Errorf("%d threads run at SCHED_IDLE, want the shared pool's %d workers", n, sharedPool.threads-1)
	}
}

func cloneRows(rows [][]float32) [][]float32 {
	out := make([][]float32, len(rows))
	for i, r := range rows {
		out[i] = append([]float32(nil), r...)
	}
	return out
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

// TestSharesPool: a runner shares the pool only when its thread count and spinning
// match; NoSpin against a spinning pool gets a pool of its own, and spinning against a
// pool made without it is refused rather than ignored.
func TestSharesPool(t *testing.T) {
	saved := sharedPool
	defer func() { sharedPool = saved }()
	sharedPool.threads, sharedPool.spin = 2, true
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
		sharedPool.spin = tc.poolSpins
		share, err := sharesPool(tc.threads, tc.spin)
		if share != tc.share || (err != nil) != tc.err {
			t.Errorf("sharesPool(%d, spin %v) with a pool that spins=%v: %v, %v; want share %v, error %v",
				tc.threads, tc.spin, tc.poolSpins, share, err, tc.share, tc.err)
		}
	}
}
