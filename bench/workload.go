package bench

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// ErrBadConfig wraps every configuration error of this package.
var ErrBadConfig = errors.New("bench: bad config")

// LengthDist names a distribution of prompt or output lengths in tokens.
type LengthDist string

// Length distributions.
const (
	// Fixed gives every request PromptTokens prompt tokens and OutputTokens output tokens.
	Fixed LengthDist = "fixed"
	// Uniform draws each length uniformly from [Min, Max].
	Uniform LengthDist = "uniform"
	// Lognormal draws lengths from a lognormal mix resembling chat traffic: most requests are
	// short, a long tail is several times the median. Lengths are clipped to [Min, Max].
	Lognormal LengthDist = "lognormal"
)

// WorkloadConfig describes a seeded workload: how many requests, their prompt and output
// lengths in tokens, and the range of token ids prompts are drawn from.
type WorkloadConfig struct {
	NumRequests int
	Dist        LengthDist
	Seed        uint64

	PromptTokens, OutputTokens       int // fixed lengths, and the medians of the lognormal mix
	MinPromptTokens, MaxPromptTokens int // bounds for uniform and lognormal
	MinOutputTokens, MaxOutputTokens int

	// Prompts are random token ids in [MinTokenID, MaxTokenID), so a prompt of N ids is exactly
	// N tokens on any server that accepts token-id prompts.
	MinTokenID, MaxTokenID int32
}

// DefaultWorkloadConfig returns a lognormal chat-like mix of 200 requests: median prompt
// 128 tokens, median output 96 tokens.
func DefaultWorkloadConfig() WorkloadConfig {
	return WorkloadConfig{
		NumRequests: 200, Dist: Lognormal, Seed: 1,
		PromptTokens: 128, OutputTokens: 96,
		MinPromptTokens: 8, MaxPromptTokens: 384,
		MinOutputTokens: 8, MaxOutputTokens: 256,
		MinTokenID: 10, MaxTokenID: 1000,
	}
}

// String describes the workload in words, for reports.
func (c WorkloadConfig) String() string {
	var lens string
	switch c.Dist {
	case Fixed:
		lens = fmt.Sprintf("prompts of %d tokens, outputs of %d tokens", c.PromptTokens, c.OutputTokens)
	case Uniform:
		lens = fmt.Sprintf("prompt lengths uniform in [%d, %d] tokens, output lengths uniform in [%d, %d]",
			c.MinPromptTokens, c.MaxPromptTokens, c.MinOutputTokens, c.MaxOutputTokens)
	default:
		lens = fmt.Sprintf("%s prompt lengths (median %d, %d to %d tokens) and output lengths (median %d, %d to %d)",
			c.Dist, c.PromptTokens, c.MinPromptTokens, c.MaxPromptTokens, c.OutputTokens, c.MinOutputTokens, c.MaxOutputTokens)
	}
	return fmt.Sprintf("%d requests, %s, seed %d", c.NumRequests, lens, c.Seed)
}

// Validate reports the first inconsistent field.
func (c WorkloadConfig) Validate() error {
	switch {
	case c.NumRequests < 1:
		return fmt.Errorf("%w: num-requests must be at least 1", ErrBadConfig)
	case c.Dist != Fixed && c.Dist != Uniform && c.Dist != Lognormal:
		return fmt.Errorf("%w: unknown length distribution %q (fixed, uniform or lognormal)", ErrBadConfig, c.Dist)
	case c.MinTokenID < 0 || c.MaxTokenID <= c.MinTokenID:
		return fmt.Errorf("%w: token id range [%d, %d) is empty", ErrBadConfig, c.MinTokenID, c.MaxTokenID)
	}
	if c.Dist == Fixed {
		if c.PromptTokens < 1 || c.OutputTokens < 1 {
			return fmt.Errorf("%w: prompt and output lengths must be at least 1 token", ErrBadConfig)
		}
		return nil
	}
	if c.MinPromptTokens < 1 || c.MaxPromptTokens < c.MinPromptTokens {
		return fmt.Errorf("%w: prompt length range [%d, %d] is empty", ErrBadConfig, c.MinPromptTokens, c.MaxPromptTokens)
	}
	if c.MinOutputTokens < 1 || c.MaxOutputTokens < c.MinOutputTokens {
		return fmt.Errorf("%w: output length range [%d, %d] is empty", ErrBadConfig, c.MinOutputTokens, c.MaxOutputTokens)
	}
	if c.Dist == Lognormal && (c.PromptTokens < 1 || c.OutputTokens < 1) {
		return fmt.Errorf("%w: lognormal medians must be at least 1 token", ErrBadConfig)
	}
	return nil
}

