package api

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/conveyor-llm/conveyor/models/convert"
)

var e2eToolParams = map[string]string{
	"weather": `{"type":"object","properties":{"city":{"type":"string","maxLength":9},"unit":{"enum":["C","F"]},
		"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"]}`,
	"search": `{"type":"object","properties":{"q":{"type":"string","maxLength":9},"f":{"type":"object",
		"properties":{"year":{"type":"integer","minimum":1900,"maximum":2030}}}},"required":["q"]}`,
}

func e2eTools(t *testing.T) []openai.ChatCompletionToolUnionParam {
	var tools []openai.ChatCompletionToolUnionParam
	for _, name := range []string{"weather", "search"} {
		var params map[string]any
		if err := json.Unmarshal([]byte(e2eToolParams[name]), &params); err != nil {
			t.Fatal(err)
		}
		tools = append(tools, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: name,
			Parameters: params}))
	}
	return tools
}

// checkCall requires a call to name a listed tool (want, when set) with arguments that
// validate against its parameters (an independent JSON Schema validator).
func checkCall(t *testing.T, validators map[string]*jsonschema.Schema, name, args, want string) {
	t.Helper()
	v, ok := validators[name]
	if !ok || (want != "" && name != want) {
		t.Fatalf("call to %q (want %q)", name, want)
	}
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(args))
	if err == nil {
		err = v.Validate(inst)
	}
	if err != nil {
		t.Fatalf("call %s(%s) does not validate: %v", name, args, err)
	}
}

// TestE2EToolCalls asks the real server, through the official SDK, for tool calls with
// tool_choice required and naming a tool, at temperature 1, n=2, streamed and not:
// every choice not cut at max_tokens ends with tool_calls whose arguments validate, and
// in each request, plain and streamed, at least one choice does; then the call and its
// result go back in the history and the server answers. It runs on the tiny random
// test model and on the trained default model.
func TestE2EToolCalls(t *testing.T) {
	t.Run("tiny", func(t *testing.T) { testToolCalls(t, startE2E(t, nil, nil)) })
	t.Run("default", func(t *testing.T) {
		tinyModel(t) // initialises ONNX Runtime
		dir := t.TempDir()
		if _, err := convert.BuildFromHF(filepath.Join("..", "models", "default"), dir, convert.Options{}); err != nil {
			t.Fatal(err)
		}
		testToolCalls(t, startE2EModel(t, dir, nil, nil))
	})
}

