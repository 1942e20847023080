package main

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunBatchSurvivesSIGKILL runs the real binary on the tiny model and SIGKILLs it at
// random points — while the model loads, while lines run, while a line is written — 20
// times, rerunning the same command each time, then lets a last run finish: every
// custom_id is answered exactly once, with a 200, and the output holds only whole lines.
func TestRunBatchSurvivesSIGKILL(t *testing.T) {
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "conveyor")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := tinyModelDir(t)
	input, output := filepath.Join(tmp, "in.jsonl"), filepath.Join(tmp, "out.jsonl")
	const n = 3000 // about 3 s of work for the tiny model on 2 cores
	writeLines(t, input, completionLines(n, "k%03d", "kill", 32, true)...)
	args := append([]string{"run-batch", "--no-progress", "--input", input, "--output", output}, batchFlags(t, dir)...)
	run := func() *exec.Cmd {
		cmd := exec.Command(bin, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}

	// Kill points are uniform over the first 800 ms of a run: loading the model takes
	// about 50 ms, so most kills land while lines run and are written.
	seed := uint64(time.Now().UnixNano())
	t.Logf("kill points seeded with %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	kills, finished, grew := 0, 0, 0
	var prevSize int64
	const window = 800 * time.Millisecond
	for kills < 20 {
		cmd := run()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		at := time.Duration(rng.Int64N(int64(window)))
		select {
		case err := <-done:
			// Finished before the kill: the batch is answered; start over on a new output
			// so that the remaining kills still land mid-run.
			if err != nil {
				t.Fatalf("run %d exited with %v: %s", kills+finished, err, cmd.Stderr.(*bytes.Buffer))
			}
			finished++
			checkKilledOutput(t, output, n, true)
			if err := os.Remove(output); err != nil {
				t.Fatal(err)
			}
			prevSize = 0
			continue
		case <-time.After(at):
		}
		_ = cmd.Process.Kill() // SIGKILL
		<-done
		kills++
		checkKilledOutput(t, output, n, false)
		if st, err := os.Stat(output); err == nil {
			if st.Size() > prevSize {
				grew++
			}
			prevSize = st.Size()
		}
	}
	// Rerun until a run completes (it resumes; it is not killed).
	cmd := run()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the last run: %v: %s", err, cmd.Stderr.(*bytes.Buffer))
	}
	checkKilledOutput(t, output, n, true)
	if grew < 5 {
		t.Errorf("only %d of %d kills landed after a line was written: the kill points miss the run", grew, kills)
	}
	t.Logf("%d kills (%d after new lines were written), %d runs finished before their kill", kills, grew, finished)
}

// checkKilledOutput checks the output a killed run left: whole lines (a last partial line
// is allowed when the run was killed: the next run cuts it), each custom_id at most once,
// every answer a 200; complete means every one of the n lines is answered.
func checkKilledOutput(t *testing.T, path string, n int, complete bool) {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) && !complete {
		return // killed before it opened the output
	}
	if err != nil {
		t.Fatal(err)
	}
	if !complete {
		if i := bytes.LastIndexByte(data, '\n'); i+1 < len(data) {
			data = data[:i+1] // a line cut by the kill
		}
		if err := os.WriteFile(path+".whole", data, 0o644); err != nil {
			t.Fatal(err)
		}
		path += ".whole"
	}
	res := readBatchOutput(t, path)
	got := byCustomID(res)
	for id, rs := range got {
		if len(rs) != 1 {
			t.Fatalf("%s answered %d times", id, len(rs))
		}
		if r := rs[0].Response; r == nil || r.StatusCode != 200 || !strings.Contains(string(r.Body), `"completion_tokens":32`) {
			t.Fatalf("%s: %+v", id, rs[0])
		}
	}
	if complete && (len(res) != n || len(got) != n) {
		t.Fatalf("%d lines, %d custom_ids at the end; want %d", len(res), len(got), n)
	}
}
