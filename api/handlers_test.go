package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
)

const testModel = "test-model"
const testMaxLen = 64

func newTestServer(t *testing.T, eng *fakeEngine, mod func(*Config)) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ModelName = testModel
	cfg.Logger = discardLogger()
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if eng != nil {
		s.SetBackend(Backend{Engine: eng, Tokenizer: fakeTokenizer{}, MaxModelLen: testMaxLen})
	}
	return s
}

func do(t *testing.T, h http.Handler, method, path, body string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func decode(t *testing.T, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("response is not JSON (%v): %q", err, rec.Body.String())
	}
	return m
}

// errorObject checks an OpenAI error body and returns its fields.
func errorObject(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("error body is not JSON: %q", body)
	}
	var e map[string]any
	if err := json.Unmarshal(m["error"], &e); err != nil {
		t.Fatalf("no error object in %q", body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := e[k]; !ok {
			t.Fatalf("error object lacks %q: %s", k, body)
		}
	}
	if msg, _ := e["message"].(string); msg == "" {
		t.Fatalf("empty error message: %s", body)
	}
	return e
}

func TestCompletionDefaultsAndShape(t *testing.T) {
	eng := newFakeEngine()
	s := newTestServer(t, eng, nil)
	rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"hi","unknown_field":{"x":1}}`)
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	r := eng.lastRequest()
	want := engine.DefaultSamplingParams()
	if r.Params.MaxTokens != 16 || r.Params.Temperature != want.Temperature || r.Params.TopP != 1 || r.Params.N != 1 ||
		r.Params.Logprobs != engine.NoLogprobs || r.Params.PromptLogprobs != engine.NoLogprobs || r.Params.RepetitionPenalty != 1 || r.Params.Seed != nil {
		t.Fatalf("defaults not applied: %+v", r.Params)
	}
	if got := []int32{fakeBOS, 'h' + 1, 'i' + 1}; !equalIDs(r.Prompt, got) {
		t.Fatalf("prompt tokens %v, want %v", r.Prompt, got)
	}
	m := decode(t, rec)
	if id, _ := m["id"].(string); !strings.HasPrefix(id, "cmpl-") {
		t.Errorf("id %q", m["id"])
	}
	if m["object"] != "text_completion" || m["model"] != testModel {
		t.Errorf("object/model: %v %v", m["object"], m["model"])
	}
	if _, ok := m["created"].(float64); !ok {
		t.Errorf("created missing")
	}
	ch := m["choices"].([]any)[0].(map[string]any)
	if ch["text"] != "abcdefghijklmnop" || ch["finish_reason"] != "length" || ch["index"] != 0.0 || ch["logprobs"] != nil {
		t.Errorf("choice %v", ch)
	}
	u := m["usage"].(map[string]any)
	if u["prompt_tokens"] != 3.0 || u["completion_tokens"] != 16.0 || u["total_tokens"] != 19.0 {
		t.Errorf("usage %v", u)
	}
	if rec.Header().Get("X-Request-Id") == "" {
		t.Error("no X-Request-Id")
	}
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCompletionParamsReachEngine(t *testing.T) {
	eng := newFakeEngine()
	s := newTestServer(t, eng, nil)
	body := `{"model":"test-model","prompt":"x","max_tokens":5,"temperature":0.5,"top_p":0.9,"n":2,
	"stop":["\n","END"],"presence_penalty":0.5,"frequency_penalty":-0.5,"logit_bias":{"10":-100,"20":5.5},
	"seed":42,"user":"u","top_k":40,"min_p":0.05,"repetition_penalty":1.1,"min_tokens":2,"ignore_eos":true,
	"stop_token_ids":[3,4],"logprobs":2}`
	rec := do(t, s.Handler(), "POST", "/v1/completions", body)
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	p := eng.lastRequest().Params
	if p.MaxTokens != 5 || p.Temperature != 0.5 || p.TopP != 0.9 || p.N != 2 || len(p.Stop) != 2 || p.Stop[1] != "END" ||
		p.PresencePenalty != 0.5 || p.FrequencyPenalty != -0.5 || p.LogitBias[10] != -100 || p.LogitBias[20] != 5.5 ||
		p.Seed == nil || *p.Seed != 42 || p.TopK != 40 || p.MinP != 0.05 || p.RepetitionPenalty != 1.1 || p.MinTokens != 2 ||
		!p.IgnoreEOS || !equalIDs(p.StopTokenIDs, []int32{3, 4}) || p.Logprobs != 2 || p.PromptLogprobs != engine.NoLogprobs {
		t.Fatalf("params %+v", p)
	}
	m := decode(t, rec)
	choices := m["choices"].([]any)
	if len(choices) != 2 {
		t.Fatalf("%d choices", len(choices))
	}
	lp := choices[1].(map[string]any)["logprobs"].(map[string]any)
	top := lp["top_logprobs"].([]any)[0].(map[string]any)
	// chosen token plus 2 alternatives
	if len(top) != 3 || top["b"] != -2.0 || top["A"] != -3.0 {
		t.Errorf("top_logprobs %v", top)
	}
	if off := lp["text_offset"].([]any); off[0] != 0.0 || off[1] != 1.0 {
		t.Errorf("text_offset %v", off)
	}
}

func TestCompletionPromptForms(t *testing.T) {
	cases := []struct {
		name    string
		prompt  string
		n       int
		prompts [][]int32
	}{
		{"string", `"ab"`, 1, [][]int32{{0, 'a' + 1, 'b' + 1}}},
		{"strings", `["a","b"]`, 2, [][]int32{{0, 'a' + 1}, {0, 'b' + 1}}},
		{"ids", `[5,6,7]`, 1, [][]int32{{5, 6, 7}}},
		{"id arrays", `[[5],[6,7],[8]]`, 2, [][]int32{{5}, {6, 7}, {8}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eng := newFakeEngine()
			s := newTestServer(t, eng, nil)
			rec := do(t, s.Handler(), "POST", "/v1/completions",
				`{"model":"test-model","max_tokens":2,"n":`+itoa(tc.n)+`,"prompt":`+tc.prompt+`}`)
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if len(eng.reqs) != len(tc.prompts) {
				t.Fatalf("%d engine requests, want %d", len(eng.reqs), len(tc.prompts))
			}
			byID := map[string][]int32{}
			for _, r := range eng.reqs {
				byID[r.ID] = r.Prompt
			}
			m := decode(t, rec)
			choices := m["choices"].([]any)
			if len(choices) != len(tc.prompts)*tc.n {
				t.Fatalf("%d choices, want %d", len(choices), len(tc.prompts)*tc.n)
			}
			for i, c := range choices {
				c := c.(map[string]any)
				// choice index = prompt_index*n + j; sequence j's text starts with 'a'+j.
				if int(c["index"].(float64)) != i {
					t.Fatalf("choice %d has index %v", i, c["index"])
				}
				j := i % tc.n
				if want := string(rune('a'+j)) + string(rune('a'+j+1)); c["text"] != want {
					t.Errorf("choice %d text %q, want %q", i, c["text"], want)
				}
			}
			// prompt i went to its own engine request, in order
			for i, want := range tc.prompts {
				got := eng.reqs[i].Prompt
				if !equalIDs(got, want) {
					t.Errorf("prompt %d = %v, want %v", i, got, want)
				}
			}
			u := m["usage"].(map[string]any)
			total := 0
			for _, p := range tc.prompts {
				total += len(p)
			}
			if int(u["prompt_tokens"].(float64)) != total || int(u["completion_tokens"].(float64)) != 2*tc.n*len(tc.prompts) {
				t.Errorf("usage %v", u)
			}
		})
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestCompletionBestOfIsTheEngines checks that best_of goes to the engine, which owns
// it (it sends back the n best, best first: TestE2EBestOfPicksHighestCumulativeLogprob
// checks the real one), and that the API returns those n in the engine's order.
func TestCompletionBestOfIsTheEngines(t *testing.T) {
	eng := newFakeEngine()
	s := newTestServer(t, eng, nil)
	rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"x","max_tokens":1,"n":2,"best_of":3}`)
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if p := eng.lastRequest().Params; p.N != 2 || p.BestOf != 3 {
		t.Fatalf("engine asked for n=%d best_of=%d, want 2 and 3", p.N, p.BestOf)
	}
	choices := decode(t, rec)["choices"].([]any)
	if len(choices) != 2 {
		t.Fatalf("%d choices", len(choices))
	}
	for i, want := range []string{"a", "b"} {
		if c := choices[i].(map[string]any); c["text"] != want || c["index"] != float64(i) {
			t.Errorf("choice %d = %v", i, c)
		}
	}
}

