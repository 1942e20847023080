package engine

import (
	"errors"
	"math"
	"strings"
	"testing"
)

var testLimits = Limits{VocabSize: fakeVocab, MaxModelLen: 64, CacheTokens: 48, MaxSeqs: 8}

// TestRules breaks each rule once: the error names the parameter, says what is wrong,
// and has the rule's kind.
func TestRules(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		name  string
		mod   func(r *Request)
		param string
		msg   string
		kind  error
	}{
		{"empty prompt", func(r *Request) { r.Prompt = nil }, "prompt", "prompt must not be empty", ErrInvalidRequest},
		{"prompt id", func(r *Request) { r.Prompt[1] = fakeVocab }, "prompt", "prompt[1] = 97 is not a token id (the vocabulary has ids 0..96)", ErrInvalidRequest},
		{"negative prompt id", func(r *Request) { r.Prompt[0] = -1 }, "prompt", "prompt[0] = -1 is not a token id", ErrInvalidRequest},
		{"prompt fills the context", func(r *Request) { r.Prompt = make([]int32, 64) }, "prompt", "maximum context length is 64 tokens", ErrPromptTooLong},
		{"prompt overflows the cache", func(r *Request) { r.Prompt = make([]int32, 48) }, "prompt", "the KV cache holds 48 tokens", ErrPromptTooLong},
		{"n 0", func(r *Request) { r.Params.N = 0 }, "n", "n must be between 1 and 128, got 0", ErrInvalidRequest},
		{"n above the batch", func(r *Request) { r.Params.N = 9 }, "n", "at most 8 of one request fit a batch", ErrInvalidRequest},
		{"best_of below n", func(r *Request) { r.Params.N = 3; r.Params.BestOf = 2 }, "best_of", "best_of must be at least n (3), got 2", ErrInvalidRequest},
		{"best_of huge", func(r *Request) { r.Params.BestOf = 129 }, "best_of", "best_of must be between 1 and 128, got 129", ErrInvalidRequest},
		{"best_of above the batch", func(r *Request) { r.Params.BestOf = 9 }, "best_of", "fit a batch", ErrInvalidRequest},
		{"max_tokens 0", func(r *Request) { r.Params.MaxTokens = 0 }, "max_tokens", "max_tokens must be between 1 and 64, got 0", ErrInvalidRequest},
		{"max_tokens past the context", func(r *Request) { r.Params.MaxTokens = 65 }, "max_tokens", "got 65", ErrInvalidRequest},
		{"min_tokens over max_tokens", func(r *Request) { r.Params.MinTokens = 5 }, "min_tokens", "min_tokens (5) must not exceed max_tokens (4)", ErrInvalidRequest},
		{"negative min_tokens", func(r *Request) { r.Params.MinTokens = -1 }, "min_tokens", "between 0 and 4", ErrInvalidRequest},
		{"temperature above 2", func(r *Request) { r.Params.Temperature = 2.5 }, "temperature", "temperature must be between 0 and 2, got 2.5", ErrInvalidRequest},
		{"negative temperature", func(r *Request) { r.Params.Temperature = -1 }, "temperature", "got -1", ErrInvalidRequest},
		{"NaN temperature", func(r *Request) { r.Params.Temperature = nan }, "temperature", "got NaN", ErrInvalidRequest},
		{"infinite temperature", func(r *Request) { r.Params.Temperature = float32(math.Inf(1)) }, "temperature", "got +Inf", ErrInvalidRequest},
		{"top_p above 1", func(r *Request) { r.Params.TopP = 1.5 }, "top_p", "top_p must be between 0 and 1", ErrInvalidRequest},
		{"top_k past the vocabulary", func(r *Request) { r.Params.TopK = fakeVocab + 1 }, "top_k", "top_k must be between -1 and 97, got 98", ErrInvalidRequest},
		{"top_k below -1", func(r *Request) { r.Params.TopK = -2 }, "top_k", "got -2", ErrInvalidRequest},
		{"NaN min_p", func(r *Request) { r.Params.MinP = nan }, "min_p", "min_p must be between 0 and 1", ErrInvalidRequest},
		{"repetition_penalty 0", func(r *Request) { r.Params.RepetitionPenalty = 0 }, "repetition_penalty", "repetition_penalty must be greater than 0", ErrInvalidRequest},
		{"repetition_penalty above 2", func(r *Request) { r.Params.RepetitionPenalty = 3 }, "repetition_penalty", "got 3", ErrInvalidRequest},
		{"presence_penalty", func(r *Request) { r.Params.PresencePenalty = 3 }, "presence_penalty", "presence_penalty must be between -2 and 2", ErrInvalidRequest},
		{"frequency_penalty", func(r *Request) { r.Params.FrequencyPenalty = -3 }, "frequency_penalty", "got -3", ErrInvalidRequest},
		{"logit_bias id", func(r *Request) { r.Params.LogitBias = map[int32]float32{5: 1, 100: 1} }, "logit_bias", "logit_bias key 100 is not a token id in 0..96", ErrInvalidRequest},
		{"logit_bias value", func(r *Request) { r.Params.LogitBias = map[int32]float32{7: 101} }, "logit_bias", "logit_bias value for 7 must be between -100 and 100, got 101", ErrInvalidRequest},
		{"logprobs 21", func(r *Request) { r.Params.Logprobs = 21 }, "logprobs", "logprobs must be between 0 and 20, got 21", ErrInvalidRequest},
		{"logprobs -2", func(r *Request) { r.Params.Logprobs = -2 }, "logprobs", "got -2", ErrInvalidRequest},
		{"logprobs -1", func(r *Request) { r.Params.Logprobs = -1 }, "logprobs", "logprobs must be between 0 and 20, got -1", ErrInvalidRequest},
		{"prompt_logprobs -1", func(r *Request) { r.Params.PromptLogprobs = -1 }, "prompt_logprobs", "got -1", ErrInvalidRequest},
		{"prompt_logprobs 21", func(r *Request) { r.Params.PromptLogprobs = 21 }, "prompt_logprobs", "got 21", ErrInvalidRequest},
		{"five stop strings", func(r *Request) { r.Params.Stop = []string{"a", "b", "c", "d", ""} }, "stop", "stop may hold at most 4 strings, got 5", ErrInvalidRequest},
		{"stop token id", func(r *Request) { r.Params.StopTokenIDs = []int32{3, 200} }, "stop_token_ids", "stop_token_ids[1] = 200 is not a token id", ErrInvalidRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := greedyRequest("", testPrompt(1, 5), 4)
			tc.mod(r)
			_, err := testLimits.Check(r)
			var pe *ParamError
			if !errors.As(err, &pe) {
				t.Fatalf("Check: %v, want a ParamError", err)
			}
			if pe.Param != tc.param || !strings.Contains(err.Error(), tc.msg) || !errors.Is(err, tc.kind) {
				t.Fatalf("Check: %q (param %q, kind %v), want param %q, kind %v, a message with %q", err, pe.Param, pe.Kind, tc.param, tc.kind, tc.msg)
			}
		})
	}
}

