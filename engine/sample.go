package engine

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/conveyor-llm/conveyor/engine/structured"
	"github.com/conveyor-llm/conveyor/models/kernels"
)

// sampler chooses the next token of one sequence. It keeps the sequence's own random
// stream and token counts, so the choice depends only on the sequence's logits and
// history, never on the other sequences of the batch.
//
// Processing order (vLLM's): logit_bias and the min_tokens mask, then the repetition
// penalty over prompt and output and the presence and frequency penalties over the
// output, then temperature; temperature 0 takes the argmax (ties go to the lowest id).
// Otherwise top_k, top_p and min_p cut the softmax, in the Hugging Face order (vLLM
// applies min_p before top_p), and one token is drawn from what is left. Logprobs
// describe the raw model distribution (log_softmax of the logits before any
// processing), as vLLM reports them by default — except that a structured-output
// constraint comes first: its mask is applied before everything, logprobs included.
type sampler struct {
	params *SamplingParams
	rng    *rand.Rand
	// match follows the sequence through params.Constraint (or, once triggered,
	// params.LazyConstraint); nil when unconstrained.
	match *structured.Matcher
	eos   []int32
	// out holds the output's bytes while a lazy constraint waits for its trigger;
	// lazyDone: the trigger fired (the constraint took over, or refused what followed).
	out      []byte
	lazyDone bool

	// promptSeen holds the prompt's distinct tokens (for the repetition penalty).
	promptSeen map[int32]struct{}
	// outCounts counts each generated token (presence, frequency and repetition penalties).
	outCounts map[int32]int
	// numOut is the number of generated tokens so far.
	numOut int
	// stopIDs are masked while numOut < MinTokens (eos ids unless IgnoreEOS, plus StopTokenIDs).
	stopIDs []int32
	// index is the sequence's index in its request; draftRng draws a draft model's
	// proposals (drawDraft), created on first use.
	index    uint64
	draftRng *rand.Rand
}

// sampleScratch holds buffers shared by every sampler of one engine; the engine
// goroutine samples one sequence at a time.
type sampleScratch struct {
	masked []float32 // logits under a constraint's mask
	logits []float32 // processed logits
	idx    []int32   // candidate token ids
	probs  []float32 // candidate probabilities (unnormalised)
	exp    []float32 // every token's probability (unnormalised), for the nucleus
	mass   []float64 // probability mass per bucket, for the nucleus
}

// sampled is the outcome of one sampling step.
type sampled struct {
	ID      int32
	Logprob float32 // raw log-probability of ID; NaN when not computed
	Top     []TopLogprob
	// Done: the constraint allows no token (its value is complete, or cannot go on):
	// the sequence stops, ID being an end-of-sequence token when the model has one.
	Done bool
}

