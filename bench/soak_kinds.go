package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// SoakKind is one kind of request in the soak's mix.
type SoakKind string

// The soak's request kinds. Every kind has one expected set of outcomes; anything else is
// unexpected.
const (
	SoakCompletion       SoakKind = "completion"        // /v1/completions, JSON reply
	SoakCompletionStream SoakKind = "completion_stream" // /v1/completions, SSE
	SoakChat             SoakKind = "chat"              // /v1/chat/completions, JSON reply
	SoakChatStream       SoakKind = "chat_stream"       // /v1/chat/completions, SSE
	SoakChatN            SoakKind = "chat_n"            // chat with n in 2..3, streamed or not
	SoakDrop             SoakKind = "drop"              // a stream the client hangs up on after its first chunk
	SoakJSONSchema       SoakKind = "json_schema"       // chat with response_format json_schema; the reply validates
	SoakToolCall         SoakKind = "tool_call"         // chat with tools and tool_choice required; arguments validate
	SoakMalformed        SoakKind = "malformed"         // a bad request: 400 with an OpenAI error object
	SoakOverContext      SoakKind = "over_context"      // a prompt longer than the context: 400 context_length_exceeded

	// The storm kinds, the largest requests the server accepts; not in the default mix
	// ("--kinds storm" is both).
	SoakMaxBody SoakKind = "max_body" // a body just under the 8 MiB limit, far over the context: 400 context_length_exceeded
	SoakMaxN    SoakKind = "max_n"    // the longest prompt that fits, n (and best_of) at the limit: every choice finished
)

// maxBodyBytes is what a max_body request's prompt nearly fills: the server's body limit.
const maxBodyBytes = 8 << 20

// soakMaxN is the max_n kind's n: the engine's limit.
const soakMaxN = 128

// SoakKinds lists every kind with its weight in the default mix.
var SoakKinds = []struct {
	Kind   SoakKind
	Weight int
}{
	{SoakCompletion, 2}, {SoakCompletionStream, 2}, {SoakChat, 2}, {SoakChatStream, 2}, {SoakChatN, 1},
	{SoakDrop, 1}, {SoakJSONSchema, 2}, {SoakToolCall, 2}, {SoakMalformed, 1}, {SoakOverContext, 1},
}

// SoakStormKinds are the kinds "storm" names, with their weights.
var SoakStormKinds = []struct {
	Kind   SoakKind
	Weight int
}{{SoakMaxBody, 1}, {SoakMaxN, 1}}

// ParseSoakKinds reads a comma-separated list of kinds; "" or "all" is every kind of
// the default mix, "storm" the storm kinds.
func ParseSoakKinds(s string) ([]SoakKind, error) {
	var out []SoakKind
	for _, part := range strings.Split(s, ",") {
		switch k := SoakKind(strings.TrimSpace(part)); {
		case k == "" || k == "all":
			for _, w := range SoakKinds {
				out = append(out, w.Kind)
			}
		case k == "storm":
			for _, w := range SoakStormKinds {
				out = append(out, w.Kind)
			}
		case soakWeight(k) == 0:
			return nil, fmt.Errorf("unknown soak kind %q", k)
		default:
			out = append(out, k)
		}
	}
	return out, nil
}

func soakWeight(k SoakKind) int {
	for _, list := range [][]struct {
		Kind   SoakKind
		Weight int
	}{SoakKinds, SoakStormKinds} {
		for _, w := range list {
			if w.Kind == k {
				return w.Weight
			}
		}
	}
	return 0
}

// Outcomes a reply can have that are expected.
const (
	outcomeOK        = "ok"        // finished (stop, tool_calls) and checked
	outcomeTruncated = "truncated" // finish_reason length: cut at max_tokens, nothing to validate
	outcomeDropped   = "dropped"   // the client hung up on purpose
	outcomeRejected  = "rejected"  // the 400 a malformed or over-context request must get
)

// soakResult is the verdict on one request.
type soakResult struct {
	kind     SoakKind
	outcome  string // an expected outcome, or a short class of problem when unexpected
	problem  string // set when the outcome is unexpected: what was wrong
	latency  time.Duration
	timeable bool // latency counts toward the window's percentiles (generation that ran to its end)
}

func (r soakResult) unexpected() bool { return r.problem != "" }

