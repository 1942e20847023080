package api

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
	"github.com/santhosh-tekuri/jsonschema/v6"

	apiresponses "github.com/conveyor-llm/conveyor/api/responses"
	"github.com/conveyor-llm/conveyor/api/respstore"
)

// startResponsesE2E is startE2E with a response store in a temporary directory.
func startResponsesE2E(t *testing.T) *e2e {
	t.Helper()
	st, err := respstore.Open(respstore.DefaultConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	e := startE2E(t, func(c *Config) { c.Responses = apiresponses.Config{Store: st} }, nil)
	t.Cleanup(func() { st.Close() }) // runs after the server's cleanup
	return e
}

func e2eResponseTools(t *testing.T) []responses.ToolUnionParam {
	var tools []responses.ToolUnionParam
	for _, name := range []string{"weather", "search"} {
		var params map[string]any
		if err := json.Unmarshal([]byte(e2eToolParams[name]), &params); err != nil {
			t.Fatal(err)
		}
		tools = append(tools, responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{Name: name, Parameters: params}})
	}
	return tools
}

func inputText(s string) responses.ResponseNewParamsInputUnion {
	return responses.ResponseNewParamsInputUnion{OfString: openai.String(s)}
}

// TestE2EResponsesTextFormat asks the real model for JSON through text.format
// json_schema and json_object: the response completes with output that validates.
func TestE2EResponsesTextFormat(t *testing.T) {
	e := startResponsesE2E(t)
	ctx := context.Background()
	schema := map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"enum": []any{"x", "y"}}},
		"required": []any{"a"}, "additionalProperties": false}
	resp, err := e.client.Responses.New(ctx, responses.ResponseNewParams{Model: e2eModel, Input: inputText("Answer in JSON"),
		MaxOutputTokens: openai.Int(100), Store: openai.Bool(false),
		Text: responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigParamOfJSONSchema("answer", schema)}})
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ A string }
	if resp.Status != "completed" || json.Unmarshal([]byte(resp.OutputText()), &got) != nil || (got.A != "x" && got.A != "y") {
		t.Fatalf("json_schema: status %s, output %q", resp.Status, resp.OutputText())
	}
	if resp.Usage.InputTokens == 0 || resp.Usage.OutputTokens == 0 || resp.CompletedAt == 0 {
		t.Fatalf("usage %+v, completed_at %v", resp.Usage, resp.CompletedAt)
	}
	resp, err = e.client.Responses.New(ctx, responses.ResponseNewParams{Model: e2eModel, Input: inputText("JSON please"),
		MaxOutputTokens: openai.Int(200), Store: openai.Bool(false), Temperature: openai.Float(0),
		Text: responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigUnionParam{OfJSONObject: &openai.ResponseFormatJSONObjectParam{}}}})
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if resp.Status == "completed" && json.Unmarshal([]byte(resp.OutputText()), &obj) != nil {
		t.Fatalf("json_object: output %q", resp.OutputText())
	}
	// A bad text.format is named as such.
	_, err = e.client.Responses.New(ctx, responses.ResponseNewParams{Model: e2eModel, Input: inputText("x"), Store: openai.Bool(false),
		Text: responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigParamOfJSONSchema("bad name", schema)}})
	if e := apiError(t, err); e.StatusCode != 400 || e.Param != "text.format.name" {
		t.Fatalf("bad name: %v", err)
	}
}

