package scheduler_test

import (
	"fmt"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/scheduler"
)

// A step loop with a stand-in for the model: each sampled token is the previous one plus 1,
// and a sequence ends after three generated tokens.
func Example() {
	pool, _ := kvcache.NewPool(kvcache.PoolConfig{NumBlocks: 64, BlockSizeTokens: 4, EnablePrefixCaching: true})
	cfg := scheduler.DefaultConfig()
	cfg.MaxNumSeqs = 4
	cfg.MaxNumBatchedTokens = 8 // a 10-token prompt takes two steps
	s, _ := scheduler.New(cfg, pool)
	_ = s.Add(&scheduler.Sequence{ID: 1, Tokens: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}})
	_ = s.Add(&scheduler.Sequence{ID: 2, Tokens: []int32{100, 101}})

	var results []scheduler.Result
	for s.HasWork() {
		plan := s.Schedule()
		results = results[:0]
		for _, it := range plan.Items {
			fmt.Printf("seq %d: positions %d..%d sample=%v\n", it.Seq.ID, it.StartPos, it.StartPos+it.NumNewTokens-1, it.Sample)
			var r scheduler.Result
			if it.Sample { // the forward pass gave logits for the last position
				r.Token = it.Seq.Tokens[len(it.Seq.Tokens)-1] + 1
				r.Finished = it.Seq.NumGenerated()+1 == 3
			}
			results = append(results, r)
		}
		done, err := s.Update(plan, results)
		if err != nil {
			panic(err)
		}
		for _, q := range done {
			fmt.Printf("seq %d done: %v\n", q.ID, q.Tokens[q.NumPromptTokens():])
		}
	}
	// Output:
	// seq 1: positions 0..7 sample=false
	// seq 1: positions 8..9 sample=true
	// seq 2: positions 0..1 sample=true
	// seq 1: positions 10..10 sample=true
	// seq 2: positions 2..2 sample=true
	// seq 1: positions 11..11 sample=true
	// seq 2: positions 3..3 sample=true
	// seq 1 done: [11 12 13]
	// seq 2 done: [102 103 104]
}