func fail(kind SoakKind, class, format string, args ...any) soakResult {
	return soakResult{kind: kind, outcome: class, problem: fmt.Sprintf(format, args...)}
}

var soakPrompts = []string{
	"Once upon a time", "The capital of France is", "Write a haiku about the sea.",
	"List three prime numbers.", "Explain what a KV cache is in one sentence.",
	"What is the weather like in Paris in spring?", "Translate 'good morning' to German.",
	"def fibonacci(n):", "The quick brown fox", "Give me a name for a cat.",
}

// soakSchema is the json_schema kind's response format: short, bounded fields.
const soakSchema = `{"type":"object","properties":{"city":{"type":"string","maxLength":12},
"population":{"type":"integer","minimum":0,"maximum":100000000},"capital":{"type":"boolean"}},
"required":["city","population","capital"],"additionalProperties":false}`

// soakTools are the tool_call kind's tools, by name.
var soakTools = map[string]string{
	"weather": `{"type":"object","properties":{"city":{"type":"string","maxLength":9},"unit":{"enum":["C","F"]},
"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"]}`,
	"search": `{"type":"object","properties":{"q":{"type":"string","maxLength":9}},"required":["q"]}`,
}

// compileSchema compiles one JSON Schema document with an independent validator.
func compileSchema(schema string) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("s.json", doc); err != nil {
		return nil, err
	}
	return c.Compile("s.json")
}

// validateJSON checks text against v.
func validateJSON(v *jsonschema.Schema, text string) error {
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return err
	}
	return v.Validate(inst)
}

// soakClient sends the soak's requests and judges the replies.
type soakClient struct {
	target      Target
	hc          *http.Client
	maxTokens   int
	maxModelLen int
	schema      *jsonschema.Schema
	tools       map[string]*jsonschema.Schema
	toolsJSON   []any
}

func newSoakClient(t Target, hc *http.Client, maxTokens, maxModelLen int) (*soakClient, error) {
	c := &soakClient{target: t, hc: hc, maxTokens: maxTokens, maxModelLen: maxModelLen, tools: map[string]*jsonschema.Schema{}}
	var err error
	if c.schema, err = compileSchema(soakSchema); err != nil {
		return nil, err
	}
	for _, name := range []string{"weather", "search"} {
		if c.tools[name], err = compileSchema(soakTools[name]); err != nil {
			return nil, err
		}
		c.toolsJSON = append(c.toolsJSON, map[string]any{"type": "function", "function": map[string]any{
			"name": name, "parameters": json.RawMessage(soakTools[name])}})
	}
	return c, nil
}

func (c *soakClient) url(path string) string {
	return strings.TrimSuffix(strings.TrimRight(c.target.BaseURL, "/"), "/v1") + path
}

