package engine

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// Limits on request fields that the OpenAI API leaves open (vLLM's where it has one).
const (
	MaxN           = 128 // n and best_of
	MaxLogprobs    = 20  // alternatives per position: logprobs, top_logprobs, prompt_logprobs
	MaxStopStrings = 4   // stop strings
)

// Limits are the sizes a request is checked against: the model's and the engine's.
type Limits struct {
	VocabSize   int // token ids are 0 .. VocabSize-1
	MaxModelLen int // prompt + completion tokens of one sequence
	CacheTokens int // tokens the KV cache holds; 0: as many as MaxModelLen
	MaxSeqs     int // sequences of one request (best_of) that fit a batch; 0: MaxN
}

// Limits returns the sizes the engine checks every request against.
func (e *Engine) Limits() Limits {
	return Limits{VocabSize: e.spec.VocabSize, MaxModelLen: e.maxModelLen, CacheTokens: e.cacheTokens, MaxSeqs: e.maxSeqsReq}
}

// ParamError is a request parameter that breaks one of the request rules. Param is the
// parameter's name as the completions API spells it (vLLM's for the extensions); a
// front end with other names renames it and keeps Problem, which reads after the name.
type ParamError struct {
	Param   string
	Problem string // "must be between 0 and 2, got 3"
	Kind    error  // ErrInvalidRequest, or ErrPromptTooLong for a prompt that does not fit
}

func (e *ParamError) Error() string { return e.Named(e.Param) }

// Named is the error's message with the parameter called name.
func (e *ParamError) Named(name string) string {
	if strings.HasPrefix(e.Problem, "[") { // an element: "prompt[3] = 300 is not a token id"
		return name + e.Problem
	}
	return name + " " + e.Problem
}
func (e *ParamError) Unwrap() error { return e.Kind }

// rule is one request rule: the parameter it judges and what is wrong with it ("" when
// nothing is). Rules run in table order; the first broken one is reported.
type rule struct {
	param string
	kind  error
	check func(l Limits, prompt []int32, p *SamplingParams) string
}

// rules is every rule a request must meet, whoever submits it (HTTP, run-batch,
// generate, bench). The front ends check only that fields have their wire types.
var rules = []rule{
	{"prompt", ErrInvalidRequest, func(l Limits, prompt []int32, _ *SamplingParams) string {
		if len(prompt) == 0 {
			return "must not be empty"
		}
		return l.tokenProblem(prompt)
	}},
	{"prompt", ErrPromptTooLong, func(l Limits, prompt []int32, _ *SamplingParams) string {
		if len(prompt) < l.MaxModelLen {
			return ""
		}
		return fmt.Sprintf("has %d tokens, but this model's maximum context length is %d tokens: a prompt may have at most %d, to leave room for at least one completion token",
			len(prompt), l.MaxModelLen, l.MaxModelLen-1)
	}},
	{"prompt", ErrPromptTooLong, func(l Limits, prompt []int32, _ *SamplingParams) string {
		if l.CacheTokens == 0 || len(prompt)+1 <= l.CacheTokens {
			return ""
		}
		return fmt.Sprintf("has %d tokens; the KV cache holds %d tokens", len(prompt), l.CacheTokens)
	}},
	{"n", ErrInvalidRequest, func(l Limits, _ []int32, p *SamplingParams) string {
		if msg := between(p.N, 1, MaxN); msg != "" {
			return msg
		}
		return l.seqsProblem(p.N)
	}},
	{"best_of", ErrInvalidRequest, func(l Limits, _ []int32, p *SamplingParams) string {
		if p.BestOf == 0 || p.BestOf == p.N {
			return ""
		}
		if p.BestOf < p.N {
			return fmt.Sprintf("must be at least n (%d), got %d", p.N, p.BestOf)
		}
		if msg := between(p.BestOf, p.N, MaxN); msg != "" {
			return msg
		}
		return l.seqsProblem(p.BestOf)
	}},
	{"max_tokens", ErrInvalidRequest, func(l Limits, _ []int32, p *SamplingParams) string {
		return between(p.MaxTokens, 1, l.MaxModelLen)
	}},
	{"min_tokens", ErrInvalidRequest, func(_ Limits, _ []int32, p *SamplingParams) string {
		if p.MinTokens > p.MaxTokens && p.MinTokens >= 0 {
			return fmt.Sprintf("(%d) must not exceed max_tokens (%d)", p.MinTokens, p.MaxTokens)
		}
		return between(p.MinTokens, 0, p.MaxTokens)
	}},
	{"temperature", ErrInvalidRequest, func(_ Limits, _ []int32, p *SamplingParams) string {
		return between(p.Temperature, 0, 2)
	}},
	{"top_p", ErrInvalidRequest, func(_ Limits, _ []int32, p *SamplingParams) string {
		return between(p.TopP, 0, 1)
	}},
	{"top_k", ErrInvalidRequest, func(l Limits, _ []int32, p *SamplingParams) string {
		return between(p.TopK, -1, l.VocabSize) // -1 and 0 are off
	}},
	{"min_p", ErrInvalidRequest, func(_ Limits, _ []int32, p *SamplingParams) string {
		return between(p.MinP, 0, 1)
	}},
	{"repetition_penalty", ErrInvalidRequest, func(_ Limits, _ []int32, p *SamplingParams) string {
		if p.RepetitionPenalty == 0 {
			return "must be greater than 0"
		}
		return between(p.RepetitionPenalty, 0, 2)
	}},
	{"presence_penalty", ErrInvalidRequest, func(_ Limits, _ []int32, p *SamplingParams) string {
		return between(p.PresencePenalty, -2, 2)
	}},
	{"frequency_penalty", ErrInvalidRequest, func(_ Limits, _ []int32, p *SamplingParams) string {
		return between(p.FrequencyPenalty, -2, 2)
	}},
	{"logit_bias", ErrInvalidRequest, func(l Limits, _ []int32, p *SamplingParams) string {
		for _, id := range slices.Sorted(maps.Keys(p.LogitBias)) { // the same entry is reported every time
			if id < 0 || int(id) >= l.VocabSize {
				return fmt.Sprintf("key %d is not a token id in 0..%d", id, l.VocabSize-1)
			}
			if msg := between(p.LogitBias[id], -100, 100); msg != "" {
				return fmt.Sprintf("value for %d %s", id, msg)
			}
		}
		return ""
	}},
	{"logprobs", ErrInvalidRequest, func(_ Limits, _ []int32, p *SamplingParams) string {
		return optionalCount(p.Logprobs, MaxLogprobs)
	}},
	{"prompt_logprobs", ErrInvalidRequest, func(_ Limits, _ []int32, p *SamplingParams) string {
		return optionalCount(p.PromptLogprobs, MaxLogprobs)
	}},
	{"stop", ErrInvalidRequest, func(_ Limits, _ []int32, p *SamplingParams) string {
		if len(p.Stop) > MaxStopStrings {
			return fmt.Sprintf("may hold at most %d strings, got %d", MaxStopStrings, len(p.Stop))
		}
		return ""
	}},
	{"stop_token_ids", ErrInvalidRequest, func(l Limits, _ []int32, p *SamplingParams) string {
		return l.tokenProblem(p.StopTokenIDs)
	}},
}