// Item is one request of a workload.
type Item struct {
	Prompt    []int32 // token ids
	MaxTokens int     // output tokens requested (sent with ignore_eos)
}

// lognormalSigma is the spread of the chat-like mix: with sigma 0.8 the 90th percentile is
// about 2.8x the median and the 99th about 6.4x.
const lognormalSigma = 0.8

// Generate returns the workload for c. The same config always yields the same items.
func Generate(c WorkloadConfig) ([]Item, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x9e3779b97f4a7c15))
	items := make([]Item, c.NumRequests)
	for i := range items {
		var p, o int
		switch c.Dist {
		case Fixed:
			p, o = c.PromptTokens, c.OutputTokens
		case Uniform:
			p = c.MinPromptTokens + rng.IntN(c.MaxPromptTokens-c.MinPromptTokens+1)
			o = c.MinOutputTokens + rng.IntN(c.MaxOutputTokens-c.MinOutputTokens+1)
		case Lognormal:
			p = clamp(int(math.Round(float64(c.PromptTokens)*math.Exp(lognormalSigma*rng.NormFloat64()))), c.MinPromptTokens, c.MaxPromptTokens)
			o = clamp(int(math.Round(float64(c.OutputTokens)*math.Exp(lognormalSigma*rng.NormFloat64()))), c.MinOutputTokens, c.MaxOutputTokens)
		}
		prompt := make([]int32, p)
		span := c.MaxTokenID - c.MinTokenID
		for j := range prompt {
			prompt[j] = c.MinTokenID + rng.Int32N(span)
		}
		items[i] = Item{Prompt: prompt, MaxTokens: o}
	}
	return items, nil
}

func clamp(v, lo, hi int) int {
	return max(lo, min(hi, v))
}

// Arrivals returns the send offsets of n requests from the start of a run.
// rate is in requests per second; math.Inf(1) (or 0) sends everything at once.
// burstiness is the gamma shape: 1 gives a Poisson process, lower values are burstier,
// higher values more regular; the mean rate is the same.
func Arrivals(n int, rate, burstiness float64, seed uint64) ([]time.Duration, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: negative request count", ErrBadConfig)
	}
	if rate < 0 || math.IsNaN(rate) {
		return nil, fmt.Errorf("%w: request rate must be positive or inf", ErrBadConfig)
	}
	if burstiness <= 0 || math.IsNaN(burstiness) || math.IsInf(burstiness, 0) {
		return nil, fmt.Errorf("%w: burstiness must be a positive number", ErrBadConfig)
	}
	out := make([]time.Duration, n)
	if rate == 0 || math.IsInf(rate, 1) {
		return out, nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x2545f4914f6cdd1d))
	scale := 1 / (rate * burstiness) // gamma(shape=burstiness, scale) has mean 1/rate
	var t float64
	for i := range out {
		out[i] = time.Duration(t * float64(time.Second))
		t += gamma(rng, burstiness) * scale
	}
	return out, nil
}

// gamma draws from Gamma(shape, 1) with Marsaglia and Tsang's method.
func gamma(rng *rand.Rand, shape float64) float64 {
	if shape < 1 {
		// Boost: Gamma(a) = Gamma(a+1) * U^(1/a).
		return gamma(rng, shape+1) * math.Pow(rng.Float64(), 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}
