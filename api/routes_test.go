package api

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/api/openai"
)

func TestChatNonStreaming(t *testing.T) {
	eng := newFakeEngine()
	s := newTestServer(t, eng, nil)
	body := `{"model":"test-model","messages":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"A"},{"type":"text","text":"B"}]}],
	"max_completion_tokens":3,"n":2,"logprobs":true,"top_logprobs":2}`
	rec := do(t, s.Handler(), "POST", "/v1/chat/completions", body)
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	r := eng.lastRequest()
	if want, _ := (fakeTokenizer{}).EncodeChat([]openai.Message{{Role: "system", Content: "S"}, {Role: "user", Content: "AB"}}, true); !equalIDs(r.Prompt, want) {
		t.Fatalf("prompt %v, want %v", r.Prompt, want)
	}
	if r.Params.MaxTokens != 3 || r.Params.Logprobs != 2 || r.Params.N != 2 {
		t.Fatalf("params %+v", r.Params)
	}
	m := decode(t, rec)
	if m["object"] != "chat.completion" || !strings.HasPrefix(m["id"].(string), "chatcmpl-") {
		t.Fatalf("%v %v", m["object"], m["id"])
	}
	choices := m["choices"].([]any)
	if len(choices) != 2 {
		t.Fatalf("%d choices", len(choices))
	}
	c1 := choices[1].(map[string]any)
	msg := c1["message"].(map[string]any)
	if msg["role"] != "assistant" || msg["content"] != "bcd" || c1["finish_reason"] != "length" {
		t.Fatalf("choice %v", c1)
	}
	content := c1["logprobs"].(map[string]any)["content"].([]any)
	first := content[0].(map[string]any)
	if first["token"] != "b" || first["logprob"] != -2.0 || len(first["bytes"].([]any)) != 1 || first["bytes"].([]any)[0] != float64('b') {
		t.Fatalf("logprob entry %v", first)
	}
	if top := first["top_logprobs"].([]any); len(top) != 2 || top[0].(map[string]any)["token"] != "A" {
		t.Fatalf("top_logprobs %v", top)
	}
}

func TestHealthLifecycle(t *testing.T) {
	s := newTestServer(t, nil, nil)
	if rec := do(t, s.Handler(), "GET", "/health", ""); rec.Code != 503 {
		t.Fatalf("before load: %d", rec.Code)
	}
	if rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"x"}`); rec.Code != 503 {
		t.Fatalf("completion before load: %d", rec.Code)
	}
	s.SetBackend(Backend{Engine: newFakeEngine(), Tokenizer: fakeTokenizer{}, MaxModelLen: testMaxLen})
	rec := do(t, s.Handler(), "GET", "/health", "")
	if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"status":"ok"}` {
		t.Fatalf("ready: %d %s", rec.Code, rec.Body)
	}
	// Unready (the lame-duck period of --shutdown-delay): /health is 503, requests are served.
	s.Unready()
	if rec := do(t, s.Handler(), "GET", "/health", ""); rec.Code != 503 || strings.TrimSpace(rec.Body.String()) != `{"status":"draining"}` {
		t.Fatalf("unready: %d %s", rec.Code, rec.Body)
	}
	if rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"x","max_tokens":2}`); rec.Code != 200 {
		t.Fatalf("completion while unready: %d %s", rec.Code, rec.Body)
	}
	s.draining.Store(true)
	if rec := do(t, s.Handler(), "GET", "/health", ""); rec.Code != 503 {
		t.Fatalf("draining: %d", rec.Code)
	}
	if rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"x","max_tokens":2}`); rec.Code != 503 {
		t.Fatalf("completion while draining: %d", rec.Code)
	}
}

func TestModelsEndpoints(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	s.SetBackend(Backend{Engine: newFakeEngine(), Tokenizer: fakeTokenizer{}, MaxModelLen: testMaxLen, Quantization: "int4", KVCacheDType: "float16"})
	m := decode(t, do(t, s.Handler(), "GET", "/v1/models", ""))
	data := m["data"].([]any)
	if m["object"] != "list" || len(data) != 1 || data[0].(map[string]any)["id"] != testModel || data[0].(map[string]any)["object"] != "model" {
		t.Fatalf("%v", m)
	}
	if e := data[0].(map[string]any); e["quantization"] != "int4" || e["kv_cache_dtype"] != "float16" || e["max_model_len"] != float64(testMaxLen) {
		t.Fatalf("model entry %v: want quantization int4, kv_cache_dtype float16, max_model_len %d", e, testMaxLen)
	}
	if rec := do(t, s.Handler(), "GET", "/v1/models/test-model", ""); rec.Code != 200 || decode(t, rec)["id"] != testModel {
		t.Fatalf("model: %d", rec.Code)
	}
	rec := do(t, s.Handler(), "GET", "/v1/models/other", "")
	if rec.Code != 404 || errorObject(t, rec.Body.Bytes())["code"] != "model_not_found" {
		t.Fatalf("unknown model: %d %s", rec.Code, rec.Body)
	}
}