// newSampler returns the sampler of sequence index of a request. A request with a seed
// gets the same random stream for the same (seed, index) whatever else runs; without a
// seed the stream is random.
func newSampler(p *SamplingParams, prompt []int32, eos []int32, index int) *sampler {
	s := &sampler{params: p, eos: eos, index: uint64(index)}
	if p.Constraint != nil {
		s.match = p.Constraint.NewMatcher()
	}
	if p.Seed != nil {
		s.rng = rand.New(rand.NewPCG(uint64(*p.Seed), uint64(index)))
	} else {
		s.rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if p.RepetitionPenalty != 1 && p.RepetitionPenalty != 0 {
		s.promptSeen = make(map[int32]struct{}, len(prompt))
		for _, id := range prompt {
			s.promptSeen[id] = struct{}{}
		}
	}
	s.outCounts = make(map[int32]int)
	if p.MinTokens > 0 {
		if !p.IgnoreEOS {
			s.stopIDs = append(s.stopIDs, eos...)
		}
		s.stopIDs = append(s.stopIDs, p.StopTokenIDs...)
	}
	return s
}

// accept records a generated token.
func (s *sampler) accept(id int32) {
	s.outCounts[id]++
	s.numOut++
	if s.match != nil {
		s.match.Accept(id)
		return
	}
	if lc := s.params.LazyConstraint; lc != nil && s.params.LazyTrigger.Text != "" && !s.lazyDone {
		s.watchTrigger(lc, lc.Vocabulary().Bytes(id))
	}
}

// watchTrigger appends a token's bytes to the output and, when the lazy trigger has
// appeared, starts the constraint at the trigger's first byte, feeding it what
// followed. A continuation the constraint refuses leaves the output unconstrained.
func (s *sampler) watchTrigger(lc *structured.Constraint, bs []byte) {
	s.out = append(s.out, bs...)
	trig := s.params.LazyTrigger
	at, final := trig.Locate(s.out)
	if at < 0 {
		if final {
			s.out, s.lazyDone = nil, true // prose: a call can no longer open
		} else if !trig.AtStart && len(s.out) >= len(trig.Text) {
			// Only a tail shorter than the trigger can still be its beginning.
			s.out = append(s.out[:0], s.out[len(s.out)-len(trig.Text)+1:]...)
		}
		return
	}
	m := lc.NewMatcher()
	if m.AcceptBytes(s.out[at:]) {
		s.match = m
	}
	s.out, s.lazyDone = nil, true
}

// needsRawLogprob reports whether the chosen token's raw logprob must be computed.
func (s *sampler) needsRawLogprob() bool {
	return s.params.Logprobs >= 0 || s.params.BestOf > s.params.N
}

// argmaxOnly reports whether the next token is the raw logits' argmax and nothing else of
// them is read: greedy, unconstrained (no grammar, no trigger watching for one is the
// same), no processor, no logprobs. The model then need not return the logits
// (models.SeqInput.ArgmaxOnly).
func (s *sampler) argmaxOnly() bool {
	return s.params.Temperature == 0 && s.match == nil && !s.processed() && !s.needsRawLogprob()
}

// processed reports whether any logit processor changes the logits.
func (s *sampler) processed() bool {
	p := s.params
	return len(p.LogitBias) > 0 || (len(s.stopIDs) > 0 && s.numOut < p.MinTokens) ||
		(p.RepetitionPenalty != 1 && p.RepetitionPenalty != 0) || p.PresencePenalty != 0 || p.FrequencyPenalty != 0
}

// sample chooses the next token from raw logits (one row of VocabSize floats, left
// unchanged). It does not record the token: call accept.
func (s *sampler) sample(raw []float32, sc *sampleScratch) sampled {
	if s.match != nil {
		sc.masked = append(sc.masked[:0], raw...)
		if !applyMask(sc.masked, s.match.Mask()) {
			out := sampled{ID: argmax(raw), Logprob: float32(math.NaN()), Done: true}
			if len(s.eos) > 0 {
				out.ID = s.eos[0]
			}
			return out
		}
		raw = sc.masked
	}
	logits := raw
	if s.processed() {
		sc.logits = append(sc.logits[:0], raw...)
		logits = sc.logits
		s.applyProcessors(logits)
	}
	var id int32
	if s.params.Temperature == 0 {
		id = argmax(logits)
	} else {
		id = s.draw(logits, sc)
	}
	return s.result(raw, id, sc)
}

// result is the outcome of choosing id from raw logits: with its raw logprob and top
// alternatives when the request wants them.
func (s *sampler) result(raw []float32, id int32, sc *sampleScratch) sampled {
	out := sampled{ID: id, Logprob: float32(math.NaN())}
	if s.needsRawLogprob() {
		lse := logSumExp(raw)
		out.Logprob = raw[id] - float32(lse)
		if k := s.params.Logprobs; k > 0 {
			top := topK(raw, k, sc)
			out.Top = make([]TopLogprob, 0, len(top))
			for _, t := range top {
				if math.IsInf(float64(raw[t]), -1) {
					continue // masked by the constraint: not an alternative
				}
				out.Top = append(out.Top, TopLogprob{ID: t, Logprob: raw[t] - float32(lse)})
			}
		}
	}
	return out
}

// verifyProposal is sample for a position whose token a draft model proposed: x, drawn
// from the draft's distribution q (VocabSize probabilities summing to 1). It is the
// rejection sampling of Leviathan et al. (2023) and Chen et al. (2023): with p the
// distribution sample draws from (after the processors, temperature, top_k, top_p and
// min_p), x is accepted with probability min(1, p(x)/q(x)); otherwise the token is drawn
// from max(0, p - q), normalised, which never gives x. The token so chosen is
// distributed as p whatever q is. It reports whether x was accepted. A sampler under a
// constraint, or a greedy one, samples as usual (such rows bring no drawn proposals).
func (s *sampler) verifyProposal(raw []float32, x int32, q []float32, sc *sampleScratch) (sampled, bool) {
	if s.match != nil || s.params.Temperature == 0 {
		out := s.sample(raw, sc)
		return out, out.ID == x
	}
	logits := raw
	if s.processed() {
		sc.logits = append(sc.logits[:0], raw...)
		logits = sc.logits
		s.applyProcessors(logits)
	}
	cand, probs, total := s.dist(logits, sc)
	if total <= 0 || math.IsNaN(total) {
		id := argmax(logits)
		return s.result(raw, id, sc), id == x
	}
	id := func(i int) int32 { // candidate i's token
		if cand != nil {
			return cand[i]
		}
		return int32(i)
	}
	px := 0.0
	for i, pr := range probs {
		if id(i) == x {
			px = float64(pr) / total
			break
		}
	}
	if qx := float64(q[x]); qx > 0 && s.rng.Float64()*qx < px {
		return s.result(raw, x, sc), true
	}
	// The residual max(0, p - q): what p has beyond the draft's distribution.
	residual := 0.0
	for i, pr := range probs {
		residual += max(0, float64(pr)/total-float64(q[id(i)]))
	}
	if residual <= 0 {
		// p and q agree to rounding: any draw from p serves.
		return s.result(raw, s.draw(logits, sc), sc), false
	}
	r := s.rng.Float64() * residual
	last := -1
	for i, pr := range probs {
		w := max(0, float64(pr)/total-float64(q[id(i)]))
		if w == 0 {
			continue
		}
		last = i
		if r -= w; r < 0 {
			break
		}
	}
	return s.result(raw, id(last), sc), false
}

// drawDraft draws a draft model's proposal from its logits for this sequence: the
// distribution sample would draw from without the processors (temperature, top_k, top_p
// and min_p), written to q as VocabSize probabilities, from the sequence's own draft
// stream (seeded like its sampler's, apart from it). A sampler under a constraint or a
// greedy one proposes the argmax, q then holding it alone.
func (s *sampler) drawDraft(logits, q []float32, sc *sampleScratch) int32 {
	clear(q)
	if s.params.Temperature == 0 || s.match != nil {
		x := argmax(logits)
		q[x] = 1
		return x
	}
	cand, probs, total := s.dist(logits, sc)
	if total <= 0 || math.IsNaN(total) {
		x := argmax(logits)
		q[x] = 1
		return x
	}
	if s.draftRng == nil {
		if p := s.params; p.Seed != nil {
			s.draftRng = rand.New(rand.NewPCG(uint64(*p.Seed)^draftStream, s.index))
		} else {
			s.draftRng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
		}
	}
	r := s.draftRng.Float64() * total
	x, last := int32(-1), int32(-1)
	for i, pr := range probs {
		tok := int32(i)
		if cand != nil {
			tok = cand[i]
		}
		q[tok] = float32(float64(pr) / total)
		if pr == 0 {
			continue
		}
		last = tok
		if r -= float64(pr); r < 0 && x < 0 {
			x = tok
		}
	}
	if x < 0 {
		x = last
	}
	return x
}

// draftStream sets a sequence's draft stream apart from its sampling stream.
const draftStream = 0x9E3779B97F4A7C15

// applyMask sets the logits of the tokens mask does not allow to -Inf (every id beyond
// the mask's vocabulary too) and reports whether any token is left.
func applyMask(logits []float32, mask []uint64) bool {
	inf := float32(math.Inf(-1))
	any := false
	for w := 0; w*64 < len(logits); w++ {
		var word uint64
		if w < len(mask) {
			word = mask[w]
		}
		if word == ^uint64(0) && (w+1)*64 <= len(logits) {
			any = true
			continue
		}
		for j := 0; j < 64 && w*64+j < len(logits); j++ {
			if word&(1<<j) == 0 {
				logits[w*64+j] = inf
			} else {
				any = true
			}
		}
	}
	return any
}

// applyProcessors applies logit_bias, the min_tokens mask and the penalties in place.
func (s *sampler) applyProcessors(logits []float32) {
	p := s.params
	v := int32(len(logits))
	for id, b := range p.LogitBias {
		if id >= 0 && id < v {
			logits[id] += b
		}
	}
	if s.numOut < p.MinTokens {
		for _, id := range s.stopIDs {
			if id >= 0 && id < v {
				logits[id] = float32(math.Inf(-1))
			}
		}
	}
	if rp := p.RepetitionPenalty; rp != 1 && rp != 0 {
		penalize := func(id int32) {
			if id < 0 || id >= v {
				return
			}
			if logits[id] > 0 {
				logits[id] /= rp
			} else {
				logits[id] *= rp
			}
		}
		for id := range s.promptSeen {
			penalize(id)
		}
		for id := range s.outCounts {
			if _, dup := s.promptSeen[id]; !dup {
				penalize(id)
			}
		}
	}
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		for id, n := range s.outCounts {
			if id >= 0 && id < v {
				logits[id] -= p.PresencePenalty + p.FrequencyPenalty*float32(n)
			}
		}
	}
}

