package api

import (
	"testing"

	"github.com/conveyor-llm/conveyor/api/openai"
)

// FuzzResponsesRequest decodes and validates arbitrary /v1/responses bodies: no panic,
// and every body is either a valid request or an error that names a parameter (or is
// about the body as a whole). previous_response_id resolves to a fixed conversation.
func FuzzResponsesRequest(f *testing.F) {
	for _, b := range []string{
		`{"model":"test-model","input":"hi","instructions":"x","max_output_tokens":3,"store":false}`,
		`{"model":"test-model","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}]}`,
		`{"model":"test-model","input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"},"parallel_tool_calls":false}`,
		`{"model":"test-model","input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"},"strict":true}}}`,
		`{"model":"test-model","input":[{"type":"function_call_output","call_id":"call_1","output":[{"type":"input_text","text":"ok"}]}],"previous_response_id":"resp_1","background":true}`,
		`{"model":"test-model","input":"x","stream":true,"stream_options":{"include_obfuscation":false},"metadata":{"a":"b"},"reasoning":{"effort":null},"include":[],"truncation":"disabled"}`,
		`{"model":"test-model","input":[{"type":"reasoning"}],"tools":[{"type":"web_search"}]}`,
	} {
		f.Add([]byte(b))
	}
	one := "{}"
	lookup := func(id string) ([]openai.ResponseItem, error) {
		if id != "resp_1" {
			return nil, openai.InvalidParam("previous_response_id", "previous response with id %q not found", id)
		}
		return []openai.ResponseItem{
			{Type: "message", ID: "msg_1", Role: "user", Content: []openai.ResponseContent{{Type: "input_text", Text: "q"}}},
			{Type: "function_call", ID: "fc_1", CallID: "call_1", Name: "f", Arguments: &one},
		}, nil
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var w openai.ResponsesRequest
		if err := openai.DecodeBody(body, &w); err != nil {
			checkParseError(t, body, err, true)
			return
		}
		req, err := openai.ParseResponses(&w, fuzzBackend, lookup, true)
		if err != nil {
			checkParseError(t, body, err, false)
			return
		}
		checkSampling(t, body, req.Prompt, req.Params, req.Names)
		if req.Model == "" || len(req.Input) == 0 || req.Params.N != 1 || (req.Background && (!req.Store || req.Stream)) ||
			(req.PreviousID != "" && len(req.Context) == 0) || len(req.Context)+len(req.Input) > openai.MaxInputItems {
			t.Fatalf("%q: accepted as %+v", body, req)
		}
		for _, it := range req.Input {
			if it.ID == "" || (it.Type != "message" && it.Type != "function_call" && it.Type != "function_call_output") {
				t.Fatalf("%q: item %+v", body, it)
			}
		}
	})
}