func TestCompletionEchoWithLogprobs(t *testing.T) {
	eng := newFakeEngine()
	s := newTestServer(t, eng, nil)
	rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"hi","max_tokens":2,"echo":true,"logprobs":1}`)
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if p := eng.lastRequest().Params; p.PromptLogprobs != 1 || p.Logprobs != 1 {
		t.Fatalf("params %+v", p)
	}
	c := decode(t, rec)["choices"].([]any)[0].(map[string]any)
	if c["text"] != "hiab" {
		t.Fatalf("text %q", c["text"])
	}
	lp := c["logprobs"].(map[string]any)
	toks := lp["tokens"].([]any)
	if len(toks) != 5 || toks[0] != "<s>" || toks[1] != "h" || toks[3] != "a" {
		t.Fatalf("tokens %v", toks)
	}
	tl := lp["token_logprobs"].([]any)
	if tl[0] != nil || tl[1] != -0.25 || tl[3] != -1.0 {
		t.Fatalf("token_logprobs %v", tl)
	}
	if top := lp["top_logprobs"].([]any); top[0] != nil {
		t.Fatalf("first prompt token top_logprobs should be null: %v", top[0])
	}
	// offsets: prompt text "hi" starts at 0; generated tokens continue after it.
	off := lp["text_offset"].([]any)
	// BOS is not part of the echoed text: it and "h" both start at 0
	if off[0] != 0.0 || off[1] != 0.0 || off[2] != 1.0 || off[3] != 2.0 || off[4] != 3.0 {
		t.Fatalf("text_offset %v", off)
	}
}

func TestCompletionEngineErrors(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		status int
		code   string
		param  any
	}{
		{"overloaded", engine.ErrOverloaded, 429, "overloaded", nil},
		{"too long", fmt.Errorf("%w: the prompt needs 40 KV blocks, the cache has 32", engine.ErrPromptTooLong), 400, "context_length_exceeded", "prompt"},
		{"closed", engine.ErrClosed, 503, "unavailable", nil},
		{"invalid", engine.ErrInvalidRequest, 400, "invalid_value", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eng := newFakeEngine()
			eng.submitFn = func(*engine.Request) error { return tc.err }
			s := newTestServer(t, eng, nil)
			for _, stream := range []string{"false", "true"} {
				rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"x","stream":`+stream+`}`)
				if rec.Code != tc.status {
					t.Fatalf("stream=%s: status %d, want %d", stream, rec.Code, tc.status)
				}
				e := errorObject(t, rec.Body.Bytes())
				if e["code"] != tc.code {
					t.Errorf("code %v, want %s", e["code"], tc.code)
				}
				if e["param"] != tc.param {
					t.Errorf("param %v, want %v", e["param"], tc.param)
				}
				if tc.status == 429 && rec.Header().Get("Retry-After") == "" {
					t.Error("429 without Retry-After")
				}
			}
		})
	}
}

