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

// checkSampling checks what an accepted request asks of the engine: the engine's rules
// either accept it or refuse it with an error that names a parameter.
func checkSampling(t *testing.T, body []byte, prompt []int32, p engine.SamplingParams, names map[string]string) {
	t.Helper()
	_, err := fakeLimits.Check(&engine.Request{Prompt: prompt, Params: p})
	if err != nil {
		checkParseError(t, body, wireError(err, names, 0, false), false)
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
		for _, p := range req.prompts {
			checkSampling(t, body, p.tokens, req.params, req.names)
		}
		if req.model == "" || len(req.prompts) == 0 || req.n != req.params.N ||
			len(req.prompts)*req.bestOf > maxTotalSeqs || (req.stream && req.bestOf > req.n) || (req.promptOnly && !req.echo) {
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
		checkSampling(t, body, req.prompt, req.params, req.names)
		if req.model == "" || req.params.BestOf > req.params.N {
			t.Fatalf("%q: accepted as %+v", body, req)
		}
	})
}
