package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/conveyor-llm/conveyor/engine"
)

// stepTrace writes `serve --step-trace FILE`: one JSON object per engine step, on its own
// line, flushed as it is written:
//
//	{"step":12,"time":"2026-01-02T15:04:05.123456Z","rows":16,"tokens":16,"past":2048,"max_past":140,
//	 "duration_ms":61.2,"schedule_ms":0.05,"draft_ms":0,"forward_ms":58.9,"sample_ms":1.4,"emit_ms":0.7,
//	 "parallel_sampled":0,"gc_pauses_ms":0.2,"gcs":1}
//
// time is when the step ended; past sums the tokens already cached that the rows'
// attention reads (max_past is the longest row's); the phases and parallel_sampled (the
// rows sampled on several goroutines at once) are engine.StepInfo's (draft_ms: the draft
// model's passes, with a draft_model --speculative-config);
// gc_pauses_ms and gcs are the Go garbage collector's stop-the-world pauses and cycles
// that completed since the previous line.
type stepTrace struct {
	mu    sync.Mutex
	f     *os.File
	w     *bufio.Writer
	steps int64
	gc    debug.GCStats // read before every line; its pause history is reused
	pause time.Duration // gc.PauseTotal at the previous line
	numGC int64         // gc.NumGC at the previous line
	err   error         // the first write error; tracing stops after it
}

// stepTraceLine is one line of the trace.
type stepTraceLine struct {
	Step       int64   `json:"step"`
	Time       string  `json:"time"`
	Rows       int     `json:"rows"`
	Tokens     int     `json:"tokens"`
	Past       int     `json:"past"`
	MaxPast    int     `json:"max_past"`
	DurationMS float64 `json:"duration_ms"`
	ScheduleMS float64 `json:"schedule_ms"`
	DraftMS    float64 `json:"draft_ms"`
	ForwardMS  float64 `json:"forward_ms"`
	SampleMS   float64 `json:"sample_ms"`
	EmitMS     float64 `json:"emit_ms"`
	Parallel   int     `json:"parallel_sampled"`
	GCPausesMS float64 `json:"gc_pauses_ms"`
	GCs        int64   `json:"gcs"`
}

// openStepTrace creates (or truncates) path for a step trace.
func openStepTrace(path string) (*stepTrace, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--step-trace: %w", err)
	}
	t := &stepTrace{f: f, w: bufio.NewWriter(f)}
	debug.ReadGCStats(&t.gc)
	t.pause, t.numGC = t.gc.PauseTotal, t.gc.NumGC
	return t, nil
}

// OnStep writes s's line; it runs on the engine goroutine.
func (t *stepTrace) OnStep(s engine.StepInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil || t.w == nil {
		return
	}
	debug.ReadGCStats(&t.gc)
	t.steps++
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	line, err := json.Marshal(stepTraceLine{
		Step: t.steps, Time: time.Now().UTC().Format(time.RFC3339Nano),
		Rows: s.NumSeqs, Tokens: s.NumTokens, Past: s.PastTokens, MaxPast: s.MaxPast,
		DurationMS: ms(s.Duration), ScheduleMS: ms(s.Schedule), DraftMS: ms(s.Draft), ForwardMS: ms(s.Forward),
		SampleMS: ms(s.Sample), EmitMS: ms(s.Emit), Parallel: s.ParallelSampled,
		GCPausesMS: ms(t.gc.PauseTotal - t.pause), GCs: t.gc.NumGC - t.numGC,
	})
	t.pause, t.numGC = t.gc.PauseTotal, t.gc.NumGC
	if err == nil {
		_, err = t.w.Write(append(line, '\n'))
	}
	if err == nil {
		err = t.w.Flush()
	}
	t.err = err
}

// Close flushes and closes the file; it returns the first write error.
func (t *stepTrace) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.w == nil {
		return t.err
	}
	t.w = nil
	if err := t.f.Close(); err != nil && t.err == nil {
		t.err = err
	}
	if t.err != nil {
		return fmt.Errorf("--step-trace: %w", t.err)
	}
	return nil
}