// do runs one request of kind k, drawn from rng.
func (c *soakClient) do(ctx context.Context, k SoakKind, rng *rand.Rand) soakResult {
	prompt := soakPrompts[rng.IntN(len(soakPrompts))]
	temps := []float64{0, 0.7, 1}
	body := map[string]any{"model": c.target.Model, "max_tokens": 1 + rng.IntN(c.maxTokens),
		"temperature": temps[rng.IntN(len(temps))], "seed": rng.IntN(1 << 20)}
	chat := func() {
		body["messages"] = []any{map[string]any{"role": "user", "content": prompt}}
	}
	path, stream, n := "/v1/chat/completions", false, 1
	switch k {
	case SoakCompletion, SoakCompletionStream:
		path, stream = "/v1/completions", k == SoakCompletionStream
		body["prompt"] = prompt
		if stream && rng.IntN(2) == 0 {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
	case SoakChat, SoakChatStream:
		chat()
		stream = k == SoakChatStream
		if stream && rng.IntN(2) == 0 {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
	case SoakChatN:
		chat()
		n, stream = 2+rng.IntN(2), rng.IntN(2) == 0
		body["n"] = n
	case SoakDrop:
		chat()
		stream = true
		body["max_tokens"] = c.maxTokens
		body["ignore_eos"] = true
	case SoakJSONSchema:
		chat()
		stream = rng.IntN(2) == 0
		body["max_tokens"] = c.maxTokens
		body["response_format"] = map[string]any{"type": "json_schema",
			"json_schema": map[string]any{"name": "city", "strict": true, "schema": json.RawMessage(soakSchema)}}
	case SoakToolCall:
		chat()
		stream = rng.IntN(2) == 0
		body["max_tokens"] = c.maxTokens
		body["tools"], body["tool_choice"], body["parallel_tool_calls"] = c.toolsJSON, "required", false
	case SoakMalformed:
		return c.malformed(ctx, rng)
	case SoakOverContext:
		return c.overContext(ctx, rng)
	case SoakMaxBody:
		return c.maxBody(ctx, rng)
	case SoakMaxN:
		// Token ids, so that the prompt fills the context exactly whatever the tokenizer:
		// two prompts streamed with n, or one with best_of as well.
		maxTok := min(c.maxTokens, 16)
		ids := make([]int32, max(1, c.maxModelLen-maxTok))
		for i := range ids {
			ids[i] = int32(10 + rng.IntN(90))
		}
		path, n = "/v1/completions", soakMaxN
		body["max_tokens"], body["temperature"], body["n"] = maxTok, 1.0, soakMaxN
		if rng.IntN(2) == 0 {
			body["prompt"], stream = [][]int32{ids, ids}, true
			n *= 2
		} else {
			body["prompt"], body["best_of"] = ids, soakMaxN
		}
	default:
		return fail(k, "bad_kind", "unknown kind %q", k)
	}
	if stream {
		body["stream"] = true
	}
	start := time.Now()
	resp, err := c.post(ctx, path, body)
	if err != nil {
		return fail(k, "transport", "%v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		class := "status"
		if resp.StatusCode >= 500 {
			class = "5xx"
		}
		return fail(k, class, "HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	var choices []soakChoice
	var r soakResult
	if stream {
		dropAfter := 0
		if k == SoakDrop {
			dropAfter = 1 + rng.IntN(4)
		}
		var dropped bool
		choices, dropped, r = readSoakStream(k, resp.Body, dropAfter)
		if r.unexpected() {
			return r
		}
		if dropped {
			return soakResult{kind: k, outcome: outcomeDropped}
		}
	} else {
		choices, r = readSoakJSON(k, resp.Body, path == "/v1/completions")
		if r.unexpected() {
			return r
		}
	}
	r = c.judge(k, choices, n)
	r.latency, r.timeable = time.Since(start), !r.unexpected()
	return r
}

func (c *soakClient) post(ctx context.Context, path string, body any) (*http.Response, error) {
	raw, ok := body.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url(path), bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.target.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.target.APIKey)
	}
	return c.hc.Do(req)
}

// soakChoice is one choice's reply, assembled from a JSON body or from stream deltas.
type soakChoice struct {
	finish string
	text   string
	calls  []soakCall
}

type soakCall struct{ name, args string }

// judge checks the finished choices of a reply of kind k that asked for n choices.
func (c *soakClient) judge(k SoakKind, choices []soakChoice, n int) soakResult {
	if len(choices) != n {
		return fail(k, "choices", "%d choices, want %d", len(choices), n)
	}
	outcome := outcomeOK
	for i, ch := range choices {
		switch {
		case ch.finish == "length":
			outcome = outcomeTruncated
			continue
		case ch.finish == "":
			return fail(k, "no_finish", "choice %d has no finish_reason", i)
		}
		switch k {
		case SoakJSONSchema:
			if ch.finish != "stop" {
				return fail(k, "finish", "choice %d: finish_reason %q", i, ch.finish)
			}
			if err := validateJSON(c.schema, ch.text); err != nil {
				return fail(k, "schema", "choice %d: reply %.200q does not validate: %v", i, ch.text, err)
			}
		case SoakToolCall:
			if ch.finish != "tool_calls" || len(ch.calls) == 0 {
				return fail(k, "tool_calls", "choice %d: finish_reason %q with %d calls, content %.200q", i, ch.finish, len(ch.calls), ch.text)
			}
			for _, call := range ch.calls {
				v, ok := c.tools[call.name]
				if !ok {
					return fail(k, "tool_calls", "choice %d: call to unknown tool %q", i, call.name)
				}
				if err := validateJSON(v, call.args); err != nil {
					return fail(k, "tool_args", "choice %d: %s(%.200s) does not validate: %v", i, call.name, call.args, err)
				}
			}
		default:
			if ch.finish != "stop" {
				return fail(k, "finish", "choice %d: finish_reason %q", i, ch.finish)
			}
		}
	}
	return soakResult{kind: k, outcome: outcome}
}

// wireChoice covers a completion choice, a chat choice and a chat chunk's choice.
type wireChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	FinishReason *string `json:"finish_reason"`
	Message      *struct {
		Content   *string        `json:"content"`
		ToolCalls []wireToolCall `json:"tool_calls"`
	} `json:"message"`
	Delta *struct {
		Content   *string        `json:"content"`
		ToolCalls []wireToolCall `json:"tool_calls"`
	} `json:"delta"`
}

type wireToolCall struct {
	Index    int `json:"index"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type wireReply struct {
	Choices []wireChoice    `json:"choices"`
	Error   json.RawMessage `json:"error"`
}

func readSoakJSON(k SoakKind, body io.Reader, completion bool) ([]soakChoice, soakResult) {
	var rep wireReply
	if err := json.NewDecoder(body).Decode(&rep); err != nil {
		return nil, fail(k, "body", "decoding the reply: %v", err)
	}
	if rep.Error != nil {
		return nil, fail(k, "error", "200 with an error: %s", rep.Error)
	}
	out := make([]soakChoice, len(rep.Choices))
	for _, wc := range rep.Choices {
		if wc.Index < 0 || wc.Index >= len(out) {
			return nil, fail(k, "choices", "choice index %d of %d", wc.Index, len(out))
		}
		ch := &out[wc.Index]
		if wc.FinishReason != nil {
			ch.finish = *wc.FinishReason
		}
		if completion {
			ch.text = wc.Text
			continue
		}
		if wc.Message == nil {
			return nil, fail(k, "body", "chat choice %d has no message", wc.Index)
		}
		if wc.Message.Content != nil {
			ch.text = *wc.Message.Content
		}
		for _, tc := range wc.Message.ToolCalls {
			ch.calls = append(ch.calls, soakCall{name: tc.Function.Name, args: tc.Function.Arguments})
		}
	}
	return out, soakResult{}
}

// readSoakStream reads an SSE reply to its end. A stream is whole when every choice got a
// finish_reason and [DONE] came last; an "error" key in any chunk is an in-band error.
// With dropAfter > 0 the client hangs up after that many chunks (dropped reports it did).
func readSoakStream(k SoakKind, body io.Reader, dropAfter int) (choices []soakChoice, dropped bool, r soakResult) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), maxEventBytes)
	byIndex := map[int]*soakChoice{}
	chunks, done := 0, false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data:") {
			continue // blank separators, ": keep-alive" comments
		}
		data := strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		if done {
			return nil, false, fail(k, "after_done", "data after [DONE]: %.200s", data)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(data), &raw); err != nil {
			return nil, false, fail(k, "body", "chunk is not JSON: %.200s", data)
		}
		if e, ok := raw["error"]; ok {
			return nil, false, fail(k, "error", "in-band error: %s", e)
		}
		var chunk wireReply
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return nil, false, fail(k, "body", "chunk: %v", err)
		}
		for _, wc := range chunk.Choices {
			ch := byIndex[wc.Index]
			if ch == nil {
				ch = &soakChoice{}
				byIndex[wc.Index] = ch
			}
			if ch.finish != "" {
				return nil, false, fail(k, "after_finish", "choice %d: chunk after its finish_reason", wc.Index)
			}
			ch.text += wc.Text
			if d := wc.Delta; d != nil {
				if d.Content != nil {
					ch.text += *d.Content
				}
				for _, tc := range d.ToolCalls {
					for len(ch.calls) <= tc.Index {
						ch.calls = append(ch.calls, soakCall{})
					}
					ch.calls[tc.Index].name += tc.Function.Name
					ch.calls[tc.Index].args += tc.Function.Arguments
				}
			}
			if wc.FinishReason != nil {
				ch.finish = *wc.FinishReason
			}
		}
		chunks++
		if dropAfter > 0 && chunks >= dropAfter {
			return nil, true, soakResult{}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, false, fail(k, "cut_stream", "reading the stream after %d chunks: %v", chunks, err)
	}
	if !done {
		return nil, false, fail(k, "cut_stream", "stream ended after %d chunks without [DONE]", chunks)
	}
	choices = make([]soakChoice, len(byIndex))
	for i, ch := range byIndex {
		if i < 0 || i >= len(choices) {
			return nil, false, fail(k, "choices", "choice index %d of %d", i, len(byIndex))
		}
		choices[i] = *ch
	}
	return choices, false, soakResult{}
}

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
