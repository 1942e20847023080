package bench

import (
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