// draw samples from softmax(logits/temperature) cut by top_k, top_p and min_p.
func (s *sampler) draw(logits []float32, sc *sampleScratch) int32 {
	cand, probs, total := s.dist(logits, sc)
	if total <= 0 || math.IsNaN(total) {
		// Everything is masked: fall back to the argmax (lowest id on ties).
		return argmax(logits)
	}
	r := s.rng.Float64() * total
	last := -1
	for i, q := range probs {
		if q == 0 {
			continue
		}
		last = i
		r -= float64(q)
		if r < 0 {
			break
		}
	}
	if cand != nil {
		return cand[last]
	}
	return int32(last)
}

// dist returns the distribution draw samples from: unnormalised probabilities (the
// most likely token has 1) of the candidates cand (nil means every token, probs
// indexed by id) and their sum. Cut tokens have probability 0 or are left out. Nothing
// here sorts the vocabulary: top_k selects its k, top_p alone finds its nucleus by
// probability buckets, and every exponential of a whole row runs vectorised.
func (s *sampler) dist(logits []float32, sc *sampleScratch) (cand []int32, probs []float32, total float64) {
	p := s.params
	invT := 1 / p.Temperature
	v := len(logits)
	k := p.TopK
	if k <= 0 || k > v {
		k = v
	}
	topP := float64(p.TopP)
	if topP <= 0 || topP > 1 {
		topP = 1
	}

	switch {
	case k < v:
		// The k most likely, in descending order; top_p then cuts a prefix of them.
		cand = topK(logits, k, sc)
		maxL := logits[cand[0]]
		if math.IsInf(float64(maxL), 0) || math.IsNaN(float64(maxL)) {
			return cand, nil, 0
		}
		probs = sc.probs[:0]
		for _, id := range cand {
			q := float32(math.Exp(float64((logits[id] - maxL) * invT)))
			probs = append(probs, q)
			total += float64(q)
		}
		sc.probs = probs
		if topP < 1 {
			acc := 0.0
			for i, q := range probs {
				acc += float64(q)
				if acc >= topP*total {
					probs, cand = probs[:i+1], cand[:i+1]
					break
				}
			}
			total = acc
		}
	case topP < 1:
		cand, probs, total = nucleus(logits, invT, topP, sc)
	default:
		maxL := kernels.RowMax(logits)
		if math.IsInf(float64(maxL), 0) || math.IsNaN(float64(maxL)) {
			return nil, nil, 0
		}
		sc.probs = slices.Grow(sc.probs[:0], v)[:v]
		probs = sc.probs
		total = kernels.RowExp(logits, probs, maxL, invT)
	}
	// min_p: drop tokens less likely than min_p times the most likely one.
	if mp := p.MinP; mp > 0 {
		total = 0
		for i, q := range probs {
			if q < mp {
				probs[i] = 0
			}
			total += float64(probs[i])
		}
	}
	return cand, probs, total
}

