package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func params(mod func(p *SamplingParams)) *SamplingParams {
	p := DefaultSamplingParams()
	p.Temperature = 0
	if mod != nil {
		mod(&p)
	}
	return &p
}

func TestSampleGreedyProcessors(t *testing.T) {
	seed := int64(1)
	tests := []struct {
		name   string
		p      *SamplingParams
		prompt []int32
		out    []int32 // tokens already generated
		eos    []int32
		logits []float32
		want   int32
	}{
		{"argmax", params(nil), nil, nil, nil, []float32{1, 3, 2.5, 2}, 1},
		{"ties go to the lowest id", params(nil), nil, nil, nil, []float32{1, 3, 3, 2}, 1},
		{"logit bias", params(func(p *SamplingParams) { p.LogitBias = map[int32]float32{3: 2} }), nil, nil, nil,
			[]float32{1, 3, 3, 2}, 3},
		{"logit bias -100 bans", params(func(p *SamplingParams) { p.LogitBias = map[int32]float32{1: -100} }), nil, nil, nil,
			[]float32{1, 3, 2.5, 2}, 2},
		// Token 1 was in the prompt: 3/2 = 1.5 < 2.5.
		{"repetition penalty divides positive logits", params(func(p *SamplingParams) { p.RepetitionPenalty = 2 }),
			[]int32{1}, nil, nil, []float32{1, 3, 2.5, -1}, 2},
		// Token 3 was generated: -0.5*2 = -1 ties token 0 (-1); lowest id wins.
		{"repetition penalty multiplies negative logits", params(func(p *SamplingParams) { p.RepetitionPenalty = 2 }),
			nil, []int32{3}, nil, []float32{-1, -2, -3, -0.5}, 0},
		// Penalised once although it is in both prompt and output: 3/2 = 1.5 > 1.4.
		{"repetition penalty applied once per token", params(func(p *SamplingParams) { p.RepetitionPenalty = 2 }),
			[]int32{1}, []int32{1, 1}, nil, []float32{0, 3, 1.4}, 1},
		// Token 2 generated twice: 2.5 - 0.5 - 2*0.5 = 1.0, ties token 1.
		{"presence and frequency penalties", params(func(p *SamplingParams) { p.PresencePenalty = 0.5; p.FrequencyPenalty = 0.5 }),
			nil, []int32{2, 2}, nil, []float32{0, 1, 2.5}, 1},
		// Presence and frequency count only generated tokens, not the prompt.
		{"penalties ignore the prompt", params(func(p *SamplingParams) { p.PresencePenalty = 2; p.FrequencyPenalty = 2 }),
			[]int32{2}, nil, nil, []float32{0, 1, 2.5}, 2},
		{"negative presence penalty encourages", params(func(p *SamplingParams) { p.PresencePenalty = -2 }),
			nil, []int32{0}, nil, []float32{0, 1, 1.5}, 0},
		{"min_tokens masks eos", params(func(p *SamplingParams) { p.MinTokens = 2 }),
			nil, []int32{1}, []int32{0}, []float32{5, 1, 0}, 1},
		{"min_tokens masks stop token ids", params(func(p *SamplingParams) { p.MinTokens = 2; p.StopTokenIDs = []int32{1} }),
			nil, []int32{2}, []int32{0}, []float32{5, 4, 0}, 2},
		{"min_tokens reached", params(func(p *SamplingParams) { p.MinTokens = 2 }),
			nil, []int32{1, 1}, []int32{0}, []float32{5, 1, 0}, 0},
		{"ignore_eos does not mask eos after min_tokens", params(func(p *SamplingParams) { p.IgnoreEOS = true }),
			nil, nil, []int32{0}, []float32{5, 1, 0}, 0},
		{"ignore_eos leaves eos unmasked under min_tokens", params(func(p *SamplingParams) { p.IgnoreEOS = true; p.MinTokens = 3 }),
			nil, nil, []int32{0}, []float32{5, 1, 0}, 0},
		{"temperature with top_k 1 is greedy", params(func(p *SamplingParams) { p.Temperature = 1.5; p.TopK = 1; p.Seed = &seed }),
			nil, nil, nil, []float32{1, 3, 2.9, 2}, 1},
		{"every token masked falls back to id 0", params(func(p *SamplingParams) { p.Temperature = 1; p.LogitBias = map[int32]float32{} }),
			nil, nil, nil, []float32{float32(math.Inf(-1)), float32(math.Inf(-1))}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSampler(tc.p, tc.prompt, tc.eos, 0)
			for _, id := range tc.out {
				s.accept(id)
			}
			raw := slices.Clone(tc.logits)
			got := s.sample(raw, &sampleScratch{})
			if got.ID != tc.want {
				t.Fatalf("sampled %d, want %d", got.ID, tc.want)
			}
			if !slices.Equal(raw, tc.logits) {
				t.Fatalf("raw logits modified: %v", raw)
			}
		})
	}
}

