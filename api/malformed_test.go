package api

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/r3labs/sse/v2"

	"github.com/conveyor-llm/conveyor/api/openai"
)

type badCase struct {
	name   string
	method string
	path   string
	body   string
	status int
	param  string // expected error param ("" = not checked)
}

const cp = "/v1/completions"
const chp = "/v1/chat/completions"

func comp(extra string) string {
	return `{"model":"test-model","prompt":"x"` + extra + `}`
}

func chat(extra string) string {
	return `{"model":"test-model","messages":[{"role":"user","content":"x"}]` + extra + `}`
}

func chatMsgs(msgs string) string {
	return `{"model":"test-model","messages":` + msgs + `}`
}

var badCases = []badCase{
	{"not json", "POST", cp, `{`, 400, ""},
	{"json array body", "POST", cp, `[]`, 400, ""},
	{"empty body", "POST", cp, ``, 400, ""},
	{"trailing garbage", "POST", cp, `{"model":"test-model"} x`, 400, ""},
	{"missing model", "POST", cp, `{"prompt":"x"}`, 400, "model"},
	{"model number", "POST", cp, `{"model":5,"prompt":"x"}`, 400, "model"},
	{"unknown model", "POST", cp, `{"model":"gpt-9","prompt":"x"}`, 404, "model"},
	{"missing prompt", "POST", cp, `{"model":"test-model"}`, 400, "prompt"},
	{"empty prompt", "POST", cp, `{"model":"test-model","prompt":""}`, 400, "prompt"},
	{"empty prompt array", "POST", cp, `{"model":"test-model","prompt":[]}`, 400, "prompt"},
	{"empty inner token array", "POST", cp, `{"model":"test-model","prompt":[[]]}`, 400, "prompt"},
	{"mixed ids and strings", "POST", cp, `{"model":"test-model","prompt":[1,"a"]}`, 400, "prompt"},
	{"mixed strings and ids", "POST", cp, `{"model":"test-model","prompt":["a",1]}`, 400, "prompt"},
	{"empty string in list", "POST", cp, `{"model":"test-model","prompt":["a",""]}`, 400, "prompt"},
	{"negative token id", "POST", cp, `{"model":"test-model","prompt":[-1]}`, 400, "prompt"},
	{"token id past vocab", "POST", cp, `{"model":"test-model","prompt":[257]}`, 400, "prompt"},
	{"fractional token id", "POST", cp, `{"model":"test-model","prompt":[1.5]}`, 400, "prompt"},
	{"prompt object", "POST", cp, `{"model":"test-model","prompt":{}}`, 400, "prompt"},
	{"prompt bool", "POST", cp, `{"model":"test-model","prompt":true}`, 400, "prompt"},
	{"bad id in second array", "POST", cp, `{"model":"test-model","prompt":[[1],[999]]}`, 400, "prompt"},
	{"prompt too long", "POST", cp, `{"model":"test-model","prompt":"` + strings.Repeat("z", 80) + `"}`, 400, "prompt"},
	{"max_tokens string", "POST", cp, comp(`,"max_tokens":"ten"`), 400, "max_tokens"},
	{"max_tokens negative", "POST", cp, comp(`,"max_tokens":-1`), 400, "max_tokens"},
	{"max_tokens zero", "POST", cp, comp(`,"max_tokens":0`), 400, "max_tokens"},
	{"max_tokens fraction", "POST", cp, comp(`,"max_tokens":1.5`), 400, "max_tokens"},
	{"max_tokens huge", "POST", cp, comp(`,"max_tokens":100000`), 400, "max_tokens"},
	{"temperature too high", "POST", cp, comp(`,"temperature":3`), 400, "temperature"},
	{"temperature string", "POST", cp, comp(`,"temperature":"hot"`), 400, "temperature"},
	{"temperature negative", "POST", cp, comp(`,"temperature":-0.1`), 400, "temperature"},
	{"top_p above one", "POST", cp, comp(`,"top_p":1.5`), 400, "top_p"},
	{"n zero", "POST", cp, comp(`,"n":0`), 400, "n"},
	{"n huge", "POST", cp, comp(`,"n":1000`), 400, "n"},
	{"n string", "POST", cp, comp(`,"n":"2"`), 400, "n"},
	{"stream string", "POST", cp, comp(`,"stream":"yes"`), 400, "stream"},
	{"stream_options without stream", "POST", cp, comp(`,"stream_options":{"include_usage":true}`), 400, "stream_options"},
	{"include_usage string", "POST", cp, comp(`,"stream":true,"stream_options":{"include_usage":"yes"}`), 400, "stream_options.include_usage"},
	{"stream_options number", "POST", cp, comp(`,"stream":true,"stream_options":5`), 400, "stream_options"},
	{"logprobs too many", "POST", cp, comp(`,"logprobs":21`), 400, "logprobs"},
	{"logprobs bool", "POST", cp, comp(`,"logprobs":true`), 400, "logprobs"},
	{"logprobs -1", "POST", cp, comp(`,"logprobs":-1`), 400, "logprobs"},
	{"logprobs -3 with echo", "POST", cp, comp(`,"logprobs":-3,"echo":true`), 400, "logprobs"},
	{"echo string", "POST", cp, comp(`,"echo":"no"`), 400, "echo"},
	{"stop number", "POST", cp, comp(`,"stop":5`), 400, "stop"},
	{"stop five strings", "POST", cp, comp(`,"stop":["a","b","c","d","e"]`), 400, "stop"},
	{"stop array of numbers", "POST", cp, comp(`,"stop":[1]`), 400, "stop"},
	{"presence_penalty high", "POST", cp, comp(`,"presence_penalty":3`), 400, "presence_penalty"},
	{"frequency_penalty low", "POST", cp, comp(`,"frequency_penalty":-3`), 400, "frequency_penalty"},
	{"logit_bias array", "POST", cp, comp(`,"logit_bias":[]`), 400, "logit_bias"},
	{"logit_bias bad key", "POST", cp, comp(`,"logit_bias":{"abc":1}`), 400, "logit_bias"},
	{"logit_bias out of range", "POST", cp, comp(`,"logit_bias":{"1":101}`), 400, "logit_bias"},
	{"logit_bias key past vocab", "POST", cp, comp(`,"logit_bias":{"99999":1}`), 400, "logit_bias"},
	{"logit_bias string value", "POST", cp, comp(`,"logit_bias":{"1":"x"}`), 400, "logit_bias"},
	{"seed string", "POST", cp, comp(`,"seed":"s"`), 400, "seed"},
	{"seed fraction", "POST", cp, comp(`,"seed":1.5`), 400, "seed"},
	{"user number", "POST", cp, comp(`,"user":5`), 400, "user"},
	{"best_of below n", "POST", cp, comp(`,"n":2,"best_of":1`), 400, "best_of"},
	{"best_of zero", "POST", cp, comp(`,"best_of":0`), 400, "best_of"},
	{"stop null item", "POST", cp, comp(`,"stop":["a",null]`), 400, "stop"},
	{"best_of streamed", "POST", cp, comp(`,"best_of":3,"stream":true`), 400, "best_of"},
	{"suffix", "POST", cp, comp(`,"suffix":"tail"`), 400, "suffix"},
	{"top_k below -1", "POST", cp, comp(`,"top_k":-2`), 400, "top_k"},
	{"min_p above one", "POST", cp, comp(`,"min_p":2`), 400, "min_p"},
	{"repetition_penalty zero", "POST", cp, comp(`,"repetition_penalty":0`), 400, "repetition_penalty"},
	{"min_tokens over max_tokens", "POST", cp, comp(`,"min_tokens":20`), 400, "min_tokens"},
	{"ignore_eos number", "POST", cp, comp(`,"ignore_eos":1`), 400, "ignore_eos"},
	{"stop_token_ids past vocab", "POST", cp, comp(`,"stop_token_ids":[300]`), 400, "stop_token_ids"},
	{"stop_token_ids string", "POST", cp, comp(`,"stop_token_ids":"x"`), 400, "stop_token_ids"},
	{"chat missing messages", "POST", chp, `{"model":"test-model"}`, 400, "messages"},
	{"chat empty messages", "POST", chp, chatMsgs(`[]`), 400, "messages"},
	{"chat messages string", "POST", chp, chatMsgs(`"hi"`), 400, "messages"},
	{"chat message number", "POST", chp, chatMsgs(`[1]`), 400, "messages"},
	{"chat role missing", "POST", chp, chatMsgs(`[{"content":"x"}]`), 400, "messages[0].role"},
	{"chat role unknown", "POST", chp, chatMsgs(`[{"role":"wizard","content":"x"}]`), 400, "messages[0].role"},
	{"chat content number", "POST", chp, chatMsgs(`[{"role":"user","content":5}]`), 400, "messages[0].content"},
	{"chat content missing", "POST", chp, chatMsgs(`[{"role":"user"}]`), 400, "messages[0].content"},
	{"chat image part", "POST", chp, chatMsgs(`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`), 400, "messages[0].content[0].type"},
	{"chat part without text", "POST", chp, chatMsgs(`[{"role":"user","content":[{"type":"text"}]}]`), 400, "messages[0].content[0].text"},
	{"chat part not object", "POST", chp, chatMsgs(`[{"role":"user","content":["x"]}]`), 400, "messages[0].content"},
	{"chat second message bad", "POST", chp, chatMsgs(`[{"role":"user","content":"x"},{"role":"user","content":null}]`), 400, "messages[1].content"},
	{"chat top_logprobs too many", "POST", chp, chat(`,"logprobs":true,"top_logprobs":21`), 400, "top_logprobs"},
	{"chat top_logprobs without logprobs", "POST", chp, chat(`,"top_logprobs":2`), 400, "top_logprobs"},
	{"chat top_logprobs -1", "POST", chp, chat(`,"logprobs":true,"top_logprobs":-1`), 400, "top_logprobs"},
	{"chat top_logprobs -2 without logprobs", "POST", chp, chat(`,"top_logprobs":-2`), 400, "top_logprobs"},
	{"chat logprobs number", "POST", chp, chat(`,"logprobs":1`), 400, "logprobs"},
	{"chat max_completion_tokens string", "POST", chp, chat(`,"max_completion_tokens":"x"`), 400, "max_completion_tokens"},
	{"chat max_tokens zero", "POST", chp, chat(`,"max_tokens":0`), 400, "max_tokens"},
	{"chat max_completion_tokens zero", "POST", chp, chat(`,"max_completion_tokens":0`), 400, "max_completion_tokens"},
	{"chat response_format json_object", "POST", chp, chat(`,"response_format":{"type":"json_object"}`), 400, "response_format"},
	{"chat response_format string", "POST", chp, chat(`,"response_format":"json"`), 400, "response_format"},
	{"chat tools", "POST", chp, chat(`,"tools":[{"type":"function","function":{"name":""}}]`), 400, "tools"},
	{"chat tool_choice required", "POST", chp, chat(`,"tool_choice":"required"`), 400, "tool_choice"},
	{"chat audio", "POST", chp, chat(`,"modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"}`), 400, "modalities"},
	{"chat store", "POST", chp, chat(`,"store":true`), 400, "store"},
	{"completion response_format json_schema", "POST", cp, comp(`,"response_format":{"type":"json_schema","json_schema":{}}`), 400, "response_format"},
	{"chat unknown model", "POST", chp, `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "model"},
	{"chat prompt too long", "POST", chp, chatMsgs(`[{"role":"user","content":"` + strings.Repeat("z", 80) + `"}]`), 400, "messages"},
	{"unknown route", "GET", "/v1/nothing", ``, 404, ""},
	{"wrong method", "DELETE", "/v1/models", ``, 405, ""},
	{"detokenize without tokens", "POST", "/detokenize", `{}`, 400, "tokens"},
	{"detokenize bad id", "POST", "/detokenize", `{"tokens":[-5]}`, 400, "tokens"},
	{"tokenize prompt number", "POST", "/tokenize", `{"prompt":5}`, 400, "prompt"},
	{"tokenize prompt and messages", "POST", "/tokenize", `{"prompt":"x","messages":[{"role":"user","content":"y"}]}`, 400, "prompt"},
	{"body over limit", "POST", cp, comp(`,"user":"` + strings.Repeat("u", 70<<10) + `"`), 413, ""},
}

// TestMalformedRequestsWhileStreaming sends every malformed request of badCases while one
// stream is in flight, releasing one token of the stream between cases, and checks both
// that each bad request gets its 4xx with the OpenAI error object and that the stream
// delivers every token in order.
func TestMalformedRequestsWhileStreaming(t *testing.T) {
	if len(badCases) < 50 {
		t.Fatalf("only %d cases", len(badCases))
	}
	eng := newFakeEngine()
	eng.gate = make(chan struct{})
	s := newTestServer(t, eng, func(c *Config) {
		c.MaxBodyBytes = 64 << 10
		fastKeepAlive(c)
	})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	// one token is released before every other case, and one at the end
	nTokens := (len(badCases)+1)/2 + 1
	resp := postStream(t, context.Background(), srv.URL+cp, comp(`,"stream":true,"max_tokens":`+itoa(nTokens)))
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	texts := make(chan string)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(texts)
		rd := sse.NewEventStreamReader(resp.Body, 1<<20)
		for {
			raw, err := rd.ReadEvent()
			if err != nil {
				return
			}
			ev := parseEvent(t, raw)
			if ev.data == "" || ev.data == "[DONE]" {
				continue
			}
			var ch openai.CompletionResponse
			if err := unmarshal(ev.data, &ch); err != nil || len(ch.Choices) != 1 {
				t.Errorf("bad chunk %q", ev.data)
				return
			}
			texts <- ch.Choices[0].Text
		}
	}()

	var got strings.Builder
	step := func() {
		eng.gate <- struct{}{}
		got.WriteString(<-texts)
	}
	for i, tc := range badCases {
		if i%2 == 0 {
			step()
		}
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.name, r.StatusCode, tc.status, body)
			continue
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: content type %q", tc.name, ct)
		}
		e := errorObject(t, body)
		if tc.param != "" && e["param"] != tc.param {
			t.Errorf("%s: param %v, want %s (%s)", tc.name, e["param"], tc.param, e["message"])
		}
	}
	step()
	wg.Wait()
	want := ""
	for k := 0; k < nTokens; k++ {
		want += string(rune('a' + k))
	}
	if got.String() != want {
		t.Fatalf("stream text %q, want %q", got.String(), want)
	}
	// A request the engine refuses one of its prompts of is aborted whole: of the
	// malformed requests, only prompts that came before a refused one were accepted,
	// and each of those was aborted at once.
	eng.mu.Lock()
	defer eng.mu.Unlock()
	for _, r := range eng.reqs[1:] {
		if !eng.aborted[r.ID] {
			t.Errorf("a malformed request ran: %+v", r)
		}
	}
}

// TestIntegerParamMessages checks that an integer parameter's error says what is wrong
// with the number: too large to be any count (out of range) or not integral.
func TestIntegerParamMessages(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	for _, tc := range []struct{ extra, param, want string }{
		{`,"max_tokens":99999999999999999999999`, "max_tokens", "max_tokens is out of range, got "},
		{`,"max_tokens":1e400`, "max_tokens", "max_tokens is out of range, got "},
		{`,"seed":18446744073709551615`, "seed", "seed must be between"},
		{`,"max_tokens":5.5`, "max_tokens", "max_tokens must be an integer, got 5.5"},
		{`,"n":"2"`, "n", "n must be an integer, got a string"},
	} {
		rec := do(t, s.Handler(), "POST", cp, comp(tc.extra))
		e := errorObject(t, rec.Body.Bytes())
		if rec.Code != 400 || e["param"] != tc.param || !strings.HasPrefix(e["message"].(string), tc.want) {
			t.Errorf("%s: %d %v, want 400 param %s and a message starting %q", tc.extra, rec.Code, e, tc.param, tc.want)
		}
	}
}

// TestCompressedBodyIs415 refuses a body with a Content-Encoding instead of reading the
// compressed bytes as (invalid) JSON.
func TestCompressedBodyIs415(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	for _, path := range []string{cp, chp, "/tokenize"} {
		rec := do(t, s.Handler(), "POST", path, "\x1f\x8b\x08\x00", "Content-Encoding", "gzip")
		if rec.Code != 415 || errorObject(t, rec.Body.Bytes())["code"] != "unsupported_content_encoding" {
			t.Errorf("%s: %d %s", path, rec.Code, rec.Body)
		}
	}
	if rec := do(t, s.Handler(), "POST", cp, comp(`,"max_tokens":1`), "Content-Encoding", "identity"); rec.Code != 200 {
		t.Errorf("identity: %d %s", rec.Code, rec.Body)
	}
}

// TestNegativeLogprobs: logprobs (completions) and top_logprobs (chat) below 0, -1
// included, are 400s naming the parameter, from the engine's rule; the ungated fake
// engine answers at once, so a request that is let through fails the test, not its
// timeout.
func TestNegativeLogprobs(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	for _, tc := range []struct{ path, body, param, msg string }{
		{cp, comp(`,"logprobs":-1`), "logprobs", "logprobs must be between 0 and 20, got -1"},
		{cp, comp(`,"logprobs":-3,"echo":true`), "logprobs", "logprobs must be between 0 and 20, got -3"},
		{chp, chat(`,"logprobs":true,"top_logprobs":-1`), "top_logprobs", "top_logprobs must be between 0 and 20, got -1"},
		{chp, chat(`,"top_logprobs":-2`), "top_logprobs", "top_logprobs must be between 0 and 20, got -2"},
		{"/v1/responses", `{"model":"test-model","store":false,"input":"x","top_logprobs":-1}`, "top_logprobs",
			"top_logprobs must be between 0 and 20, got -1"},
	} {
		rec := do(t, s.Handler(), "POST", tc.path, tc.body)
		if rec.Code != 400 {
			t.Errorf("%s %s: status %d: %s", tc.path, tc.body, rec.Code, rec.Body)
			continue
		}
		if e := errorObject(t, rec.Body.Bytes()); e["param"] != tc.param || e["message"] != tc.msg {
			t.Errorf("%s %s: param %v, message %q; want %s, %q", tc.path, tc.body, e["param"], e["message"], tc.param, tc.msg)
		}
	}
}
