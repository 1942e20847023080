package main

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// fullDisk lets whole lines through until `lines` are written, then writes half of the
// next one and fails with ENOSPC, as write(2) does when the disk fills mid-line.
type fullDisk struct {
	w     io.Writer
	name  string
	lines int
}

func (d *fullDisk) Write(p []byte) (int, error) {
	if d.lines > 0 {
		d.lines--
		return d.w.Write(p)
	}
	n, _ := d.w.Write(p[:len(p)/2])
	return n, &fs.PathError{Op: "write", Path: d.name, Err: syscall.ENOSPC}
}

// TestRunBatchDiskFullThenResume fills the disk while the 4th result line is written:
// the run stops with a one-line error naming the output file, the output holds exactly
// the 3 whole lines written before, and a rerun resumes right after them, answering
// every other line once.
func TestRunBatchDiskFullThenResume(t *testing.T) {
	dir := tinyModelDir(t)
	tmp := t.TempDir()
	input, output := filepath.Join(tmp, "in.jsonl"), filepath.Join(tmp, "out.jsonl")
	const n = 10
	writeLines(t, input, completionLines(n, "d%d", "disk", 6, true)...)
	o := newBatchOptions(t, dir, input, output, "--max-in-flight", "2")
	o.wrapOutput = func(w io.Writer) io.Writer { return &fullDisk{w: w, name: output, lines: 3} }
	var stderr bytes.Buffer
	err := runBatch(context.Background(), o, &stderr, false)
	if err == nil {
		t.Fatal("a run on a full disk succeeded")
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "run-batch: write "+output+": no space left on device") ||
		strings.Count(msg, output) != 1 || !strings.Contains(msg, "3 of 10 lines answered") || !strings.Contains(msg, "resume") {
		t.Fatalf("error %q: want one line naming %s once, the lines answered and how to resume", msg, output)
	}
	before, _ := os.ReadFile(output)
	if res := readBatchOutput(t, output); len(res) != 3 { // fails on a partial line
		t.Fatalf("%d lines after the disk filled, want the 3 written before", len(res))
	}

	o.wrapOutput = nil
	stderr.Reset()
	if err := runBatch(context.Background(), o, &stderr, false); err != nil {
		t.Fatalf("rerun: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "answered=3") {
		t.Errorf("the rerun did not resume after the 3 lines: %s", stderr.String())
	}
	after, _ := os.ReadFile(output)
	if !bytes.HasPrefix(after, before) {
		t.Fatal("the rerun changed the lines written before the disk filled")
	}
	res := readBatchOutput(t, output)
	got := byCustomID(res)
	if len(res) != n || len(got) != n {
		t.Fatalf("%d lines, %d custom_ids after the rerun; want %d", len(res), len(got), n)
	}
	for id, rs := range got {
		if len(rs) != 1 || rs[0].Response == nil || rs[0].Response.StatusCode != 200 {
			t.Errorf("%s: %+v", id, rs)
		}
	}
}
