package scheduler

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// linearStep is a model whose step time is exactly linear in the shape.
type linearStep struct {
	base, perToken, perRow, perPair time.Duration
}

func (m linearStep) duration(sh StepShape) time.Duration {
	return m.base + time.Duration(sh.Tokens)*m.perToken + time.Duration(sh.Rows)*m.perRow +
		time.Duration(sh.AttnWork*float64(m.perPair))
}

// A 50M-class model on 2 cores: 2 ms fixed, 60 µs a token, 20 µs a row, 2 ns a pair.
var testStepModel = linearStep{2 * time.Millisecond, 60 * time.Microsecond, 20 * time.Microsecond, 2}

func TestStepCostLearnsALinearModel(t *testing.T) {
	var c StepCost
	if c.Ready() || c.Predict(StepShape{Tokens: 4, Rows: 4}) != 0 {
		t.Fatal("an empty model predicts")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	shape := func() StepShape {
		var sh StepShape
		rows := 1 + rng.IntN(32)
		for range rows {
			n := 1
			if rng.IntN(8) == 0 {
				n = 1 + rng.IntN(512)
			}
			sh.add(rng.IntN(2048), n)
		}
		return sh
	}
	for range 200 {
		sh := shape()
		c.Observe(sh, testStepModel.duration(sh))
	}
	for range 50 {
		sh := shape()
		got, want := c.Predict(sh), testStepModel.duration(sh)
		if rel := math.Abs(float64(got-want)) / float64(want); rel > 0.02 {
			t.Errorf("shape %+v: predicted %v, true %v (%.1f%% off)", sh, got, want, 100*rel)
		}
	}
}

func TestStepCostStaysNonNegativeOnDecodeOnlySteps(t *testing.T) {
	// Decode-only steps make tokens and rows collinear; the fit must still predict a
	// positive, increasing cost for prompt chunks it has never seen.
	var c StepCost
	for i := range 64 {
		var sh StepShape
		for range 1 + i%16 {
			sh.add(100+i, 1)
		}
		c.Observe(sh, testStepModel.duration(sh))
	}
	prev := time.Duration(0)
	for _, n := range []int{1, 16, 256, 1024} {
		m := c.marginal(128, n)
		if m <= prev {
			t.Fatalf("marginal cost of %d tokens = %v, not above %v", n, m, prev)
		}
		prev = m
	}
	for i, v := range c.coef {
		if v < 0 {
			t.Errorf("coefficient %d = %g < 0", i, v)
		}
	}
}

// runTimed drives h step by step with the linear model's durations fed back to the
// scheduler, and returns each step's true duration and whether it carried decode rows.
func runTimed(t *testing.T, h *harness, steps int) (durs []time.Duration, decoding []bool, prompts []int) {
	t.Helper()
	for range steps {
		plan := h.s.Schedule()
		dec, prompt := false, 0
		for _, it := range plan.Items {
			if it.NumNewTokens == 1 && it.StartPos >= it.Seq.NumPromptTokens() {
				dec = true
			} else {
				prompt += it.NumNewTokens
			}
		}
		h.step() // its Schedule returns the plan above

		d := testStepModel.duration(h.s.lastShape)
		h.s.ObserveStep(d)
		durs = append(durs, d)
		decoding = append(decoding, dec)
		prompts = append(prompts, prompt)
	}
	return durs, decoding, prompts
}

func TestTargetStepTimeBoundsPrefillWhileDecoding(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target time.Duration
	}{
		{"auto", 0},
		{"fixed 30ms", 30 * time.Millisecond},
		{"off", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxNumSeqs = 32
			cfg.MaxNumBatchedTokens = 2048
			cfg.MaxModelLen = 4096
			cfg.EnablePrefixCaching = false
			cfg.TargetStepTime = tc.target
			h := newHarness(t, cfg, 1024, 16, false)
			// Sixteen streams decode for a long time...
			for i := range 16 {
				h.mustAdd(req{name: string(rune('a' + i)), prompt: seqTokens(i*10, 8), maxNew: 400})
			}
			runTimed(t, h, 30)
			// ...when a 1,500-token prompt arrives.
			h.mustAdd(req{name: "long", prompt: seqTokens(7, 1500), maxNew: 4})
			durs, decoding, prompts := runTimed(t, h, 80)

			var decodeOnly time.Duration
			var sh StepShape
			for range 16 {
				sh.add(300, 1)
			}
			decodeOnly = testStepModel.duration(sh)
			target := tc.target
			if target == 0 {
				target = max(AutoStepTimeFactor*decodeOnly, MinAutoStepTime)
			}
			longest, promptSteps, total := time.Duration(0), 0, 0
			for i, d := range durs {
				if prompts[i] > 0 {
					promptSteps++
					total += prompts[i]
					if decoding[i] {
						longest = max(longest, d)
					}
				}
			}
			if total != 1500 {
				t.Fatalf("the prompt computed %d of its 1500 tokens in 80 steps", total)
			}
			if tc.target < 0 {
				if promptSteps != 1 {
					t.Errorf("with the bound off the prompt took %d steps, want 1 (the token budget allows it)", promptSteps)
				}
				return
			}
			// The bound holds to within the cost of the progress floor.
			if slack := target + testStepModel.duration(StepShape{Tokens: minPrefillChunkTokens}); longest > slack {
				t.Errorf("a decoding step with a prompt chunk took %v, over the target %v", longest, target)
			}
			if promptSteps < 2 {
				t.Errorf("the prompt ran in %d step(s): it was not chunked to the target", promptSteps)
			}
		})
	}
}