func testToolCalls(t *testing.T, e *e2e) {
	ctx := context.Background()
	validators := map[string]*jsonschema.Schema{}
	for name, s := range e2eToolParams {
		validators[name] = e2eValidator(t, s)
	}
	// One call per reply: the tiny random model seldom ends a list of parallel calls
	// within the room its 512-token context leaves.
	base := openai.ChatCompletionNewParams{Model: e2eModel, Tools: e2eTools(t), N: openai.Int(2), Seed: openai.Int(3),
		ParallelToolCalls: openai.Bool(false),
		Temperature:       openai.Float(1), MaxCompletionTokens: openai.Int(200),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris this week?")}}
	choices := map[string]openai.ChatCompletionToolChoiceOptionUnionParam{
		"required": {OfAuto: openai.String("required")},
		"search": {OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{
			Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "search"}}},
	}
	var first *openai.ChatCompletion
	for label, choice := range choices {
		want := ""
		if label == "search" {
			want = "search"
		}
		p := base
		p.ToolChoice = choice
		r, err := e.client.Chat.Completions.New(ctx, p)
		if err != nil {
			var apiErr *openai.Error
			if errors.As(err, &apiErr) {
				t.Fatalf("%s: %v: %s", label, err, apiErr.RawJSON())
			}
			t.Fatalf("%s: %v", label, err)
		}
		called := 0 // choices that ended with their calls, not cut at max_tokens
		for _, c := range r.Choices {
			if c.FinishReason == "length" {
				t.Logf("%s: choice %d cut at length after %d prompt tokens: %q", label, c.Index, r.Usage.PromptTokens, c.Message.Content)
				continue // cut short, as OpenAI documents
			}
			called++
			if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) == 0 || c.Message.Content != "" {
				t.Fatalf("%s: choice %d: finish %q, %d calls, content %q", label, c.Index, c.FinishReason, len(c.Message.ToolCalls), c.Message.Content)
			}
			for _, call := range c.Message.ToolCalls {
				if !strings.HasPrefix(call.ID, "call_") || call.Type != "function" {
					t.Fatalf("%s: call %+v", label, call)
				}
				checkCall(t, validators, call.Function.Name, call.Function.Arguments, want)
			}
			if first == nil {
				first = r
			}
		}
		if called == 0 {
			t.Fatalf("%s: no choice finished with tool_calls; all %d were cut at max_tokens", label, len(r.Choices))
		}

		st := e.client.Chat.Completions.NewStreaming(ctx, p)
		type acc struct{ name, args, id string }
		calls := map[int64]map[int64]*acc{}
		finish := map[int64]string{}
		content := map[int64]string{}
		for st.Next() {
			for _, c := range st.Current().Choices {
				if c.FinishReason != "" {
					finish[c.Index] = c.FinishReason
				}
				content[c.Index] += c.Delta.Content
				for _, d := range c.Delta.ToolCalls {
					if calls[c.Index] == nil {
						calls[c.Index] = map[int64]*acc{}
					}
					a := calls[c.Index][d.Index]
					if a == nil {
						a = &acc{}
						calls[c.Index][d.Index] = a
						if d.ID == "" || d.Function.Name == "" {
							t.Fatalf("%s streamed: a call's first delta lacks its id or name: %+v", label, d)
						}
					}
					a.id += d.ID
					a.name += d.Function.Name
					a.args += d.Function.Arguments
				}
			}
		}
		if err := st.Err(); err != nil {
			t.Fatalf("%s streamed: %v", label, err)
		}
		if len(finish) != len(r.Choices) {
			t.Fatalf("%s streamed: finish reasons for %d of %d choices: %v", label, len(finish), len(r.Choices), finish)
		}
		streamedCalled := 0
		for idx, f := range finish {
			if f == "length" {
				continue
			}
			streamedCalled++
			if f != "tool_calls" || len(calls[idx]) == 0 || content[idx] != "" {
				t.Fatalf("%s streamed: choice %d finish %q with %d calls and content %q", label, idx, f, len(calls[idx]), content[idx])
			}
			for _, a := range calls[idx] {
				checkCall(t, validators, a.name, a.args, want)
			}
		}
		t.Logf("%s: %d of %d choices ended with tool_calls, %d of %d streamed", label, called, len(r.Choices), streamedCalled, len(finish))
		if streamedCalled == 0 {
			t.Fatalf("%s streamed: no choice finished with tool_calls (finish reasons %v)", label, finish)
		}
	}
	if first == nil {
		t.Fatal("no choice finished with tool calls")
	}

	// The round trip: the call and its result in the history, tool_choice auto.
	msg := first.Choices[0].Message
	call := msg.ToolCalls[0]
	p := base
	p.N = openai.Int(1)
	p.Messages = append(p.Messages, msg.ToParam(), openai.ToolMessage(`{"temperature": 21}`, call.ID))
	r, err := e.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatalf("round trip: %v", err)
	}
	if len(r.Choices) != 1 || r.Usage.PromptTokens <= first.Usage.PromptTokens {
		t.Fatalf("round trip: %d choices, prompt %d tokens (first %d)", len(r.Choices), r.Usage.PromptTokens, first.Usage.PromptTokens)
	}
	for _, c := range r.Choices[0].Message.ToolCalls {
		checkCall(t, validators, c.Function.Name, c.Function.Arguments, "")
	}
}

