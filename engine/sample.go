package engine

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/conveyor-llm/conveyor/engine/structured"
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
}

// sampleScratch holds buffers shared by every sampler of one engine; the engine
// goroutine samples one sequence at a time.
type sampleScratch struct {
	masked []float32 // logits under a constraint's mask
	logits []float32 // processed logits
	idx    []int32   // candidate token ids
	probs  []float64 // candidate probabilities
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
	s := &sampler{params: p, eos: eos}
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
	if lc := s.params.LazyConstraint; lc != nil && s.params.LazyTrigger != "" && !s.lazyDone {
		s.watchTrigger(lc, lc.Vocabulary().Bytes(id))
	}
}

// watchTrigger appends a token's bytes to the output and, when the lazy trigger has
// appeared, starts the constraint at the trigger's first byte, feeding it what
// followed. A continuation the constraint refuses leaves the output unconstrained.
func (s *sampler) watchTrigger(lc *structured.Constraint, bs []byte) {
	before := len(s.out)
	s.out = append(s.out, bs...)
	trig := []byte(s.params.LazyTrigger)
	at := -1
	if s.params.LazyTrigger == "{" {
		t := bytes.TrimLeft(s.out, " \t\r\n")
		switch {
		case len(t) == 0:
			return // only whitespace so far
		case t[0] != '{':
			s.out, s.lazyDone = nil, true // prose: a call can no longer open the reply
			return
		}
		at = len(s.out) - len(t)
	} else if i := bytes.Index(s.out[max(0, before-len(trig)+1):], trig); i >= 0 {
		at = max(0, before-len(trig)+1) + i
	}
	if at < 0 {
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
		r -= q
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
// indexed by id) and their sum. Cut tokens have probability 0 or are left out.
func (s *sampler) dist(logits []float32, sc *sampleScratch) (cand []int32, probs []float64, total float64) {
	p := s.params
	invT := 1 / float64(p.Temperature)
	v := len(logits)
	k := p.TopK
	if k <= 0 || k > v {
		k = v
	}
	topP := float64(p.TopP)
	if topP <= 0 || topP > 1 {
		topP = 1
	}

	// Candidates: all tokens, or the k (or enough for top_p) most likely, in
	// descending order when a cut needs the order.
	if k < v {
		cand = topK(logits, k, sc)
	} else if topP < 1 {
		cand = nucleus(logits, invT, topP, sc)
	}

	maxL := math.Inf(-1)
	if cand != nil {
		maxL = float64(logits[cand[0]])
	} else {
		for _, l := range logits {
			maxL = math.Max(maxL, float64(l))
		}
	}
	if math.IsInf(maxL, 0) || math.IsNaN(maxL) {
		return cand, nil, 0
	}

	probs = sc.probs[:0]
	if cand != nil {
		for _, id := range cand {
			probs = append(probs, math.Exp((float64(logits[id])-maxL)*invT))
		}
	} else {
		for _, l := range logits {
			probs = append(probs, math.Exp((float64(l)-maxL)*invT))
		}
	}
	sc.probs = probs
	for _, q := range probs {
		total += q
	}

	// top_p over the (sorted) candidates: keep the smallest prefix whose mass reaches top_p.
	if topP < 1 && cand != nil {
		acc := 0.0
		for i, q := range probs {
			acc += q
			if acc >= topP*total {
				probs, cand = probs[:i+1], cand[:i+1]
				break
			}
		}
		total = acc
	}
	// min_p: drop tokens less likely than min_p times the most likely one.
	if mp := float64(p.MinP); mp > 0 {
		total = 0
		for i, q := range probs {
			if q < mp {
				probs[i] = 0
			}
			total += probs[i]
		}
	}
	return cand, probs, total
}

// nucleus returns, in descending order, the most likely tokens whose probability mass
// (at temperature 1/invT) reaches topP, without sorting the whole vocabulary: it
// selects the m best for growing m until their mass suffices.
func nucleus(logits []float32, invT, topP float64, sc *sampleScratch) []int32 {
	maxL := math.Inf(-1)
	for _, l := range logits {
		maxL = math.Max(maxL, float64(l))
	}
	total := 0.0
	for _, l := range logits {
		total += math.Exp((float64(l) - maxL) * invT)
	}
	for m := 64; ; m *= 4 {
		if m >= len(logits) {
			return topK(logits, len(logits), sc)
		}
		cand := topK(logits, m, sc)
		acc := 0.0
		for _, id := range cand {
			acc += math.Exp((float64(logits[id]) - maxL) * invT)
		}
		if acc >= topP*total {
			return cand
		}
	}
}

// argmax returns the index of the largest value; ties go to the lowest index. NaN
// values are never chosen unless everything is NaN or -Inf.
func argmax(x []float32) int32 {
	// Four independent lanes (each keeps its first maximum) break the compare chain;
	// the lanes are then merged by value, then by lowest index.
	negInf := float32(math.Inf(-1))
	b0, b1, b2, b3 := -1, -1, -1, -1
	v0, v1, v2, v3 := negInf, negInf, negInf, negInf
	n := len(x) &^ 3
	for i := 0; i < n; i += 4 {
		y := x[i : i+4 : i+4]
		if y[0] > v0 {
			b0, v0 = i, y[0]
		}
		if y[1] > v1 {
			b1, v1 = i+1, y[1]
		}
		if y[2] > v2 {
			b2, v2 = i+2, y[2]
		}
		if y[3] > v3 {
			b3, v3 = i+3, y[3]
		}
	}
	best, bv := b0, v0
	for _, c := range [3]struct {
		i int
		v float32
	}{{b1, v1}, {b2, v2}, {b3, v3}} {
		if c.i >= 0 && (best < 0 || c.v > bv || (c.v == bv && c.i < best)) {
			best, bv = c.i, c.v
		}
	}
	for i := n; i < len(x); i++ {
		if x[i] > bv {
			best, bv = i, x[i]
		}
	}
	if best >= 0 {
		return int32(best)
	}
	// Everything is -Inf or NaN: the first -Inf, else the last NaN.
	for i, v := range x {
		if v == negInf {
			return int32(i)
		}
	}
	return int32(max(len(x)-1, 0))
}

// logSumExp returns log(sum(exp(x))) computed stably in float64.
func logSumExp(x []float32) float64 {
	m := math.Inf(-1)
	for _, l := range x {
		m = math.Max(m, float64(l))
	}
	if math.IsInf(m, 0) {
		return m
	}
	sum := 0.0
	for _, l := range x {
		sum += math.Exp(float64(l) - m)
	}
	return m + math.Log(sum)
}

// better reports whether token a ranks before token b: higher logit first, then lower id.
func better(x []float32, a, b int32) bool {
	if x[a] != x[b] {
		return x[a] > x[b]
	}
	return a < b
}

// topK returns the k highest-logit token ids in descending order (ties: lower id
// first). It partially selects with quickselect, then sorts only the k winners, so the
// cost is O(V + k log k) rather than O(V log V). The result aliases sc.idx.
func topK(x []float32, k int, sc *sampleScratch) []int32 {
	v := len(x)
	if k > v {
		k = v
	}
	if k <= 0 {
		return nil
	}
	idx := sc.idx[:0]
	for i := range v {
		idx = append(idx, int32(i))
	}
	sc.idx = idx
	if k < v {
		quickselect(x, idx, k)
	}
	top := idx[:k]
	slices.SortFunc(top, func(a, b int32) int {
		if better(x, a, b) {
			return -1
		}
		if better(x, b, a) {
			return 1
		}
		return 0
	})
	return top
}

// quickselect reorders idx so that its first k entries are the k best (by better),
// in no particular order.
func quickselect(x []float32, idx []int32, k int) {
	lo, hi := 0, len(idx)-1
	for lo < hi {
		// Median of three as the pivot.
		mid := lo + (hi-lo)/2
		if better(x, idx[mid], idx[lo]) {
			idx[mid], idx[lo] = idx[lo], idx[mid]
		}
		if better(x, idx[hi], idx[lo]) {
			idx[hi], idx[lo] = idx[lo], idx[hi]
		}
		if better(x, idx[hi], idx[mid]) {
			idx[hi], idx[mid] = idx[mid], idx[hi]
		}
		pivot := idx[mid]
		i, j := lo, hi
		for i <= j {
			for better(x, idx[i], pivot) {
				i++
			}
			for better(x, pivot, idx[j]) {
				j--
			}
			if i <= j {
				idx[i], idx[j] = idx[j], idx[i]
				i++
				j--
			}
		}
		// Now idx[lo..j] rank at or before pivot and idx[i..hi] at or after it.
		switch {
		case k-1 <= j:
			hi = j
		case k-1 >= i:
			lo = i
		default:
			return
		}
	}
}
