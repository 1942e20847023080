package api

import (
	"errors"
	"testing"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
)

// fuzzBackend is the model the request fuzzers validate against.
var fuzzBackend = &openai.Model{Tokenizer: fakeTokenizer{}, MaxModelLen: testMaxLen}

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
	var pe *openai.ParamError
	if !errors.As(err, &pe) {
		t.Fatalf("%q: error %v (%T) is not a request error", body, err, err)
	}
	if status, _ := classify(err); status != 400 {
		t.Fatalf("%q: error %v has status %d, want 400", body, err, status)
	}
	if pe.Param == "" && !bodyLevel {
		t.Fatalf("%q: error %q names no parameter", body, err)
	}
	if pe.Message == "" {
		t.Fatalf("%q: empty message", body)
	}
}

// checkSampling checks what an accepted request asks of the engine: the engine's rules
// either accept it or refuse it with an error that names a parameter.
func checkSampling(t *testing.T, body []byte, prompt []int32, p engine.SamplingParams, names map[string]string) {
	t.Helper()
	_, err := fakeLimits.Check(&engine.Request{Prompt: prompt, Params: p})
	if err != nil {
		checkParseError(t, body, openai.WireError(err, names, 0, false), false)
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
		var w openai.CompletionRequest
		if err := openai.DecodeBody(body, &w); err != nil {
			checkParseError(t, body, err, true)
			return
		}
		req, err := openai.ParseCompletion(&w, fuzzBackend)
		if err != nil {
			checkParseError(t, body, err, false)
			return
		}
		for _, p := range req.Prompts {
			checkSampling(t, body, p.Tokens, req.Params, req.Names)
		}
		if req.Model == "" || len(req.Prompts) == 0 || req.N != req.Params.N ||
			len(req.Prompts)*req.BestOf > openai.MaxTotalSeqs || (req.Stream && req.BestOf > req.N) || (req.PromptOnly && !req.Echo) {
			t.Fatalf("%q: accepted as %+v", body, req)
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
		var w openai.ChatRequest
		if err := openai.DecodeBody(body, &w); err != nil {
			checkParseError(t, body, err, true)
			return
		}
		req, err := openai.ParseChat(&w, fuzzBackend)
		if err != nil {
			checkParseError(t, body, err, false)
			return
		}
		checkSampling(t, body, req.Prompt, req.Params, req.Names)
		if req.Model == "" || req.Params.BestOf > req.Params.N {
			t.Fatalf("%q: accepted as %+v", body, req)
		}
	})
}