// TestE2EToolChoiceAutoStreams checks tool_choice auto while streaming: a prose reply
// streams as content deltas as it comes (not all at the end) and equals the reply the
// same request gets unstreamed. The random model's greedy reply to a prompt is prose or
// a call by chance, so prompts are tried in order until one gets prose; if none of them
// does, the test fails.
func TestE2EToolChoiceAutoStreams(t *testing.T) {
	e := startE2E(t, nil, nil)
	ctx := context.Background()
	p := openai.ChatCompletionNewParams{Model: e2eModel, Tools: e2eTools(t), Seed: openai.Int(9), Temperature: openai.Float(0),
		MaxCompletionTokens: openai.Int(24), ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")}}
	prompts := []string{"Tell me a story.", "Tell me a story about a cat.", "Write a poem.", "Say hello.",
		"Describe the sea.", "What did you do today?", "Tell me a joke.", "Once upon a time"}
	want := ""
	for _, prompt := range prompts {
		p.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}
		r, err := e.client.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		msg := r.Choices[0].Message
		if text := strings.TrimSpace(msg.Content); len(msg.ToolCalls) == 0 && r.Usage.CompletionTokens >= 3 &&
			text != "" && !strings.HasPrefix(text, "{") {
			want = msg.Content
			t.Logf("prompt %q: a prose reply of %d tokens: %q", prompt, r.Usage.CompletionTokens, want)
			break
		}
		t.Logf("prompt %q: the greedy reply is not prose: %d calls, content %q", prompt, len(msg.ToolCalls), msg.Content)
	}
	if want == "" {
		t.Fatalf("none of the %d prompts gets a prose reply, so prose streaming is not tested", len(prompts))
	}
	st := e.client.Chat.Completions.NewStreaming(ctx, p)
	var got strings.Builder
	deltas := 0
	for st.Next() {
		for _, c := range st.Current().Choices {
			if c.Delta.Content != "" {
				deltas++
				got.WriteString(c.Delta.Content)
			}
			if len(c.Delta.ToolCalls) > 0 {
				t.Fatalf("tool call deltas in a prose reply: %+v", c.Delta.ToolCalls)
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if got.String() != want || deltas < 3 {
		t.Fatalf("streamed %q in %d deltas, want %q in several", got.String(), deltas, want)
	}
}

// threeTools are tools of the size real requests carry: a description each and two or
// three parameters with their own descriptions. Strings are bounded: the default model
// learnt prose, not JSON, and left alone it never ends a string.
var threeTools = map[string]string{
	"get_weather": `{"type":"object","properties":{"city":{"type":"string","maxLength":20,"description":"City name, e.g. Paris"},
		"unit":{"type":"string","enum":["celsius","fahrenheit"],"description":"Temperature unit"}},"required":["city"]}`,
	"search_web": `{"type":"object","properties":{"query":{"type":"string","maxLength":40,"description":"What to search for"},
		"max_results":{"type":"integer","minimum":1,"maximum":10,"description":"How many results to return"}},"required":["query"]}`,
	"convert_currency": `{"type":"object","properties":{"amount":{"type":"number","description":"Amount to convert"},
		"from":{"type":"string","minLength":3,"maxLength":3,"description":"ISO 4217 code of the source currency"},
		"to":{"type":"string","minLength":3,"maxLength":3,"description":"ISO 4217 code of the target currency"}},"required":["amount","from","to"]}`,
}

var threeToolDescriptions = map[string]string{
	"get_weather":      "Get the current weather in a given city.",
	"search_web":       "Search the web and return the top results with their titles and links.",
	"convert_currency": "Convert an amount of money from one currency to another at today's rate.",
}

// TestE2EDefaultModelThreeTools: the default model (512-token context, generic format)
// answers a request offering three tools with tool_choice required and max_tokens 200
// with a complete call, plain and streamed: the tools' description leaves the call room.
func TestE2EDefaultModelThreeTools(t *testing.T) {
	tinyModel(t) // initialises ONNX Runtime
	dir := t.TempDir()
	if _, err := convert.BuildFromHF(filepath.Join("..", "models", "default"), dir, convert.Options{}); err != nil {
		t.Fatal(err)
	}
	e := startE2EModel(t, dir, nil, nil)
	validators := map[string]*jsonschema.Schema{}
	var tools []openai.ChatCompletionToolUnionParam
	for _, name := range []string{"get_weather", "search_web", "convert_currency"} {
		validators[name] = e2eValidator(t, threeTools[name])
		var params map[string]any
		if err := json.Unmarshal([]byte(threeTools[name]), &params); err != nil {
			t.Fatal(err)
		}
		tools = append(tools, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: name,
			Description: openai.String(threeToolDescriptions[name]), Parameters: params}))
	}
	p := openai.ChatCompletionNewParams{Model: e2eModel, Tools: tools, N: openai.Int(3), Seed: openai.Int(7),
		ToolChoice:  openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")},
		Temperature: openai.Float(0.7), MaxTokens: openai.Int(200),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("How much is 20 euros in dollars?")}}
	r, err := e.client.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("three tools: %d prompt tokens", r.Usage.PromptTokens)
	for _, c := range r.Choices {
		if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) == 0 {
			t.Fatalf("choice %d: finish %q with %d calls after %d prompt tokens; want a complete call: %q",
				c.Index, c.FinishReason, len(c.Message.ToolCalls), r.Usage.PromptTokens, c.Message.Content)
		}
		for _, call := range c.Message.ToolCalls {
			checkCall(t, validators, call.Function.Name, call.Function.Arguments, "")
		}
	}
	checkStreamedCalls(t, e.client, p, 3, validators, "streamed")
}

// checkStreamedCalls streams p and requires each of its n choices to end with
// finish_reason tool_calls and a first call that validates, assembled from its deltas.
func checkStreamedCalls(t *testing.T, client openai.Client, p openai.ChatCompletionNewParams, n int,
	validators map[string]*jsonschema.Schema, label string) {
	t.Helper()
	st := client.Chat.Completions.NewStreaming(context.Background(), p)
	finish := map[int64]string{}
	names, args := map[int64]string{}, map[int64]string{}
	for st.Next() {
		for _, c := range st.Current().Choices {
			if c.FinishReason != "" {
				finish[c.Index] = c.FinishReason
			}
			for _, d := range c.Delta.ToolCalls {
				if d.Index == 0 {
					names[c.Index] += d.Function.Name
					args[c.Index] += d.Function.Arguments
				}
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("%s: %v", label, err)
	}
	for i := range int64(n) {
		if finish[i] != "tool_calls" {
			t.Fatalf("%s: choice %d finished %q, want tool_calls", label, i, finish[i])
		}
		checkCall(t, validators, names[i], args[i], "")
	}
}