// TestCheckResolves checks what Check makes of a valid request: defaults resolved,
// max_tokens clipped to the room the prompt leaves, and nothing shared with the caller.
func TestCheckResolves(t *testing.T) {
	r := greedyRequest("", testPrompt(1, 40), 64)
	seed := int64(7)
	r.Params.N, r.Params.TopK, r.Params.TopP, r.Params.MinTokens = 2, -1, 0, 30
	r.Params.Seed = &seed
	r.Params.Stop = []string{"", "x"}
	r.Params.LogitBias = map[int32]float32{3: -100}
	p, err := testLimits.Check(r)
	if err != nil {
		t.Fatal(err)
	}
	if p.BestOf != 2 || p.TopK != 0 || p.TopP <= 0 || p.TopP > 1e-5 {
		t.Fatalf("best_of %d top_k %d top_p %v: defaults not resolved", p.BestOf, p.TopK, p.TopP)
	}
	if p.MaxTokens != 24 || p.MinTokens != 24 {
		t.Fatalf("max_tokens %d min_tokens %d, want both clipped to the 24 positions left", p.MaxTokens, p.MinTokens)
	}
	if len(p.Stop) != 1 || p.Stop[0] != "x" {
		t.Fatalf("stop %q, want the empty string dropped", p.Stop)
	}
	r.Params.LogitBias[3] = 1
	*r.Params.Seed = 8
	if p.LogitBias[3] != -100 || *p.Seed != 7 {
		t.Fatal("the checked parameters share maps or pointers with the request")
	}
	if _, err := testLimits.Check(greedyRequest("", testPrompt(1, 5), 4)); err != nil {
		t.Fatalf("a plain request: %v", err)
	}
}
