package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
)

// soakMalformed are bad requests the server must answer with 400 and an error object.
var soakMalformed = []struct{ path, body string }{
	{"/v1/completions", `{"model":"M","prompt":"hi","max_tokens":`},
	{"/v1/completions", `{"model":"M","prompt":"hi","temperature":5}`},
	{"/v1/completions", `{"model":"M","prompt":"hi","max_tokens":-3}`},
	{"/v1/completions", `{"model":"M"}`},
	{"/v1/chat/completions", `{"model":"M","messages":[]}`},
	{"/v1/chat/completions", `{"model":"M","messages":[{"role":"wizard","content":"hi"}]}`},
	{"/v1/chat/completions", `{"model":"M","messages":[{"role":"user","content":"hi"}],"n":0}`},
	{"/v1/chat/completions", `{"model":"M","messages":[{"role":"user","content":"hi"}],"top_p":7}`},
	{"/v1/chat/completions", `["not", "an", "object"]`},
	{"/v1/chat/completions", `{"model":"M","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema"}}`},
}

// errorReply is the OpenAI error object.
type errorReply struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// expect400 requires a 400 with an OpenAI error object, and code when set.
func expect400(k SoakKind, resp *http.Response, code string) soakResult {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusBadRequest {
		class := "status"
		if resp.StatusCode >= 500 {
			class = "5xx"
		}
		return fail(k, class, "HTTP %d, want 400: %.300s", resp.StatusCode, b)
	}
	var e errorReply
	if err := json.Unmarshal(b, &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		return fail(k, "error_object", "400 without an OpenAI error object: %.300s", b)
	}
	if code != "" && (e.Error.Code == nil || *e.Error.Code != code) {
		return fail(k, "error_code", "400 with code %v, want %q: %.300s", e.Error.Code, code, b)
	}
	return soakResult{kind: k, outcome: outcomeRejected}
}

func (c *soakClient) malformed(ctx context.Context, rng *rand.Rand) soakResult {
	m := soakMalformed[rng.IntN(len(soakMalformed))]
	modelJSON, _ := json.Marshal(c.target.Model)
	body := strings.Replace(m.body, `"M"`, string(modelJSON), 1)
	resp, err := c.post(ctx, m.path, []byte(body))
	if err != nil {
		return fail(SoakMalformed, "transport", "%v", err)
	}
	r := expect400(SoakMalformed, resp, "")
	if r.unexpected() {
		r.problem = fmt.Sprintf("%s %s: %s", m.path, body, r.problem)
	}
	return r
}

// overContext sends a prompt longer than the model's context: token ids on completions
// (exactly maxModelLen+1 tokens), or a long text on chat.
func (c *soakClient) overContext(ctx context.Context, rng *rand.Rand) soakResult {
	n := c.maxModelLen + 1 + rng.IntN(64)
	var path string
	var body map[string]any
	if rng.IntN(2) == 0 {
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = int32(10 + rng.IntN(90))
		}
		path, body = "/v1/completions", map[string]any{"model": c.target.Model, "prompt": ids, "max_tokens": 4}
	} else {
		text := strings.Repeat(" hello", n)
		path, body = "/v1/chat/completions", map[string]any{"model": c.target.Model, "max_tokens": 4,
			"messages": []any{map[string]any{"role": "user", "content": text}}}
	}
	if rng.IntN(2) == 0 {
		body["stream"] = true
	}
	resp, err := c.post(ctx, path, body)
	if err != nil {
		return fail(SoakOverContext, "transport", "%v", err)
	}
	return expect400(SoakOverContext, resp, "context_length_exceeded")
}

// maxBody sends a prompt that nearly fills the body limit, as a completion or as a chat
// message: far over any context, so a 400 context_length_exceeded, but only after the
// server has read, parsed and tokenized it all.
func (c *soakClient) maxBody(ctx context.Context, rng *rand.Rand) soakResult {
	words := []string{" alpha", " beta", " gamma", " delta", " old", " man", " sea"}
	var b strings.Builder
	for b.Len() < maxBodyBytes-4096 {
		b.WriteString(words[rng.IntN(len(words))])
	}
	path, body := "/v1/completions", map[string]any{"model": c.target.Model, "max_tokens": 4, "prompt": b.String()}
	if rng.IntN(2) == 0 {
		delete(body, "prompt")
		path, body["messages"] = "/v1/chat/completions", []any{map[string]any{"role": "user", "content": b.String()}}
	}
	resp, err := c.post(ctx, path, body)
	if err != nil {
		return fail(SoakMaxBody, "transport", "%v", err)
	}
	return expect400(SoakMaxBody, resp, "context_length_exceeded")
}