// TestE2EResponsesToolRoundTrip asks for a function call (tool_choice required), checks
// it against the tool's schema, streams one with every function-call event, then sends
// the call's output back with previous_response_id and gets an answer.
func TestE2EResponsesToolRoundTrip(t *testing.T) {
	e := startResponsesE2E(t)
	ctx := context.Background()
	validators := map[string]*jsonschema.Schema{}
	for name, s := range e2eToolParams {
		validators[name] = e2eValidator(t, s)
	}
	p := responses.ResponseNewParams{Model: e2eModel, Input: inputText("What is the weather in Paris this week?"),
		Tools: e2eResponseTools(t), ParallelToolCalls: openai.Bool(false), Temperature: openai.Float(1),
		MaxOutputTokens: openai.Int(200), ToolChoice: responses.ResponseNewParamsToolChoiceUnion{
			OfToolChoiceMode: openai.Opt(responses.ToolChoiceOptionsRequired)}}
	var call responses.ResponseFunctionToolCall
	var first *responses.Response
	for seed := int64(1); seed <= 5 && first == nil; seed++ {
		resp, err := e.client.Responses.New(ctx, p, option.WithJSONSet("seed", seed))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status == "incomplete" {
			continue // cut at max_output_tokens: try another seed
		}
		if resp.Status != "completed" || len(resp.Output) != 1 || resp.Output[0].Type != "function_call" {
			t.Fatalf("status %s, output %s", resp.Status, resp.RawJSON())
		}
		call = resp.Output[0].AsFunctionCall()
		if !strings.HasPrefix(call.ID, "fc_") || !strings.HasPrefix(call.CallID, "call_") {
			t.Fatalf("call ids %+v", call)
		}
		checkCall(t, validators, call.Name, call.Arguments, "")
		first = resp
	}
	if first == nil {
		t.Fatal("no seed gave a call within max_output_tokens")
	}

	// Streamed: the call's item, its argument deltas and done events agree with the final response.
	named := p
	named.ToolChoice = responses.ResponseNewParamsToolChoiceUnion{OfFunctionTool: &responses.ToolChoiceFunctionParam{Name: "search"}}
	named.Store = openai.Bool(false)
	seen := map[string]int{}
	deltas, doneArgs, final, types := readResponseStream(t, e.client.Responses.NewStreaming(ctx, named, option.WithJSONSet("seed", 2)),
		"response.function_call_arguments")
	for _, typ := range types {
		seen[typ]++
	}
	if final.Status == "completed" {
		for _, typ := range []string{"response.created", "response.in_progress", "response.output_item.added",
			"response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done", "response.completed"} {
			if seen[typ] == 0 {
				t.Fatalf("no %s event: %v", typ, seen)
			}
		}
		fc := final.Output[0].AsFunctionCall()
		if deltas != doneArgs || doneArgs != fc.Arguments {
			t.Fatalf("streamed arguments %q, done %q, final %q", deltas, doneArgs, fc.Arguments)
		}
		checkCall(t, validators, fc.Name, fc.Arguments, "search")
	} else {
		t.Logf("streamed call cut at max_output_tokens: %v", seen)
	}

	// The call's output goes back; the stored conversation continues.
	out := responses.ResponseInputItemParamOfFunctionCallOutput("sunny, 21 C")
	out.OfFunctionCallOutput.CallID = openai.String(call.CallID)
	resp, err := e.client.Responses.New(ctx, responses.ResponseNewParams{Model: e2eModel, PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{out}},
		Tools: e2eResponseTools(t), MaxOutputTokens: openai.Int(8),
		ToolChoice: responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: openai.Opt(responses.ToolChoiceOptionsNone)}})
	if err != nil {
		t.Fatal(err)
	}
	// The same output as a lone message, without the conversation, is a shorter prompt.
	alone, err := e.client.Responses.New(ctx, responses.ResponseNewParams{Model: e2eModel, Input: inputText("sunny, 21 C"),
		Tools: e2eResponseTools(t), MaxOutputTokens: openai.Int(1), Store: openai.Bool(false),
		ToolChoice: responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: openai.Opt(responses.ToolChoiceOptionsNone)}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != "completed" && resp.Status != "incomplete" || resp.PreviousResponseID != first.ID ||
		resp.Usage.InputTokens <= alone.Usage.InputTokens+10 {
		t.Fatalf("answer after the call (%d input tokens alone): %s", alone.Usage.InputTokens, resp.RawJSON())
	}
	items, err := e.client.Responses.InputItems.List(ctx, resp.ID, responses.InputItemListParams{})
	if err != nil || len(items.Data) != 1 || items.Data[0].Type != "function_call_output" || items.Data[0].CallID != call.CallID {
		t.Fatalf("input items: %v %+v", err, items)
	}
}

// TestE2EResponsesStreamText streams a plain answer from the real model and checks the
// text events against the final response.
func TestE2EResponsesStreamText(t *testing.T) {
	e := startResponsesE2E(t)
	deltas, done, final, types := readResponseStream(t, e.client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{Model: e2eModel,
		Input: inputText("Tell me a story"), MaxOutputTokens: openai.Int(12), Store: openai.Bool(false)}), "response.output_text")
	if deltas == "" || deltas != done || final.OutputText() != done || final.Usage.OutputTokens == 0 {
		t.Fatalf("deltas %q, done %q, final %q (events %v)", deltas, done, final.OutputText(), types)
	}
	for _, typ := range []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.done", "response.content_part.done", "response.output_item.done"} {
		if !strings.Contains(strings.Join(types, " "), typ) {
			t.Fatalf("no %s in %v", typ, types)
		}
	}
}

// TestE2EResponsesBackgroundCancel cancels a long background response on the real engine.
func TestE2EResponsesBackgroundCancel(t *testing.T) {
	e := startResponsesE2E(t)
	ctx := context.Background()
	resp, err := e.client.Responses.New(ctx, responses.ResponseNewParams{Model: e2eModel, Input: inputText("go on"),
		Background: openai.Bool(true), MaxOutputTokens: openai.Int(400)}, option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.client.Responses.Cancel(ctx, resp.ID)
	if err != nil || got.Status != "cancelled" {
		t.Fatalf("cancel: %v %s", err, got.RawJSON())
	}
	waitFor(t, "the KV cache to be freed", func() bool { return kvIdle(e.eng.Stats()) })
}

// readResponseStream reads a Responses stream to its end: every event's type, the
// concatenated deltas of the events named prefix+".delta", the text or arguments of
// prefix+".done", and the final response (completed or incomplete).
func readResponseStream(t *testing.T, st *ssestream.Stream[responses.ResponseStreamEventUnion], prefix string) (deltas, done string, final responses.Response, types []string) {
	t.Helper()
	for st.Next() {
		ev := st.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case prefix + ".delta":
			deltas += ev.Delta
		case prefix + ".done":
			done = ev.Text + ev.Arguments // the one the event has
		case "response.completed", "response.incomplete":
			final = ev.Response
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	return deltas, done, final, types
}