// nucleusBuckets is the number of probability buckets nucleus sorts tokens into: a
// probability in (0, 1] falls in bucket (bits(1) - bits(p)) >> 20 of its float32 bits,
// eight buckets per halving; 0 falls in the last.
const nucleusBuckets = 0x3f800000>>20 + 1

// nucleus returns the smallest set of most likely tokens whose probability mass (at
// temperature 1/invT) reaches topP of the total, with their unnormalised probabilities
// and mass: the tokens top_p keeps after a descending sort, without the sort. One
// vectorised pass computes every probability, a second adds them into buckets by
// magnitude; the buckets above the one where the mass crosses topP are kept whole, and
// only that bucket's tokens are ordered (higher logit first, then lower id) to find
// where the cut falls. The result aliases sc.
func nucleus(logits []float32, invT float32, topP float64, sc *sampleScratch) ([]int32, []float32, float64) {
	maxL := kernels.RowMax(logits)
	if math.IsInf(float64(maxL), 0) || math.IsNaN(float64(maxL)) {
		return nil, nil, 0
	}
	v := len(logits)
	sc.exp = slices.Grow(sc.exp[:0], v)[:v]
	ps := sc.exp
	total := kernels.RowExp(logits, ps, maxL, invT)
	if cap(sc.mass) < nucleusBuckets {
		sc.mass = make([]float64, nucleusBuckets)
	}
	mass := sc.mass[:nucleusBuckets]
	clear(mass)
	for _, q := range ps {
		mass[bucketOf(q)] += float64(q)
	}
	target := topP * total
	edge, above := nucleusBuckets-1, 0.0
	for b, m := range mass {
		if above+m >= target {
			edge = b
			break
		}
		above += m
	}
	cand, probs := sc.idx[:0], sc.probs[:0]
	var border []int32
	for i, q := range ps {
		switch b := bucketOf(q); {
		case b < edge:
			cand = append(cand, int32(i))
			probs = append(probs, q)
		case b == edge:
			border = append(border, int32(i))
		}
	}
	sortBest(logits, border)
	acc := above
	for _, id := range border {
		cand = append(cand, id)
		probs = append(probs, ps[id])
		acc += float64(ps[id])
		if acc >= target {
			break
		}
	}
	sc.idx, sc.probs = cand, probs
	return cand, probs, acc
}

// bucketOf is nucleus' bucket of a probability in [0, 1].
func bucketOf(q float32) int {
	bits := math.Float32bits(q)
	if bits >= 0x3f800000 {
		return 0
	}
	return int((0x3f800000 - bits) >> 20)
}
