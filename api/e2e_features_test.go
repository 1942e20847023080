package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/scheduler"
)

// e2eSchema is the json_schema the structured-output tests ask for.
const e2eSchema = `{"type":"object","properties":{"city":{"type":"string","maxLength":16},
	"population":{"type":"integer","minimum":0,"maximum":100000000},"tags":{"type":"array","items":{"enum":["big","old","coastal"]},"maxItems":3},
	"capital":{"type":["boolean","null"]}},"required":["city","population"],"additionalProperties":false}`

func e2eValidator(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("s.json", doc); err != nil {
		t.Fatal(err)
	}
	v, err := c.Compile("s.json")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// validates checks that a finished reply is JSON satisfying v (any object when v is nil).
func validates(t *testing.T, what, text, finish string, v *jsonschema.Schema) {
	t.Helper()
	if finish != "stop" {
		return // "length" may cut a structured reply short, as OpenAI documents
	}
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%s: %q is not JSON: %v", what, text, err)
	}
	if v == nil {
		if _, ok := inst.(map[string]any); !ok {
			t.Fatalf("%s: %q is not a JSON object", what, text)
		}
		return
	}
	if err := v.Validate(inst); err != nil {
		t.Fatalf("%s: %q does not validate: %v", what, text, err)
	}
}

// TestE2EStructuredOutput asks the real server, through the official SDK, for
// json_object and json_schema replies at temperature 1, n=3, streamed and not, and
// through /v1/completions: every finished reply is JSON that validates (checked with an
// independent validator), a streamed reply equals its unstreamed twin, most chat replies
// finish and at least one completion does (a test where every reply stops at max_tokens
// validates nothing).
func TestE2EStructuredOutput(t *testing.T) {
	e := startE2E(t, nil, nil)
	ctx := context.Background()
	v := e2eValidator(t, e2eSchema)
	var schema map[string]any
	if err := json.Unmarshal([]byte(e2eSchema), &schema); err != nil {
		t.Fatal(err)
	}
	formats := map[string]openai.ChatCompletionNewParamsResponseFormatUnion{
		"json_object": {OfJSONObject: &shared.ResponseFormatJSONObjectParam{}},
		"json_schema": {OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{
			Name: "city", Schema: schema, Strict: openai.Bool(true)}}},
	}
	finished, total := 0, 0
	for name, rf := range formats {
		want := v
		if name == "json_object" {
			want = nil
		}
		p := openai.ChatCompletionNewParams{Model: e2eModel, ResponseFormat: rf, N: openai.Int(3), Seed: openai.Int(5),
			Temperature: openai.Float(1), MaxCompletionTokens: openai.Int(120),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Describe a city as JSON.")}}
		r, err := e.client.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, c := range r.Choices {
			validates(t, name, c.Message.Content, string(c.FinishReason), want)
			total++
			if c.FinishReason == "stop" {
				finished++
			}
		}
		st := e.client.Chat.Completions.NewStreaming(ctx, p)
		texts, finishes := map[int64]string{}, map[int64]string{}
		for st.Next() {
			for _, c := range st.Current().Choices {
				texts[c.Index] += c.Delta.Content
				if c.FinishReason != "" {
					finishes[c.Index] = c.FinishReason
				}
			}
		}
		if err := st.Err(); err != nil {
			t.Fatalf("%s streamed: %v", name, err)
		}
		if len(texts) != len(r.Choices) || len(finishes) != len(r.Choices) {
			t.Fatalf("%s streamed: %d texts and %d finish reasons for %d choices", name, len(texts), len(finishes), len(r.Choices))
		}
		for i, text := range texts {
			validates(t, name+" streamed", text, finishes[i], want)
			if text != r.Choices[i].Message.Content || finishes[i] != string(r.Choices[i].FinishReason) {
				t.Errorf("%s: streamed choice %d %q (%s) differs from %q (%s)", name, i, text, finishes[i],
					r.Choices[i].Message.Content, r.Choices[i].FinishReason)
			}
		}
	}
	if finished < total/2 {
		t.Errorf("only %d of %d constrained replies finished", finished, total)
	}

	// /v1/completions takes response_format too (the SDK's completion params do not have it).
	body := `{"model":"` + e2eModel + `","prompt":"JSON:","max_tokens":120,"temperature":1,"seed":3,"n":2,
		"response_format":{"type":"json_schema","json_schema":{"name":"city","strict":true,"schema":` + e2eSchema + `}}}`
	resp, err := http.Post(e.base+"/v1/completions", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || len(out.Choices) != 2 {
		t.Fatalf("completions: %d %v %+v", resp.StatusCode, err, out)
	}
	stopped := 0
	for i, c := range out.Choices {
		validates(t, "completions", c.Text, c.FinishReason, v)
		t.Logf("completions: choice %d finished %q: %q", i, c.FinishReason, c.Text)
		if c.FinishReason == "stop" {
			stopped++
		}
	}
	if stopped == 0 {
		t.Fatalf("completions: none of the %d replies finished with stop, so none was validated", len(out.Choices))
	}
}

// TestE2EUnsupportedFeaturesAreRefused: {"type":"text"} is served; a schema keyword
// the compiler does not implement, under strict, and a tool_choice naming a tool that is
// not in tools are refused with a 400 naming the parameter.
func TestE2EUnsupportedFeaturesAreRefused(t *testing.T) {
	e := startE2E(t, nil, nil)
	ctx := context.Background()
	base := openai.ChatCompletionNewParams{Model: e2eModel, MaxCompletionTokens: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")}}

	text := base
	text.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfText: &shared.ResponseFormatTextParam{}}
	text.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}
	if r, err := e.client.Chat.Completions.New(ctx, text); err != nil || len(r.Choices) != 1 {
		t.Fatalf("response_format text: %v", err)
	}

	for _, tc := range []struct {
		name, param, code, mention string
		mod                        func(*openai.ChatCompletionNewParams)
	}{
		{"pattern", "response_format.json_schema.schema", "unsupported_value", `"pattern"`, func(p *openai.ChatCompletionNewParams) {
			p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
				JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "x", Strict: openai.Bool(true),
					Schema: map[string]any{"type": "string", "pattern": "^[a-z]+$"}}}}
		}},
		{"named tool not in tools", "tool_choice", "invalid_value", "not in tools", func(p *openai.ChatCompletionNewParams) {
			p.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "lookup"})}
			p.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{
				Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "other"}}}
		}},
	} {
		p := base
		tc.mod(&p)
		_, err := e.client.Chat.Completions.New(ctx, p)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != tc.param || apiErr.Code != tc.code ||
			!strings.Contains(apiErr.Message, tc.mention) {
			t.Errorf("%s: want a 400 naming %s (%s) and mentioning %s, got %v", tc.name, tc.param, tc.code, tc.mention, err)
		}
	}
}

