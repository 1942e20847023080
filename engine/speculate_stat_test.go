package engine

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/scheduler"
)

// constDraft is a deliberately poor draft model: it runs the fake model (so its cache is
// checked as the target's is) but always proposes token tok.
type constDraft struct {
	*fakeModel
	tok int32
}

func (d constDraft) Forward(b *models.Batch) (*models.Output, error) {
	out, err := d.fakeModel.Forward(b)
	if err != nil {
		return nil, err
	}
	out.Argmax = out.Argmax[:0]
	for i := range out.Logits {
		out.Logits[i] = nil
		out.Argmax = append(out.Argmax, d.tok)
	}
	return out, nil
}

// softmax64 is the reference distribution of logits at temperature 1.
func softmax64(logits []float32) []float64 {
	m := math.Inf(-1)
	for _, x := range logits {
		m = max(m, float64(x))
	}
	p := make([]float64, len(logits))
	sum := 0.0
	for i, x := range logits {
		p[i] = math.Exp(float64(x) - m)
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
	return p
}

// chiSquare returns Pearson's statistic of counts (n draws) against probabilities p, and
// its critical value at significance 0.001. Cells expecting fewer than 5 draws are
// pooled into one.
func chiSquare(counts []int, p []float64, n int) (stat, critical float64) {
	cells := 0
	var poolObs, poolExp float64
	for i, pi := range p {
		exp := pi * float64(n)
		if exp < 5 {
			poolObs += float64(counts[i])
			poolExp += exp
			continue
		}
		stat += (float64(counts[i]) - exp) * (float64(counts[i]) - exp) / exp
		cells++
	}
	if poolExp > 0 {
		stat += (poolObs - poolExp) * (poolObs - poolExp) / poolExp
		cells++
	}
	// Wilson-Hilferty: the chi-square quantile from the normal one (z = 3.09 for 0.001).
	df := float64(cells - 1)
	c := 2 / (9 * df)
	critical = df * math.Pow(1-c+3.0902*math.Sqrt(c), 3)
	return stat, critical
}

// TestSpeculationSamplesTheTargetDistribution: sampled rows speculating with a draft
// model draw their tokens from the model's own distribution — with a draft that always
// proposes the same token (a one-point distribution), a deliberately poor one (another
// model's distribution, its proposals drawn from it) and a good one (the model's own
// distribution): over 10,000 seeded requests the second and third tokens, both chosen
// by verification after a proposal was accepted or rejected, pass a chi-square test
// against the exact distribution computed from the fake model's logits. With a broken
// acceptance rule (the poor draft's proposals taken without the test) the same test
// fails: it can tell.
func TestSpeculationSamplesTheTargetDistribution(t *testing.T) {
	const n, prompt, proposal = 10000, 7, 11
	// The exact distributions: the fake model's logits depend on the last token only.
	next := func(prev int32) []float64 {
		logits := make([]float32, fakeVocab)
		fakeLogits([]int32{prev}, logits)
		return softmax64(logits)
	}
	marginal := func(prev []float64) []float64 {
		out := make([]float64, fakeVocab)
		for x, px := range prev {
			for y, py := range next(int32(x)) {
				out[y] += px * py
			}
		}
		return out
	}
	p1 := next(prompt)
	p2 := marginal(p1)
	p3 := marginal(p2)

	run := func(draft Model, broken bool) (stat2, stat3, critical float64, accepted int64) {
		target := newFakeModel(64)
		target.context = 1
		cfg := testConfig()
		cfg.MaxNumSeqs = 256
		cfg.MaxNumBatchedTokens = 2048
		cfg.KVCacheBytes = 64 << 20
		cfg.MaxQueue = n
		cfg.Speculation = scheduler.Speculation{NumTokens: 2, External: true}
		cfg.DraftModel = draft
		e, err := newEngine(cfg, target, fakeText{})
		if err != nil {
			t.Fatal(err)
		}
		if broken {
			e.faults = &faultHooks{acceptProposal: func(tok int32, logits []float32) bool {
				return true
			}}
		}
		e.Start(context.Background())
		second, third := make([]int, fakeVocab), make([]int, fakeVocab)
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, 512)
		for i := range n {
			p := DefaultSamplingParams()
			p.MaxTokens, p.IgnoreEOS = 3, true
			seed := int64(i)
			p.Seed = &seed
			ch, err := e.Submit(context.Background(), &Request{ID: fmt.Sprint(i), Prompt: []int32{prompt}, Params: p})
			if err != nil {
				t.Fatal(err)
			}
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				res := collect(ch)
				toks := res.seqs[0].TokenIDs
				if len(toks) != 3 {
					t.Errorf("request %d: %d tokens, want 3", i, len(toks))
					return
				}
				mu.Lock()
				second[toks[1]]++
				third[toks[2]]++
				mu.Unlock()
			})
		}
		wg.Wait()
		st := e.Stats()
		shutdown(t, e)
		stat2, critical = chiSquare(second, p2, n)
		stat3, _ = chiSquare(third, p3, n)
		return stat2, stat3, critical, st.SpecAcceptedTokens
	}

	good := newFakeModel(64) // the model itself: its own distribution
	good.context = 1
	poor := newFakeModel(64) // another model: a distribution unlike the model's
	for _, tc := range []struct {
		name  string
		draft Model
	}{{"one token", constDraft{newFakeModel(64), proposal}}, {"poor draft", poor}, {"good draft", good}} {
		stat2, stat3, critical, accepted := run(tc.draft, false)
		t.Logf("%s: chi-square of the second tokens %.1f, the third %.1f (critical %.1f at 0.001); %d proposals accepted",
			tc.name, stat2, stat3, critical, accepted)
		if stat2 > critical || stat3 > critical {
			t.Errorf("%s: speculation changed the distribution: chi-square %.1f and %.1f, critical %.1f", tc.name, stat2, stat3, critical)
		}
		if accepted == 0 {
			t.Errorf("%s: no proposal was accepted: the test checks nothing", tc.name)
		}
	}
	stat2, stat3, critical, _ := run(poor, true)
	t.Logf("a broken rule: chi-square %.1f and %.1f", stat2, stat3)
	if stat2 <= critical || stat3 <= critical {
		t.Errorf("a broken acceptance rule passed: chi-square %.1f and %.1f, critical %.1f", stat2, stat3, critical)
	}
}