func TestSampleDistribution(t *testing.T) {
	ln := func(x float64) float32 { return float32(math.Log(x)) }
	// Probabilities 0.1, 0.2, 0.3, 0.4 at temperature 1.
	logits := []float32{ln(0.1), ln(0.2), ln(0.3), ln(0.4)}
	tests := []struct {
		name string
		mod  func(p *SamplingParams)
		want []float64 // normalised probability per token id
	}{
		{"plain softmax", nil, []float64{0.1, 0.2, 0.3, 0.4}},
		{"top_k 2", func(p *SamplingParams) { p.TopK = 2 }, []float64{0, 0, 3.0 / 7, 4.0 / 7}},
		{"top_k larger than vocab", func(p *SamplingParams) { p.TopK = 10 }, []float64{0.1, 0.2, 0.3, 0.4}},
		// 0.4 < 0.6 <= 0.4+0.3.
		{"top_p 0.6", func(p *SamplingParams) { p.TopP = 0.6 }, []float64{0, 0, 3.0 / 7, 4.0 / 7}},
		{"top_p 0.35 keeps the best", func(p *SamplingParams) { p.TopP = 0.35 }, []float64{0, 0, 0, 1}},
		{"top_p 0.95", func(p *SamplingParams) { p.TopP = 0.95 }, []float64{0.1, 0.2, 0.3, 0.4}},
		// min_p 0.6: keep p >= 0.24 -> 0.3 and 0.4.
		{"min_p 0.6", func(p *SamplingParams) { p.MinP = 0.6 }, []float64{0, 0, 3.0 / 7, 4.0 / 7}},
		// min_p 0.4: keep p >= 0.16 -> 0.2, 0.3 and 0.4.
		{"min_p 0.4", func(p *SamplingParams) { p.MinP = 0.4 }, []float64{0, 2.0 / 9, 3.0 / 9, 4.0 / 9}},
		// Temperature 0.5 squares the probabilities: 1, 4, 9, 16 over 30.
		{"temperature 0.5", func(p *SamplingParams) { p.Temperature = 0.5 }, []float64{1.0 / 30, 4.0 / 30, 9.0 / 30, 16.0 / 30}},
		// Temperature 2 takes square roots.
		{"temperature 2 and top_k 2", func(p *SamplingParams) { p.Temperature = 2; p.TopK = 2 },
			[]float64{0, 0, math.Sqrt(0.3) / (math.Sqrt(0.3) + math.Sqrt(0.4)), math.Sqrt(0.4) / (math.Sqrt(0.3) + math.Sqrt(0.4))}},
		// top_k 3 leaves 0.2/0.9, 0.3/0.9, 0.4/0.9; top_p 0.5 keeps 0.4/0.9+0.3/0.9.
		{"top_k then top_p", func(p *SamplingParams) { p.TopK = 3; p.TopP = 0.5 }, []float64{0, 0, 3.0 / 7, 4.0 / 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := params(func(p *SamplingParams) { p.Temperature = 1 })
			if tc.mod != nil {
				tc.mod(p)
			}
			s := newSampler(p, nil, nil, 0)
			cand, probs, total := s.dist(logits, &sampleScratch{})
			got := make([]float64, len(logits))
			for i, q := range probs {
				id := int32(i)
				if cand != nil {
					id = cand[i]
				}
				got[id] = float64(q) / total
			}
			for i := range got {
				if math.Abs(got[i]-tc.want[i]) > 1e-6 {
					t.Fatalf("distribution %v, want %v", got, tc.want)
				}
			}
			// Draws follow the distribution: 20000 seeded draws within 2.5% absolute.
			counts := make([]float64, len(logits))
			const n = 20000
			for range n {
				counts[s.draw(logits, &sampleScratch{})]++
			}
			for i := range counts {
				if math.Abs(counts[i]/n-tc.want[i]) > 0.025 || (tc.want[i] == 0 && counts[i] != 0) {
					t.Fatalf("draw frequencies %v, want %v", counts, tc.want)
				}
			}
		})
	}
}

