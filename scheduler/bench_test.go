package scheduler

import (
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
)

var benchEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// BenchmarkScheduleUpdate256 measures one step's scheduling cost (Schedule plus Update)
// with 256 running sequences decoding, prefix caching on, and finished sequences replaced
// by new ones so the batch stays full. One op is one step.
func BenchmarkScheduleUpdate256(b *testing.B) {
	const (
		numSeqs   = 256
		blockSize = 16
		maxLen    = 512
	)
	pool, err := kvcache.NewPool(kvcache.PoolConfig{NumBlocks: numSeqs*maxLen/blockSize + 64, BlockSizeTokens: blockSize, EnablePrefixCaching: true})
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.MaxNumSeqs = numSeqs
	cfg.MaxNumBatchedTokens = 4096
	cfg.MaxModelLen = 2048
	s, err := newWithClock(cfg, pool, newManualClock(benchEpoch))
	if err != nil {
		b.Fatal(err)
	}
	nextID := kvcache.SeqID(1)
	add := func() {
		n := 32 + int(nextID%64)
		prompt := make([]int32, n, maxLen+1)
		for i := range prompt {
			prompt[i] = int32(nextID)*7 + int32(i)
		}
		// Stagger the lengths so sequences finish at different steps.
		limit := maxLen - int(nextID*37%200)
		if err := s.Add(&Sequence{ID: nextID, Tokens: prompt, Data: limit}); err != nil {
			b.Fatal(err)
		}
		nextID++
	}
	for range numSeqs {
		add()
	}
	results := make([]Result, 0, numSeqs)
	step := func() {
		plan := s.Schedule()
		results = results[:0]
		for _, it := range plan.Items {
			var r Result
			if it.Sample {
				r.Token = int32(len(it.Seq.Tokens))
				r.Finished = len(it.Seq.Tokens)+1 >= it.Seq.Data.(int)
			}
			results = append(results, r)
		}
		done, err := s.Update(plan, results)
		if err != nil {
			b.Fatal(err)
		}
		for range done {
			add()
		}
	}
	for s.Stats().LastStepSeqs < numSeqs || s.Stats().LastStepTokens != numSeqs {
		step() // until every sequence is decoding
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		step()
	}
	b.StopTimer()
	if st := s.Stats(); st.Running+st.Waiting != numSeqs || st.Preemptions != 0 {
		b.Fatalf("stats %+v: want %d sequences and no preemption", st, numSeqs)
	}
}