func TestEngineFailureBeforeFirstByteIs500(t *testing.T) {
	eng := newFakeEngine()
	eng.failFirst = true
	s := newTestServer(t, eng, nil)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		for _, stream := range []string{"false", "true"} {
			body := `{"model":"test-model","prompt":"x","messages":[{"role":"user","content":"x"}],"stream":` + stream + `}`
			rec := do(t, s.Handler(), "POST", path, body)
			if rec.Code != 500 {
				t.Fatalf("%s stream=%s: status %d: %s", path, stream, rec.Code, rec.Body)
			}
			if e := errorObject(t, rec.Body.Bytes()); e["type"] != "server_error" {
				t.Errorf("type %v", e["type"])
			}
		}
	}
	// the server keeps serving
	eng.failFirst = false
	if rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"x"}`); rec.Code != 200 {
		t.Fatalf("after failure: %d", rec.Code)
	}
}

func TestPromptTooLongStatesLimits(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	long := strings.Repeat("a", testMaxLen)
	rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"`+long+`"}`)
	if rec.Code != 400 {
		t.Fatalf("status %d", rec.Code)
	}
	e := errorObject(t, rec.Body.Bytes())
	msg := e["message"].(string)
	if !strings.Contains(msg, "64") || !strings.Contains(msg, "65") || e["code"] != "context_length_exceeded" || e["param"] != "prompt" {
		t.Fatalf("error %v", e)
	}
}

