package api

import (
	"errors"
	"testing"

	"github.com/conveyor-llm/conveyor/engine"
)

// fuzzBackend is the backend the request fuzzers validate against.
var fuzzBackend = &Backend{Tokenizer: fakeTokenizer{}, MaxModelLen: testMaxLen}

// seedBodies adds the bodies of badCases sent to path, and a few valid ones, to f.
func seedBodies(f *testing.F, path string, valid ...string) {
	for _, tc := range badCases {
		if tc.path == path {
			f.Add([]byte(tc.body))
		}
	}
	for _, b := range valid {
		f.Add([]byte(b))
	}
}

// checkParseError checks the fuzzers' property for a refused body: the error is a
// request error that names a parameter, or one that is about the body as a whole.
func checkParseError(t *testing.T, body []byte, err error, bodyLevel bool) {
	t.Helper()
	var pe *paramError
	if !errors.As(err, &pe) {
		t.Fatalf("%q: error %v (%T) is not a request error", body, err, err)
	}
	if status, _ := classify(err); status != 400 {
		t.Fatalf("%q: error %v has status %d, want 400", body, err, status)
	}
	if pe.param == "" && !bodyLevel {
		t.Fatalf("%q: error %q names no parameter", body, err)
	}
	if pe.msg == "" {
		t.Fatalf("%q: empty message", body)
	}
}

// checkSampling checks what every accepted request asks of the engine.
func checkSampling(t *testing.T, body []byte, p engine.SamplingParams) {
	t.Helper()
	switch {
	case p.N < 1 || p.N > maxN, p.BestOf != 0 && p.BestOf < p.N,
		p.MaxTokens < 1 || p.MaxTokens > 1<<30, p.MinTokens < 0 || p.MinTokens > p.MaxTokens,
		p.Temperature < 0 || p.Temperature > 2, p.TopP <= 0 || p.TopP > 1, p.TopK < 0,
		p.MinP < 0 || p.MinP > 1, p.RepetitionPenalty <= 0 || p.RepetitionPenalty > 2,
		p.PresencePenalty < -2 || p.PresencePenalty > 2, p.FrequencyPenalty < -2 || p.FrequencyPenalty > 2,
		len(p.Stop) > maxStopWords, p.Logprobs < -1 || p.Logprobs > maxTopLogprob:
		t.Fatalf("%q: accepted with out-of-range sampling parameters %+v", body, p)
	}
	for id, bias := range p.LogitBias {
		if id < 0 || int(id) >= (fakeTokenizer{}).VocabSize() || bias < -100 || bias > 100 {
			t.Fatalf("%q: accepted logit_bias %d: %v", body, id, bias)
		}
	}
}

// FuzzCompletionRequest decodes and validates arbitrary /v1/completions bodies: no
// panic, and every body is either a valid request or an error that names a parameter
// (or is about the body as a whole).
func FuzzCompletionRequest(f *testing.F) {
	seedBodies(f, cp,
		`{"model":"test-model","prompt":["a","b"],"n":2,"best_of":3,"logprobs":2,"echo":true,"stop":["x"],"logit_bias":{"5":-1}}`,
		`{"model":"test-model","prompt":[[1,2],[3]],"max_tokens":0,"echo":true,"stream":true,"stream_options":{"include_usage":true}}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		var w completionRequest
		if err := decodeBody(body, &w); err != nil {
			checkParseError(t, body, err, true)
			return
		}
		req, err := parseCompletion(&w, fuzzBackend)
		if err != nil {
			checkParseError(t, body, err, false)
			return
		}
		checkSampling(t, body, req.params)
		if req.model == "" || len(req.prompts) == 0 || req.n != req.params.N || req.bestOf < req.n ||
			len(req.prompts)*req.bestOf > maxTotalSeqs || (req.stream && req.bestOf > req.n) || (req.promptOnly && !req.echo) {
			t.Fatalf("%q: accepted as %+v", body, req)
		}
		for _, p := range req.prompts {
			if len(p.tokens) == 0 || len(p.tokens) >= testMaxLen {
				t.Fatalf("%q: accepted a prompt of %d tokens", body, len(p.tokens))
			}
			for _, id := range p.tokens {
				if id < 0 || int(id) >= (fakeTokenizer{}).VocabSize() {
					t.Fatalf("%q: accepted token id %d", body, id)
				}
			}
		}
	})
}

// FuzzChatRequest is FuzzCompletionRequest for /v1/chat/completions.
func FuzzChatRequest(f *testing.F) {
	seedBodies(f, chp,
		`{"model":"test-model","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"}]}],"logprobs":true,"top_logprobs":3,"n":2}`,
		`{"model":"test-model","messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"},"tools":[],"tool_choice":"none","store":false,"stream":true}`,
		`{"model":"test-model","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},"tools":[{"type":"function"}]}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		var w chatRequest
		if err := decodeBody(body, &w); err != nil {
			checkParseError(t, body, err, true)
			return
		}
		req, err := parseChat(&w, fuzzBackend)
		if err != nil {
			checkParseError(t, body, err, false)
			return
		}
		checkSampling(t, body, req.params)
		if req.model == "" || len(req.prompt) == 0 || len(req.prompt) >= testMaxLen || req.params.BestOf > req.params.N {
			t.Fatalf("%q: accepted as %+v", body, req)
		}
	})
}