// Check applies every request rule to req and returns its parameters with defaults
// resolved (best_of 0 is n, top_k -1 is 0, top_p 0 keeps only the most likely token,
// empty stop strings dropped) and max_tokens and min_tokens clipped to the room the
// prompt leaves in the context. A broken rule is a *ParamError.
func (l Limits) Check(req *Request) (SamplingParams, error) {
	p := req.Params
	for _, r := range rules {
		if msg := r.check(l, req.Prompt, &p); msg != "" {
			return SamplingParams{}, &ParamError{Param: r.param, Problem: msg, Kind: r.kind}
		}
	}
	if p.BestOf == 0 {
		p.BestOf = p.N
	}
	if p.TopK == -1 {
		p.TopK = 0
	}
	if p.TopP == 0 {
		p.TopP = 1e-6
	}
	p.MaxTokens = min(p.MaxTokens, l.MaxModelLen-len(req.Prompt))
	p.MinTokens = min(p.MinTokens, p.MaxTokens)
	p.LogitBias = maps.Clone(p.LogitBias)
	p.StopTokenIDs = slices.Clone(p.StopTokenIDs)
	p.Stop = slices.DeleteFunc(slices.Clone(p.Stop), func(s string) bool { return s == "" })
	if p.Seed != nil {
		seed := *p.Seed
		p.Seed = &seed
	}
	return p, nil
}

// tokenProblem says which of ids is outside the vocabulary; "" when none is.
func (l Limits) tokenProblem(ids []int32) string {
	for i, id := range ids {
		if id < 0 || int(id) >= l.VocabSize {
			return fmt.Sprintf("[%d] = %d is not a token id (the vocabulary has ids 0..%d)", i, id, l.VocabSize-1)
		}
	}
	return ""
}

// CheckTokens checks that every id is in the vocabulary; param names the list.
func (l Limits) CheckTokens(param string, ids []int32) error {
	if msg := l.tokenProblem(ids); msg != "" {
		return &ParamError{Param: param, Problem: msg, Kind: ErrInvalidRequest}
	}
	return nil
}

// seqsProblem refuses more sequences than one request may run at once.
func (l Limits) seqsProblem(n int) string {
	if l.MaxSeqs > 0 && n > l.MaxSeqs {
		return fmt.Sprintf("asks for %d sequences; at most %d of one request fit a batch", n, l.MaxSeqs)
	}
	return ""
}

// optionalCount checks a count that may be NoLogprobs ("none"): any other value below
// 0, -1 included, is refused.
func optionalCount(v, hi int) string {
	if v == NoLogprobs {
		return ""
	}
	return between(v, 0, hi)
}

// between says what is wrong with v outside [lo, hi] (NaN and infinities included).
func between[T int | float32](v, lo, hi T) string {
	if v >= lo && v <= hi && !math.IsInf(float64(v), 0) {
		return ""
	}
	return fmt.Sprintf("must be between %v and %v, got %v", lo, hi, v)
}