func TestTokenizeDetokenize(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	m := decode(t, do(t, s.Handler(), "POST", "/tokenize", `{"prompt":"ab"}`))
	if m["count"] != 3.0 || m["max_model_len"] != float64(testMaxLen) || len(m["tokens"].([]any)) != 3 {
		t.Fatalf("%v", m)
	}
	m = decode(t, do(t, s.Handler(), "POST", "/tokenize", `{"prompt":"ab","add_special_tokens":false}`))
	if m["count"] != 2.0 {
		t.Fatalf("%v", m)
	}
	m = decode(t, do(t, s.Handler(), "POST", "/tokenize", `{"messages":[{"role":"user","content":"q"}]}`))
	want, _ := fakeTokenizer{}.EncodeChat([]openai.Message{{Role: "user", Content: "q"}}, true)
	if int(m["count"].(float64)) != len(want) {
		t.Fatalf("%v", m)
	}
	m = decode(t, do(t, s.Handler(), "POST", "/detokenize", `{"tokens":[0,105,106]}`))
	if m["prompt"] != "<s>hi" {
		t.Fatalf("%v", m)
	}
	if rec := do(t, s.Handler(), "POST", "/detokenize", `{"tokens":[1000]}`); rec.Code != 400 {
		t.Fatalf("out of vocab: %d", rec.Code)
	}
}

func TestAuth(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), func(c *Config) { c.APIKey = "sekret" })
	body := `{"model":"test-model","prompt":"x","max_tokens":1}`
	for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"Authorization", "sekret"}} {
		rec := do(t, s.Handler(), "POST", "/v1/completions", body, hdr...)
		if rec.Code != 401 || errorObject(t, rec.Body.Bytes())["code"] != "invalid_api_key" {
			t.Fatalf("%v: %d %s", hdr, rec.Code, rec.Body)
		}
	}
	if rec := do(t, s.Handler(), "POST", "/v1/completions", body, "Authorization", "Bearer sekret"); rec.Code != 200 {
		t.Fatalf("right key: %d", rec.Code)
	}
	for _, path := range []string{"/health", "/metrics"} {
		if rec := do(t, s.Handler(), "GET", path, ""); rec.Code != 200 {
			t.Fatalf("%s should stay open: %d", path, rec.Code)
		}
	}
	if rec := do(t, s.Handler(), "GET", "/v1/models", ""); rec.Code != 401 {
		t.Fatalf("/v1/models without key: %d", rec.Code)
	}
}

func TestBodyLimit(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), func(c *Config) { c.MaxBodyBytes = 100 })
	big := `{"model":"test-model","prompt":"` + strings.Repeat("a", 200) + `"}`
	rec := do(t, s.Handler(), "POST", "/v1/completions", big)
	if rec.Code != 413 || errorObject(t, rec.Body.Bytes())["code"] != "request_too_large" {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	// without a Content-Length the limit is enforced while reading
	req := httptest.NewRequest("POST", "/v1/completions", io.MultiReader(strings.NewReader(big)))
	req.ContentLength = -1
	rr := httptest.NewRecorder()
	s.Handler().ServeHTTP(rr, req)
	if rr.Code != 413 {
		t.Fatalf("chunked: %d %s", rr.Code, rr.Body)
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	rec := do(t, s.Handler(), "GET", "/v1/nothing", "")
	if rec.Code != 404 || errorObject(t, rec.Body.Bytes())["code"] != "not_found" {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	rec = do(t, s.Handler(), "GET", "/v1/completions", "")
	if rec.Code != 405 || errorObject(t, rec.Body.Bytes())["code"] != "method_not_allowed" {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	// A trailing slash: an unknown route, not a redirect.
	rec = do(t, s.Handler(), "POST", "/v1/completions/", `{"model":"test-model","prompt":"x"}`)
	if rec.Code != 404 || errorObject(t, rec.Body.Bytes())["code"] != "not_found" {
		t.Fatalf("trailing slash: %d %s", rec.Code, rec.Body)
	}
}

func TestRequestIDEchoed(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	rec := do(t, s.Handler(), "GET", "/health", "", "X-Request-Id", "abc-123")
	if got := rec.Header().Get("X-Request-Id"); got != "abc-123" {
		t.Fatalf("echo: %q", got)
	}
	rec = do(t, s.Handler(), "GET", "/health", "", "X-Request-Id", "bad id with spaces")
	if got := rec.Header().Get("X-Request-Id"); got == "" || strings.Contains(got, " ") {
		t.Fatalf("generated: %q", got)
	}
}

func TestHeadOnGetRoutes(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	for _, path := range []string{"/health", "/metrics", "/v1/models", "/v1/models/test-model"} {
		rec := do(t, s.Handler(), "HEAD", path, "")
		if rec.Code != 200 {
			t.Errorf("HEAD %s: %d %s", path, rec.Code, rec.Body)
		}
	}
	// A route that only takes POST still refuses HEAD, naming the allowed method.
	rec := do(t, s.Handler(), "HEAD", "/v1/completions", "")
	if rec.Code != 405 || rec.Header().Get("Allow") != "POST" {
		t.Fatalf("HEAD /v1/completions: %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
}

// TestAuthSchemeIsCaseInsensitive accepts the bearer scheme in any case (RFC 9110) and
// still refuses other schemes and a wrong key.
func TestAuthSchemeIsCaseInsensitive(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), func(c *Config) { c.APIKey = "sekret" })
	for _, auth := range []string{"Bearer sekret", "bearer sekret", "BEARER sekret", "Bearer  sekret "} {
		if rec := do(t, s.Handler(), "GET", "/v1/models", "", "Authorization", auth); rec.Code != 200 {
			t.Errorf("%q: %d", auth, rec.Code)
		}
	}
	for _, auth := range []string{"Basic sekret", "bearer wrong", "Bearersekret", "sekret"} {
		if rec := do(t, s.Handler(), "GET", "/v1/models", "", "Authorization", auth); rec.Code != 401 {
			t.Errorf("%q: %d, want 401", auth, rec.Code)
		}
	}
}