// TestE2ESpeculationServesTheSameText: served with prompt-lookup speculation, completions
// (greedy, and seeded at temperature 1) come back with the text, tokens and finish reason
// they have without it, plain and streamed through the official SDK, and the
// Prometheus counters show proposals verified; served with a draft model, the greedy
// ones do.
func TestE2ESpeculationServesTheSameText(t *testing.T) {
	prompts := []string{"the quick brown fox the quick brown fox the quick", "a lazy dog and a lazy dog and a", "far away into night"}
	collect := func(e *e2e) []string {
		var out []string
		for _, p := range prompts {
			for _, temp := range []float64{0, 1} {
				params := openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(e2eModel),
					Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(p)},
					MaxTokens: openai.Int(40), Temperature: openai.Float(temp), Seed: openai.Int(7)}
				r, err := e.client.Completions.New(context.Background(), params)
				if err != nil {
					t.Fatal(err)
				}
				st := e.client.Completions.NewStreaming(context.Background(), params)
				text := ""
				for st.Next() {
					for _, c := range st.Current().Choices {
						text += c.Text
					}
				}
				if err := st.Err(); err != nil {
					t.Fatal(err)
				}
				if text != r.Choices[0].Text {
					t.Fatalf("%q at %g: streamed %q, plain %q", p, temp, text, r.Choices[0].Text)
				}
				out = append(out, fmt.Sprintf("%s|%s|%d", r.Choices[0].Text, r.Choices[0].FinishReason, r.Usage.CompletionTokens))
			}
		}
		return out
	}
	plain := startE2E(t, nil, nil)
	want := collect(plain)
	spec := startE2E(t, nil, func(c *engine.Config) {
		c.Speculation = scheduler.Speculation{NumTokens: 4, LookupMin: 1, LookupMax: 4, MaxBatch: 4}
	})
	got := collect(spec)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("completion %d: %q with speculation, %q without", i, got[i], want[i])
		}
	}
	if st := spec.eng.Stats(); st.SpecDraftTokens == 0 || st.SpecAcceptedTokens == 0 {
		t.Fatalf("%d proposed, %d accepted; want both", st.SpecDraftTokens, st.SpecAcceptedTokens)
	}
	resp, err := http.Get(spec.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "conveyor_spec_decode_num_accepted_tokens_total") {
		t.Fatal("/metrics has no speculative decoding counters")
	}

	// With the model itself as a draft model: greedy completions are the same; seeded
	// sampled ones (drawn proposals, rejection sampling) come back the same plain and
	// streamed (collect checks it).
	draft, err := models.Open(tinyModel(t), models.RunnerOptions{ORTLib: ortLib(t), IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { draft.Close() })
	drafted := startE2E(t, nil, func(c *engine.Config) {
		c.Speculation = scheduler.Speculation{NumTokens: 4, External: true, MaxBatch: 4}
		c.DraftModel = draft
	})
	got = collect(drafted)
	for i := 0; i < len(want); i += 2 { // the greedy ones
		if got[i] != want[i] {
			t.Fatalf("completion %d: %q with a draft model, %q without", i, got[i], want[i])
		}
	}
	if st := drafted.eng.Stats(); st.SpecDraftTokens == 0 || st.SpecAcceptedTokens == 0 {
		t.Fatalf("draft model: %d proposed, %d accepted; want both", st.SpecDraftTokens, st.SpecAcceptedTokens)
	}
}