func TestCompletionEchoOnlyPrompt(t *testing.T) {
	eng := newFakeEngine()
	s := newTestServer(t, eng, nil)
	for _, stream := range []bool{false, true} {
		body := `{"model":"test-model","prompt":"hi","max_tokens":0,"echo":true,"logprobs":0}`
		if stream {
			body = `{"model":"test-model","prompt":"hi","max_tokens":0,"echo":true,"logprobs":0,"stream":true,"stream_options":{"include_usage":true}}`
		}
		rec := do(t, s.Handler(), "POST", "/v1/completions", body)
		if rec.Code != 200 {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		out := rec.Body.String()
		if stream {
			var chunks []map[string]json.RawMessage
			chunks = dataEvents(t, readSSE(t, strings.NewReader(out)))
			if len(chunks) != 2 {
				t.Fatalf("%d chunks: %s", len(chunks), out)
			}
			var ch openai.CompletionResponse
			json.Unmarshal(mustJSON(chunks[0]), &ch)
			if ch.Choices[0].Text != "hi" || len(ch.Choices[0].Logprobs.Tokens) != 3 || *ch.Choices[0].FinishReason != "length" {
				t.Fatalf("chunk %s", mustJSON(chunks[0]))
			}
			if !strings.Contains(string(chunks[1]["usage"]), `"completion_tokens":0`) {
				t.Fatalf("usage %s", chunks[1]["usage"])
			}
			continue
		}
		m := decode(t, rec)
		c := m["choices"].([]any)[0].(map[string]any)
		lp := c["logprobs"].(map[string]any)
		if c["text"] != "hi" || len(lp["tokens"].([]any)) != 3 || c["finish_reason"] != "length" {
			t.Fatalf("choice %v", c)
		}
		if u := m["usage"].(map[string]any); u["completion_tokens"] != 0.0 || u["total_tokens"] != 3.0 {
			t.Fatalf("usage %v", u)
		}
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// panicEngine panics in Submit, standing in for a bug below the HTTP layer.
type panicEngine struct{ *fakeEngine }

func (panicEngine) Submit(context.Context, *engine.Request) (<-chan engine.Event, error) {
	panic("boom")
}

func TestPanicIs500AndServerKeepsServing(t *testing.T) {
	s := newTestServer(t, nil, nil)
	s.SetBackend(Backend{Engine: panicEngine{newFakeEngine()}, Tokenizer: fakeTokenizer{}, MaxModelLen: testMaxLen})
	rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"x"}`)
	if rec.Code != 500 || errorObject(t, rec.Body.Bytes())["type"] != "server_error" {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if rec := do(t, s.Handler(), "GET", "/health", ""); rec.Code != 200 {
		t.Fatalf("health after panic: %d", rec.Code)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"model name":  func(c *Config) { c.ModelName = "" },
		"body":        func(c *Config) { c.MaxBodyBytes = 0 },
		"connections": func(c *Config) { c.MaxConnections = 0 },
		"header":      func(c *Config) { c.ReadHeaderTimeout = 0 },
		"keep-alive":  func(c *Config) { c.KeepAliveInterval = 0 },
		"grace":       func(c *Config) { c.AbortGrace = -1 },
	} {
		c := DefaultConfig()
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: invalid config accepted", name)
		}
		if _, err := New(c); err == nil {
			t.Errorf("%s: New accepted an invalid config", name)
		}
	}
}

// TestSamplingDefaultsFromModel checks Backend.Defaults (conveyor serve
// --generation-config auto): they fill the fields a request leaves out, a request's own
// values win, and a default the engine's rules refuse is dropped (Checked).
func TestSamplingDefaultsFromModel(t *testing.T) {
	f := func(x float64) *float64 { return &x }
	topK, hugeK := 40, 1000
	eng := newFakeEngine()
	s := newTestServer(t, nil, nil)
	defaults, dropped := openai.SamplingDefaults{Temperature: f(0.8), TopP: f(0.95), TopK: &topK, RepetitionPenalty: f(7), MinP: f(0.05)}.Checked(fakeLimits)
	if len(dropped) != 1 || !strings.Contains(dropped[0].Error(), "repetition_penalty must be between 0 and 2, got 7") {
		t.Fatalf("dropped %v, want the repetition_penalty of 7", dropped)
	}
	if d, dropped := (openai.SamplingDefaults{TopK: &hugeK, Temperature: f(-1)}).Checked(fakeLimits); len(dropped) != 2 || d.TopK != nil || d.Temperature != nil {
		t.Fatalf("top_k past the vocabulary and a negative temperature: kept %+v, dropped %v", d, dropped)
	}
	s.SetBackend(Backend{Engine: eng, Tokenizer: fakeTokenizer{}, MaxModelLen: testMaxLen, Defaults: defaults})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		body := `{"model":"test-model","prompt":"hi"}`
		if path == "/v1/chat/completions" {
			body = `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`
		}
		if rec := do(t, s.Handler(), "POST", path, body); rec.Code != 200 {
			t.Fatalf("%s: status %d: %s", path, rec.Code, rec.Body)
		}
		p := eng.lastRequest().Params
		if p.Temperature != 0.8 || p.TopP != 0.95 || p.TopK != 40 || p.MinP != 0.05 {
			t.Errorf("%s: model defaults not applied: %+v", path, p)
		}
		if p.RepetitionPenalty != 1 {
			t.Errorf("%s: out-of-range default repetition_penalty 7 was applied: %v", path, p.RepetitionPenalty)
		}
	}
	rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"hi","temperature":0,"top_p":1,"top_k":-1}`)
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if p := eng.lastRequest().Params; p.Temperature != 0 || p.TopP != 1 || p.TopK != 0 {
		t.Errorf("request values did not override the model defaults: %+v", p)
	}
}

// TestVLLMExtensions: vLLM's include_stop_str_in_output and skip_special_tokens reach the
// engine on every generation endpoint; vLLM members Conveyor does not implement are a 400
// naming them when they ask for something, and accepted at null or their default.
func TestVLLMExtensions(t *testing.T) {
	eng := newFakeEngine()
	s := newTestServer(t, eng, nil)
	h := s.Handler()
	bodies := map[string]string{
		"/v1/completions":      `{"model":"test-model","prompt":"x","max_tokens":1%s}`,
		"/v1/chat/completions": `{"model":"test-model","messages":[{"role":"user","content":"x"}],"max_tokens":1%s}`,
	}
	for path, body := range bodies {
		rec := do(t, h, "POST", path, fmt.Sprintf(body, `,"stop":["y"],"include_stop_str_in_output":true,"skip_special_tokens":false`))
		if rec.Code != 200 {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
		}
		if p := eng.lastRequest().Params; !p.IncludeStopStr || !p.KeepSpecialTokens {
			t.Errorf("%s: include_stop_str_in_output %v, keep special tokens %v", path, p.IncludeStopStr, p.KeepSpecialTokens)
		}
		if rec := do(t, h, "POST", path, fmt.Sprintf(body, "")); rec.Code != 200 || eng.lastRequest().Params.IncludeStopStr || eng.lastRequest().Params.KeepSpecialTokens {
			t.Errorf("%s without them: %d %+v", path, rec.Code, eng.lastRequest().Params)
		}
		for _, tc := range []struct {
			member string
			ok     bool
		}{
			{`"use_beam_search":true`, false}, {`"use_beam_search":false`, true},
			{`"prompt_logprobs":1`, false}, {`"prompt_logprobs":null`, true},
			{`"guided_json":{"type":"object"}`, false}, {`"length_penalty":1.0`, true},
			{`"priority":0`, true}, {`"priority":5`, false}, {`"bad_words":[ ]`, true}, {`"bad_words":["x"]`, false},
		} {
			rec := do(t, h, "POST", path, fmt.Sprintf(body, ","+tc.member))
			name := strings.Trim(strings.SplitN(tc.member, ":", 2)[0], `"`)
			switch {
			case tc.ok && rec.Code != 200:
				t.Errorf("%s %s: %d %s, want it accepted", path, tc.member, rec.Code, rec.Body)
			case !tc.ok && (rec.Code != 400 || errorObject(t, rec.Body.Bytes())["param"] != name):
				t.Errorf("%s %s: %d %s, want a 400 naming %s", path, tc.member, rec.Code, rec.Body, name)
			}
		}
	}
	// vLLM's chat-only members.
	for member, ok := range map[string]bool{`"echo":true`: false, `"echo":false`: true, `"best_of":2`: false,
		`"continue_final_message":true`: false, `"chat_template":"{{x}}"`: false, `"add_special_tokens":false`: true} {
		rec := do(t, h, "POST", "/v1/chat/completions", fmt.Sprintf(bodies["/v1/chat/completions"], ","+member))
		if (rec.Code == 200) != ok {
			t.Errorf("chat %s: %d %s, want accepted %v", member, rec.Code, rec.Body, ok)
		}
	}
}
