package engine

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/scheduler"
)

// presampled is a row's token drawn before the step's serial pass (presample).
type presampled struct {
	ok bool
	s  sampled
}

// presample draws the next token of the step's rows that sample from their logits, on
// up to GOMAXPROCS goroutines with scratch buffers of their own, before the serial pass
// (handleRow) hands the tokens out. A row at temperature > 0 costs a pass or two over the
// vocabulary, about a millisecond at 150k tokens, so 64 such rows sampled one after
// another take longer than the GPU's forward pass. Each sampler keeps its own random
// stream and state, so every row gets the very token the serial pass would draw. Rows
// under a grammar constraint (its matcher state is shared with the grammar's caches),
// speculating rows (verifyDraft samples token by token) and rows whose token the model
// chose stay with the serial pass. Its wall time counts as the step's sampling time.
func (e *Engine) presample(items []scheduler.Item, out *models.Output) {
	e.pre = e.pre[:0]
	workers := runtime.GOMAXPROCS(0)
	if workers < 2 || len(items) < 2 {
		return
	}
	rows := e.preRows[:0]
	for i, it := range items {
		st := it.Seq.Data.(*seqState)
		if it.Sample && !st.done && len(it.Draft) == 0 && st.sampler.match == nil && out.Logits[i] != nil {
			rows = append(rows, i)
		}
	}
	e.preRows = rows
	if len(rows) < 2 {
		return
	}
	t0 := time.Now()
	for range items {
		e.pre = append(e.pre, presampled{})
	}
	workers = min(workers, len(rows))
	for len(e.preScratch) < workers {
		e.preScratch = append(e.preScratch, new(sampleScratch))
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func(sc *sampleScratch) {
			defer wg.Done()
			for {
				k := int(next.Add(1)) - 1
				if k >= len(rows) {
					return
				}
				i := rows[k]
				e.pre[i] = presampleRow(items[i].Seq.Data.(*seqState), out.Logits[i], e.spec.VocabSize, sc)
			}
		}(e.preScratch[w])
	}
	wg.Wait()
	e.phases.Sample += time.Since(t0)
	for _, i := range rows {
		if e.pre[i].ok {
			e.phases.ParallelSampled++
		}
	}
}

// presampleRow samples st's next token from the last vocab logits of row. A panic leaves
// the row to the serial pass, which ends the request with it (recoverRequest).
func presampleRow(st *seqState, row []float32, vocab int, sc *sampleScratch) (p presampled) {
	defer func() {
		if recover() != nil {
			p = presampled{}
		}
	}()
	if len(row) < vocab {
		return presampled{}
	}
	return presampled{ok: true, s: st.sampler.sample(row[len(row)-vocab:], sc)}
}

// takePresampled returns row i's presampled token, once.
func (e *Engine) takePresampled(i int) (sampled, bool) {
	if i >= len(e.pre) || !e.pre[i].ok {
		return sampled{}, false
	}
	p := e.pre[i]
	e.pre[i] = presampled{}
	return p.s, true
}
