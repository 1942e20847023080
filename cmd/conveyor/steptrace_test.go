package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/engine"
)

// TestStepTrace checks the --step-trace file: one JSON line per step with the step's
// fields in milliseconds, numbered in order, and the GC cycles that ran in between.
func TestStepTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "steps.jsonl")
	tr, err := openStepTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	tr.OnStep(engine.StepInfo{NumSeqs: 3, NumTokens: 130, PastTokens: 40, MaxPast: 30, Duration: 12 * time.Millisecond,
		Schedule: 100 * time.Microsecond, Draft: 2 * time.Millisecond, Forward: 10 * time.Millisecond, Sample: 1500 * time.Microsecond, Emit: 250 * time.Microsecond})
	runtime.GC()
	runtime.GC()
	tr.OnStep(engine.StepInfo{NumSeqs: 1, NumTokens: 1, Duration: time.Millisecond, Forward: time.Millisecond})
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	tr.OnStep(engine.StepInfo{NumSeqs: 9}) // after Close: ignored

	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2", len(lines))
	}
	first := lines[0]
	for k, want := range map[string]float64{"step": 1, "rows": 3, "tokens": 130, "past": 40, "max_past": 30,
		"duration_ms": 12, "schedule_ms": 0.1, "draft_ms": 2, "forward_ms": 10, "sample_ms": 1.5, "emit_ms": 0.25} {
		if first[k] != want {
			t.Errorf("%s = %v, want %v (line %v)", k, first[k], want, first)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, first["time"].(string)); err != nil {
		t.Errorf("time: %v", err)
	}
	if lines[1]["step"] != 2.0 || lines[1]["gcs"].(float64) < 2 || lines[1]["gc_pauses_ms"].(float64) < 0 {
		t.Errorf("second line %v: want step 2 and the two GC cycles between the steps", lines[1])
	}
	if _, err := openStepTrace(filepath.Join(t.TempDir(), "missing", "x.jsonl")); err == nil {
		t.Error("a trace in a missing directory opened")
	}
}
