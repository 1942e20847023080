package models

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/conveyor-llm/conveyor/models/convert"
)

// concurrentOpenEnv names the directory a child process of TestConcurrentOpen opens.
const concurrentOpenEnv = "CONVEYOR_TEST_CONCURRENT_OPEN"

// TestConcurrentOpen: models opened at once on several goroutines, as the first thing a
// process does with ONNX Runtime, all open. A session with Conveyor's operators
// registers the com.conveyor domain in ONNX Runtime's process-wide schema registry as
// it is created (check, then add), so unserialised creations fail now and then with
// "the domain is already exist": the test runs fresh processes (re-executing its own
// binary), where the registration has not happened yet.
func TestConcurrentOpen(t *testing.T) {
	if dir := os.Getenv(concurrentOpenEnv); dir != "" {
		openAtOnce(t, dir)
		return
	}
	dir := t.TempDir()
	if _, err := convert.BuildFromHF(filepath.Join("testdata", "families", "llama3"), dir, convert.Options{}); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestConcurrentOpen$", "-test.count=1")
		cmd.Env = append(os.Environ(), concurrentOpenEnv+"="+dir, ORTLibEnv+"="+testORTLib(t))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
	}
}

// openAtOnce opens the model at dir on every attention path, twice each, at once.
func openAtOnce(t *testing.T, dir string) {
	lib := testORTLib(t)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := range 6 {
		attention := []string{AttentionGraph, AttentionDense}[i%2]
		wg.Go(func() {
			m, err := Open(dir, RunnerOptions{ORTLib: lib, IntraOpThreads: 1, Attention: attention})
			if err != nil {
				errs <- err
				return
			}
			_ = m.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
