package models

import (
	"testing"

	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/ort"
)

// TestSharedPool checks that sessions on ONNX Runtime's shared intra-op pool and a
// session on a pool of its own compute the same logits. (Package ort tests the pool
// itself: who shares it, and that its spinning workers run at SCHED_IDLE.)
func TestSharedPool(t *testing.T) {
	dir := t.TempDir()
	buildRunnerTestModel(t, tinyConfig(64, 2, 4, 2, 128, 97, false), 5, dir, convert.Float32)
	lib := testORTLib(t)
	if err := InitORT(lib); err != nil {
		t.Fatal(err)
	}
	threads := ort.SharedPool().Threads
	shared, err := Open(dir, RunnerOptions{ORTLib: lib, IntraOpThreads: threads, Attention: AttentionGraph})
	if err != nil {
		t.Fatalf("Open on the shared pool: %v", err)
	}
	defer shared.Close()
	own, err := Open(dir, RunnerOptions{ORTLib: lib, IntraOpThreads: threads + 1, Attention: AttentionGraph})
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
}

func cloneRows(rows [][]float32) [][]float32 {
	out := make([][]float32, len(rows))
	for i, r := range rows {
		out[i] = append([]float32(nil), r...)
	}
	return out
}