func TestSampleLogprobsAreRaw(t *testing.T) {
	ln := func(x float64) float32 { return float32(math.Log(x)) }
	// Shift by a constant: log_softmax must not care.
	logits := []float32{ln(0.1) + 7, ln(0.2) + 7, ln(0.3) + 7, ln(0.4) + 7}
	p := params(func(p *SamplingParams) {
		p.Logprobs = 2
		p.LogitBias = map[int32]float32{0: 100} // forces token 0; logprobs stay raw
	})
	s := newSampler(p, nil, nil, 0)
	got := s.sample(logits, &sampleScratch{})
	if got.ID != 0 {
		t.Fatalf("sampled %d, want 0", got.ID)
	}
	if math.Abs(float64(got.Logprob)-math.Log(0.1)) > 1e-5 {
		t.Fatalf("logprob %v, want ln 0.1 = %v", got.Logprob, math.Log(0.1))
	}
	if len(got.Top) != 2 || got.Top[0].ID != 3 || got.Top[1].ID != 2 ||
		math.Abs(float64(got.Top[0].Logprob)-math.Log(0.4)) > 1e-5 ||
		math.Abs(float64(got.Top[1].Logprob)-math.Log(0.3)) > 1e-5 {
		t.Fatalf("top logprobs %+v, want ids 3, 2 with ln 0.4, ln 0.3", got.Top)
	}

	// Without logprobs or best_of nothing is computed.
	s = newSampler(params(nil), nil, nil, 0)
	if got := s.sample(logits, &sampleScratch{}); !math.IsNaN(float64(got.Logprob)) || got.Top != nil {
		t.Fatalf("logprobs computed although not requested: %+v", got)
	}
}

func TestSampleSeedIsPerSequence(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 50)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64())
	}
	seed := int64(42)
	run := func(index int, interleave bool) []int32 {
		p := params(func(p *SamplingParams) { p.Temperature = 1; p.Seed = &seed })
		s := newSampler(p, nil, nil, index)
		other := newSampler(params(func(p *SamplingParams) { p.Temperature = 1 }), nil, nil, 0)
		var out []int32
		sc := &sampleScratch{}
		for range 30 {
			if interleave {
				other.sample(logits, sc) // another sequence of the batch
			}
			out = append(out, s.sample(logits, sc).ID)
		}
		return out
	}
	a, b := run(0, false), run(0, true)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed gave %v alone and %v in a batch", a, b)
	}
	if c := run(1, false); slices.Equal(a, c) {
		t.Fatalf("sequences 0 and 1 of a seeded request drew the same tokens %v", a)
	}
}

func TestTopKMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	sc := &sampleScratch{}
	for trial := range 300 {
		v := 1 + rng.IntN(300)
		x := make([]float32, v)
		for i := range x {
			x[i] = float32(rng.IntN(20)) // many ties
		}
		k := 1 + rng.IntN(v)
		if trial%2 == 0 {
			k = 1 + rng.IntN(min(v, 20)) // the one-pass selection of a few
		}
		ref := sortedIDs(x)
		got := topK(x, k, sc)
		if !slices.Equal(got, ref[:k]) {
			t.Fatalf("trial %d: topK(k=%d) = %v, want %v", trial, k, got, ref[:k])
		}
	}
}

// TestNucleusMatchesSort checks the bucketed nucleus against top_p's definition: sort
// the tokens by probability (higher logit first, then lower id), keep the shortest
// prefix whose mass reaches top_p of the total. Logits with many ties and wide ranges,
// rows masked to -Inf, several temperatures.
func TestNucleusMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	sc := &sampleScratch{}
	for trial := range 400 {
		v := 1 + rng.IntN(3000)
		x := make([]float32, v)
		scale := []float64{0.01, 1, 3, 30}[trial%4]
		for i := range x {
			switch r := rng.IntN(10); {
			case r == 0:
				x[i] = float32(math.Inf(-1))
			case r < 4:
				x[i] = float32(rng.IntN(8)) // ties
			default:
				x[i] = float32(rng.NormFloat64() * scale)
			}
		}
		x[rng.IntN(v)] = 5 // at least one finite logit
		invT := float32(1 / []float64{0.3, 0.7, 1, 1.5}[rng.IntN(4)])
		topP := []float64{0.05, 0.5, 0.9, 0.99, 0.999999}[rng.IntN(5)]
		cand, probs, mass := nucleus(x, invT, topP, sc)

		ref := sortedIDs(x)
		maxL := float64(x[ref[0]])
		p := func(id int32) float64 { return math.Exp((float64(x[id]) - maxL) * float64(invT)) }
		total := 0.0
		for _, id := range ref {
			total += p(id)
		}
		n, acc := 0, 0.0
		for n < v {
			acc += p(ref[n])
			n++
			if acc >= topP*total {
				break
			}
		}
		// The kept tokens are a prefix of the sorted order (exactly), and their mass is
		// the definition's up to the vectorised exponential's last bits, which may move
		// the cut by tokens whose probability is within that error of the boundary.
		kept := map[int32]bool{}
		for _, id := range cand {
			kept[id] = true
		}
		for i := range len(cand) {
			if !kept[ref[i]] {
				t.Fatalf("trial %d (v %d, topP %g): the %d kept tokens are not the most likely %d (%d is missing)", trial, v, topP, len(cand), len(cand), ref[i])
			}
		}
		if math.Abs(acc-mass) > 1e-5*total || (topP < 0.999 && len(cand) != n) {
			t.Fatalf("trial %d (v %d, topP %g): nucleus keeps %d tokens (mass %g), want %d (mass %g)", trial, v, topP, len(cand), mass, n, acc)
		}
		for i, id := range cand {
			// float32 arguments: the error grows with the argument's magnitude.
			a := math.Abs(float64(x[id])-maxL) * float64(invT)
			if d := math.Abs(float64(probs[i]) - p(id)); d > (1e-6+2e-7*a)*p(id)+1e-30 {
				t.Fatalf("trial %d: probability of %d is %g, want %g", trial, id, probs[i], p(id))
			}
		}
	}
}

// sortedIDs is the reference order of a row: every id, higher logit first, ties in id
// order (a stable sort of the ids, written independently of better).
func sortedIDs(x []float32) []int32 {
	ref := make([]int32, len(x))
	for i := range ref {
		ref[i] = int32(i)
	}
	slices.SortStableFunc(ref, func(a, b int32) int {
		switch {
		case x[a] > x[b]:
			return -1
		case x[a] < x[b]:
			return 1
		}
		return 0
	})
	return ref
}