func TestPrefillUnboundedWithNothingDecoding(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxNumBatchedTokens = 2048
	cfg.MaxModelLen = 4096
	cfg.EnablePrefixCaching = false
	h := newHarness(t, cfg, 1024, 16, false)
	// Teach the model with a few decode steps of one stream, then let it finish.
	h.mustAdd(req{name: "warm", prompt: seqTokens(1, 4), maxNew: 12})
	runTimed(t, h, 16)
	h.mustAdd(req{name: "big", prompt: seqTokens(3, 2000), maxNew: 2})
	if !h.s.cost.Ready() {
		t.Fatal("the cost model did not learn from 16 steps")
	}
	_, _, prompts := runTimed(t, h, 1)
	if prompts[0] != 2000 {
		t.Errorf("with nothing decoding the prompt got %d tokens in its first step, want all 2000", prompts[0])
	}
}

// decodingStreams returns a harness for cfg with four short streams admitted and run
// for steps timed steps.
func decodingStreams(t *testing.T, cfg Config, blocks, steps int) *harness {
	t.Helper()
	h := newHarness(t, cfg, blocks, 16, false)
	for i := range 4 {
		h.mustAdd(req{name: string(rune('a' + i)), prompt: seqTokens(i*10, 8), maxNew: 200})
	}
	runTimed(t, h, steps)
	return h
}

// TestColdStartBoundsPrefillWhileDecoding: before the cost model has seen enough steps,
// a long prompt arriving next to decoding streams is still chunked.
func TestColdStartBoundsPrefillWhileDecoding(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxNumBatchedTokens = 2048
	cfg.MaxModelLen = 4096
	cfg.EnablePrefixCaching = false
	for _, target := range []time.Duration{0, -1} {
		cfg.TargetStepTime = target
		h := decodingStreams(t, cfg, 1024, 2) // prompts, then a decode step: the model is still cold
		if h.s.cost.Ready() {
			t.Fatal("the cost model is ready after 2 steps; the test needs it cold")
		}
		h.mustAdd(req{name: "long", prompt: seqTokens(7, 1500), maxNew: 4})
		_, decoding, prompts := runTimed(t, h, 1)
		want := coldPrefillChunkTokens
		if target < 0 {
			want = 1500 // the bound is off
		}
		if !decoding[0] || prompts[0] != want {
			t.Errorf("target %v, cold step: decoding %v, %d prompt tokens; want decoding with %d", target, decoding[0], prompts[0], want)
		}
	}
}

// TestPromptChunksGrowWithinTrustedRange: a cost model that has only seen small steps
// cannot extrapolate to a huge chunk; each step carries at most twice the largest step
// measured so far.
func TestPromptChunksGrowWithinTrustedRange(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxNumBatchedTokens = 4096
	cfg.MaxModelLen = 8192
	cfg.EnablePrefixCaching = false
	cfg.TargetStepTime = 10 * time.Second  // the time bound alone would allow everything
	h := decodingStreams(t, cfg, 2048, 12) // every step so far: at most 4 rows × 8 prompt tokens
	h.mustAdd(req{name: "long", prompt: seqTokens(7, 3000), maxNew: 4})
	_, _, prompts := runTimed(t, h, 8)
	prev, total := 32, 0
	for i, p := range prompts {
		total += p
		if p+4 > 2*max(prev, coldPrefillChunkTokens)+4 {
			t.Fatalf("step %d carried %d prompt tokens after a largest step of %d tokens", i, p, prev)
		}
		prev = max(prev, p+4)
	}
	if total != 3000 {
		t.Errorf("the prompt computed %d of 3000 tokens in 8 steps; the range should double each step", total)
	}
}