func TestArgmax(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		x    []float32
		want int32
	}{
		{[]float32{1, 5, 5, 2}, 1},
		{[]float32{nan, 1, 3, 3}, 2},
		{[]float32{0, nan, -1}, 0},
		{[]float32{-3, nan, -1}, 2},
		{[]float32{nan, nan}, 1},
		{[]float32{float32(math.Inf(-1)), -1e30}, 1},
		{[]float32{nan, float32(math.Inf(-1)), float32(math.Inf(-1))}, 1},
		{[]float32{1, 2, 3, 4, 5, 6, 7, 8, 9}, 8},
		{[]float32{9, 2, 3, 4, 5, 6, 7, 8, 9}, 0},
		{[]float32{0, 2, 3, 4, 9, 6, 7, 8, 9}, 4},
	}
	for _, tc := range tests {
		if got := argmax(tc.x); got != tc.want {
			t.Errorf("argmax(%v) = %d, want %d", tc.x, got, tc.want)
		}
	}
	// Against a plain scan, with ties and every length mod 4.
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 2000 {
		x := make([]float32, 1+rng.IntN(40))
		for i := range x {
			x[i] = float32(rng.IntN(6))
			if rng.IntN(10) == 0 {
				x[i] = nan
			}
		}
		want := -1
		for i, v := range x {
			if v == v && (want < 0 || v > x[want]) {
				want = i
			}
		}
		if want < 0 {
			want = len(x) - 1
		}
		if got := argmax(x); got != int32(want) {
			t.Fatalf("trial %d: argmax(%v) = %d, want %d", trial, x, got, want)
		}
	}
}

func TestLogSumExp(t *testing.T) {
	x := []float32{1000, 1000}
	if got, want := logSumExp(x), 1000+math.Ln2; math.Abs(got-want) > 1e-9 {
		t.Fatalf("logSumExp = %v, want %v", got, want)
	}
}

// BenchmarkSampleRow times choosing one token from a row of logits at the vocabulary
// of Qwen2/Qwen3 (151,936), the per-token cost the engine pays for each sequence on top
// of the forward pass: greedy (OpenAI's temperature 0), plain temperature sampling
// (OpenAI's default temperature 1), nucleus (top_p 0.9), the chosen token's logprob
// with 5 alternatives, and the repetition/presence/frequency penalties over a
// 512-token history.
func BenchmarkSampleRow(b *testing.B) {
	const vocab = 151936
	rng := rand.New(rand.NewPCG(5, 6))
	logits := make([]float32, vocab)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	history := make([]int32, 512)
	for i := range history {
		history[i] = int32(rng.IntN(vocab))
	}
	cases := []struct {
		name string
		set  func(p *SamplingParams)
	}{
		{"greedy", func(p *SamplingParams) { p.Temperature = 0 }},
		{"temperature", func(p *SamplingParams) { p.Temperature = 1 }},
		{"topp", func(p *SamplingParams) { p.Temperature = 0.8; p.TopP = 0.9 }},
		{"logprobs5", func(p *SamplingParams) { p.Temperature = 0; p.Logprobs = 5 }},
		{"penalties", func(p *SamplingParams) {
			p.Temperature = 0.8
			p.RepetitionPenalty, p.PresencePenalty, p.FrequencyPenalty = 1.1, 0.5, 0.5
		}},
	}
	for _, c := range cases {
		b.Run(fmt.Sprintf("vocab%d/%s", vocab, c.name), func(b *testing.B) {
			s := newSampler(params(c.set), history[:256], nil, 0)
			for _, id := range history[256:] {
				s.accept(id)
			}
			sc := &sampleScratch{}
			for b.Loop() {
				s.sample(logits, sc)
			}
		})
	}
}

func BenchmarkSampleTopP(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	logits := make([]float32, 32000)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	p := params(func(p *SamplingParams) { p.Temperature = 0.8; p.TopP = 0.9 })
	s := newSampler(p, nil, nil, 0)
	sc := &sampleScratch{}
	for b.Loop() {
		s.sample(logits, sc)
	}
}
