package openai

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/conveyor-llm/conveyor/api/toolcall"
	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/engine/structured"
)

// weatherPlan offers one tool whose parameters carry a keyword decoding does not
// enforce (pattern), in the hermes format.
func weatherPlan(t *testing.T, choice string) *toolPlan {
	t.Helper()
	params := json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","pattern":"^[A-Z]"},"days":{"type":"integer","minimum":1}},"required":["city"]}`)
	v, err := compileParameters(params)
	if err != nil {
		t.Fatal(err)
	}
	p := &toolPlan{
		tools:  []toolcall.Tool{{Name: "get_weather", Parameters: params}},
		format: toolcall.Hermes,
		choice: choice,
		params: map[string]*jsonschema.Schema{"get_weather": v},
	}
	if choice == "named" {
		p.named = "get_weather"
	}
	return p
}

// reply is what a client reads of a chat answer's first choice: its content, its tool
// calls' arguments and its finish reason.
type reply struct {
	content string
	args    []string
	finish  string
}

// readReply reads o's answer: from chunks when it streamed, else from its body.
func readReply(o *chatOutput, stream bool, chunks []any) reply {
	var r reply
	if !stream {
		ch := o.Body(Usage{}).(chatResponse).Choices[0]
		if ch.Message.Content != nil {
			r.content = *ch.Message.Content
		}
		for _, tc := range ch.Message.ToolCalls {
			r.args = append(r.args, tc.Function.Arguments)
		}
		r.finish = *ch.FinishReason
		return r
	}
	var content strings.Builder
	for _, c := range chunks {
		ch := c.(chatResponse).Choices[0]
		if ch.Delta.Content != nil {
			content.WriteString(*ch.Delta.Content)
		}
		for _, tc := range ch.Delta.ToolCalls {
			if tc.ID != "" {
				r.args = append(r.args, "")
			}
			r.args[*tc.Index] += tc.Function.Arguments
		}
		if ch.FinishReason != nil {
			r.finish = *ch.FinishReason
		}
	}
	r.content = content.String()
	return r
}

// TestParsedCallsAreValidated: a reply's calls come back as tool_calls only when each
// names an offered tool and its arguments validate against the tool's full parameters
// schema; otherwise the reply is content with its own finish reason, and the rejection
// is counted once per reply — plain, streamed under auto, and streamed under required.
func TestParsedCallsAreValidated(t *testing.T) {
	call := func(body string) string { return "<tool_call>\n" + body + "\n</tool_call>" }
	cases := []struct {
		name, text, reject string
	}{
		{"valid", call(`{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}`), ""},
		{"unknown tool", call(`{"name": "launch_rocket", "arguments": {}}`), RejectUnknownTool},
		{"pattern fails", call(`{"name": "get_weather", "arguments": {"city": "paris"}}`), RejectInvalidArguments},
		{"minimum fails", call(`{"name": "get_weather", "arguments": {"city": "Paris", "days": 0}}`), RejectInvalidArguments},
		{"required missing", call(`{"name": "get_weather", "arguments": {"days": 3}}`), RejectInvalidArguments},
		{"second call invalid", call(`{"name": "get_weather", "arguments": {"city": "Oslo"}}`) + "\n" + call(`{"name": "get_weather", "arguments": {"city": 5}}`), RejectInvalidArguments},
	}
	for _, tc := range cases {
		for _, mode := range []struct {
			stream bool
			choice string
		}{{false, "auto"}, {true, "auto"}, {true, "required"}, {false, "named"}} {
			var rejected []string
			req := &ParsedChat{Generation: Generation{Stream: mode.stream, Params: engine.SamplingParams{N: 1, Logprobs: engine.NoLogprobs}}, tools: weatherPlan(t, mode.choice)}
			o := newChatOutput(req, nil, "", 0, "", func(r string) { rejected = append(rejected, r) })
			half := len(tc.text) / 2
			var out []any
			out = append(out, o.Add(0, &engine.Event{Text: tc.text[:half]})...)
			out = append(out, o.Add(0, &engine.Event{Text: tc.text[half:], FinishReason: engine.FinishStop})...)
			r := readReply(o, mode.stream, out)
			content, calls, finish := r.content, len(r.args), r.finish
			where := tc.name + " (" + mode.choice + map[bool]string{true: ", streamed)", false: ")"}[mode.stream]
			if tc.reject == "" {
				if calls == 0 || finish != "tool_calls" || len(rejected) != 0 {
					t.Errorf("%s: %d calls, finish %q, rejected %v; want the call with finish tool_calls", where, calls, finish, rejected)
				}
				continue
			}
			if calls != 0 || finish != "stop" || content != tc.text {
				t.Errorf("%s: %d calls, finish %q, content %q; want the reply as content with finish stop", where, calls, finish, content)
			}
			if len(rejected) != 1 || rejected[0] != tc.reject {
				t.Errorf("%s: rejections %v, want one %q", where, rejected, tc.reject)
			}
		}
	}
}

// TestCutCallIsNoCall: a reply cut short (finish length) inside its second call keeps
// finish_reason "length" and its first call; the cut call is neither a call nor content
// — plain and streamed, under auto and required, calls held or streamed as they come.
// Streamed as they come, the cut call's deltas that went out stay out, and the
// converter says so (cutSent, which the Responses API reads).
func TestCutCallIsNoCall(t *testing.T) {
	first := "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	cut := "\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci"
	for _, mode := range []struct {
		stream, streamArgs bool
		choice             string
	}{{false, false, "auto"}, {true, false, "auto"}, {true, true, "auto"}, {false, false, "required"},
		{true, false, "required"}, {true, true, "required"}} {
		prose := ""
		if mode.choice == "auto" {
			prose = "Let me check.\n"
		}
		text := prose + first + cut
		plan := weatherPlan(t, mode.choice)
		plan.streamArgs = mode.streamArgs
		req := &ParsedChat{Generation: Generation{Stream: mode.stream, Params: engine.SamplingParams{N: 1, Logprobs: engine.NoLogprobs}}, tools: plan}
		o := newChatOutput(req, nil, "", 0, "", nil)
		var out []any
		for i := 0; i < len(text); i += 7 {
			ev := &engine.Event{Text: text[i:min(i+7, len(text))]}
			if i+7 >= len(text) {
				ev.FinishReason = engine.FinishLength
			}
			out = append(out, o.Add(0, ev)...)
		}
		r := readReply(o, mode.stream, out)
		content, args, finish := r.content, r.args, r.finish
		where := fmt.Sprintf("%s (streamed %v, arguments streamed %v)", mode.choice, mode.stream, mode.streamArgs)
		sent := mode.stream && mode.streamArgs // the cut call's id, name and first arguments went out
		if want := 1 + map[bool]int{true: 1}[sent]; finish != "length" || len(args) != want || args[0] != `{"city":"Paris"}` {
			t.Errorf("%s: finish %q, calls' arguments %q; want length and the first call (and the cut one's deltas: %v)", where, finish, args, sent)
		}
		if got := strings.TrimSpace(content); got != strings.TrimSpace(prose) {
			t.Errorf("%s: content %q, want %q", where, got, strings.TrimSpace(prose))
		}
		if o.accs[0].cutSent != sent {
			t.Errorf("%s: cutSent %v, want %v", where, o.accs[0].cutSent, sent)
		}
	}
}

// TestToolSignature: the generic format describes each tool by one signature line,
// required parameters first, optional ones marked, types named briefly.
func TestToolSignature(t *testing.T) {
	for _, tc := range []struct{ params, want string }{
		{``, `()`},
		{`{"type":"object"}`, `()`},
		{`{"type":"object","properties":{"unit":{"enum":["c","f"]},"city":{"type":"string"}},"required":["city"]}`, `(city: string, unit?: "c"|"f")`},
		{`{"properties":{"tags":{"type":"array","items":{"type":"string"}},"n":{"type":["integer","null"]},"k":{"anyOf":[{"type":"number"},{"const":"auto"}]}},"required":["k"]}`,
			`(k: number|"auto", tags?: string[], n?: integer|null)`},
		{`{"properties":{"ids":{"type":"array","items":{"enum":[1,2]}},"opts":{"type":"object","properties":{"x":{}}}}}`, `(ids?: (1|2)[], opts?: object)`},
	} {
		if got := signature(json.RawMessage(tc.params)); got != tc.want {
			t.Errorf("signature(%s) = %s, want %s", tc.params, got, tc.want)
		}
	}
}

// TestCallArgumentsStream: when the constraint enforces the tools' parameters in full,
// a streamed call's name goes out as soon as it is complete and its arguments in pieces
// as they are generated — before the reply ends — compacted so that the pieces join to
// the unstreamed arguments; for every format, required and auto alike.
func TestCallArgumentsStream(t *testing.T) {
	args := "{\n    \"city\": \"New York\",\n    \"days\": 3,\n    \"note\": \"a \\\"quoted\\\" {brace}\"\n}"
	compact := `{"city":"New York","days":3,"note":"a \"quoted\" {brace}"}`
	for _, tc := range []struct {
		format toolcall.Format
		choice string
		text   string
	}{
		{toolcall.Hermes, "required", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>"},
		{toolcall.Hermes, "auto", "Let me check. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>"},
		{toolcall.Llama3JSON, "named", "{\"name\": \"get_weather\", \"parameters\": " + args + "}"},
		{toolcall.Generic, "auto", "{\n  \"name\": \"get_weather\",\n  \"arguments\": " + args + "\n}"},
		{toolcall.Mistral, "auto", "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " + args + "}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"},
	} {
		plan := weatherPlan(t, tc.choice)
		plan.format, plan.streamArgs = tc.format, true
		plan.params["get_weather"], _ = compileParameters(json.RawMessage(`{"type":"object"}`))
		req := &ParsedChat{Generation: Generation{Stream: true, Params: engine.SamplingParams{N: 1, Logprobs: engine.NoLogprobs}}, tools: plan}
		o := newChatOutput(req, nil, "", 0, "", nil)
		var names, pieces []string
		firstArgsAt, nameAt := -1, -1
		const step = 5
		for at := 0; at < len(tc.text); at += step {
			ev := &engine.Event{Text: tc.text[at:min(at+step, len(tc.text))]}
			if at+step >= len(tc.text) {
				ev.FinishReason = engine.FinishStop
			}
			for _, c := range o.Add(0, ev) {
				ch := c.(chatResponse).Choices[0]
				for _, d := range ch.Delta.ToolCalls {
					if d.Function.Name != "" {
						names = append(names, d.Function.Name)
						if nameAt < 0 {
							nameAt = at
						}
					}
					if *d.Index == 0 && d.Function.Arguments != "" {
						pieces = append(pieces, d.Function.Arguments)
						if firstArgsAt < 0 {
							firstArgsAt = at
						}
					}
				}
				if ch.FinishReason != nil && *ch.FinishReason != "tool_calls" {
					t.Errorf("%s/%s: finish %q", tc.format.Name, tc.choice, *ch.FinishReason)
				}
			}
		}
		where := tc.format.Name + "/" + tc.choice
		if len(names) == 0 || names[0] != "get_weather" {
			t.Errorf("%s: names %v", where, names)
			continue
		}
		if got := strings.Join(pieces, ""); got != compact {
			t.Errorf("%s: arguments joined to %q, want %q", where, got, compact)
		}
		if len(pieces) < 5 || firstArgsAt >= len(tc.text)-2*step || nameAt >= firstArgsAt+step {
			t.Errorf("%s: %d argument pieces, the first at byte %d of %d: not streamed as generated", where, len(pieces), firstArgsAt, len(tc.text))
		}
		if tc.format.Name == "mistral" && len(names) != 2 {
			t.Errorf("%s: %d calls streamed, want 2", where, len(names))
		}
	}
}

// TestNamedChoiceIsOneCall: under a named tool_choice the calls' grammar takes exactly one
// call of the named function and then only the end of the reply, in every format and
// whatever parallel_tool_calls says; under required with parallel_tool_calls a second
// call may follow the first.
func TestNamedChoiceIsOneCall(t *testing.T) {
	const eos = 256
	vocab := structured.NewVocabulary(eos+1, func(id int32) []byte { return []byte{byte(id)} }, func(int32) bool { return false }, []int32{eos})
	m := &Model{Formats: structured.NewCache(vocab, 16)}
	for _, f := range []toolcall.Format{toolcall.Hermes, toolcall.Generic, toolcall.Llama3JSON, toolcall.Mistral} {
		call := f.Prefix + `{"name":"get_weather","` + f.ArgsKey + `":{"city":"Paris"}}` + f.Suffix
		for _, tc := range []struct {
			choice      string
			parallel    bool
			secondAfter bool // a second call may follow the first
		}{{"named", true, false}, {"named", false, false}, {"required", true, true}, {"required", false, false}} {
			where := fmt.Sprintf("%s, %s, parallel_tool_calls %v", f.Name, tc.choice, tc.parallel)
			p := weatherPlan(t, tc.choice)
			p.format = f
			con, err := p.constraint(m, tc.parallel)
			if err != nil || con == nil {
				t.Fatalf("%s: constraint %v, %v", where, con, err)
			}
			mt := con.NewMatcher()
			if !mt.AcceptBytes([]byte(call)) || !mt.Complete() {
				t.Fatalf("%s: the grammar does not take one whole call %q", where, call)
			}
			mask := mt.Mask()
			if !structured.Allowed(mask, eos) {
				t.Errorf("%s: the reply cannot end after one call", where)
			}
			if n := structured.Count(mask); !tc.secondAfter && n != 1 {
				t.Errorf("%s: %d tokens allowed after the call; want only the end of the reply", where, n)
			}
			if got := mt.AcceptBytes([]byte(f.Sep + call)); got != tc.secondAfter {
				t.Errorf("%s: a second call accepted: %v, want %v", where, got, tc.secondAfter)
			}
		}
	}
}

// chatRecorder is a tokenizer whose chat template knows no tools (the generic format):
// it records the messages each render gets and encodes each as one token.
type chatRecorder struct {
	Tokenizer
	msgs []Message
}

func (r *chatRecorder) EncodeChat(msgs []Message, _ bool) ([]int32, error) {
	r.msgs = msgs
	return make([]int32, len(msgs)), nil
}

func (r *chatRecorder) EncodeChatWith(msgs []Message, o ChatOptions) ([]int32, error) {
	return r.EncodeChat(msgs, o.AddGenerationPrompt)
}

func (*chatRecorder) ChatTemplateSource() string { return "" }
func (*chatRecorder) VocabSize() int             { return 256 }

// TestGenericFormatKeepsEarlierCalls: under a template that knows no tools, an earlier
// assistant turn's tool calls reach the model as the lines the tools' system prompt asks
// for — in chat and /tokenize — so that the conversation after a call shows the call, not
// only its result. Without tools in the request the template renders the messages as
// they are (as vLLM does).
func TestGenericFormatKeepsEarlierCalls(t *testing.T) {
	history := `"messages":[{"role":"user","content":"weather?"},
		{"role":"assistant","content":null,"tool_calls":[
			{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
			{"id":"call_2","type":"function","function":{"name":"get_time","arguments":""}}]},
		{"role":"tool","tool_call_id":"call_1","content":"21C"}]`
	tools := `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
	want := `{"name":"get_weather","arguments":{"city":"Paris"}}` + "\n" + `{"name":"get_time","arguments":{}}`
	for _, body := range []string{`{"model":"m",` + history + "}", `{"model":"m",` + history + "," + tools + "}"} {
		for _, endpoint := range []string{"chat", "tokenize"} {
			rec := &chatRecorder{}
			m := &Model{Tokenizer: rec}
			var err error
			if endpoint == "chat" {
				var w ChatRequest
				if err := json.Unmarshal([]byte(body), &w); err != nil {
					t.Fatal(err)
				}
				_, err = ParseChat(&w, m)
			} else {
				var w TokenizeRequest
				if err := json.Unmarshal([]byte(body), &w); err != nil {
					t.Fatal(err)
				}
				_, err = ParseTokenize(&w, m, "m")
			}
			if err != nil {
				t.Fatalf("%s %s: %v", endpoint, body, err)
			}
			var asst *Message
			for i := range rec.msgs {
				if rec.msgs[i].Role == "assistant" {
					asst = &rec.msgs[i]
				}
			}
			withTools := strings.Contains(body, "tools")
			if asst == nil || withTools && (asst.Content != want || asst.ToolCalls != nil) || !withTools && (asst.Content != "" || len(asst.ToolCalls) != 2) {
				t.Fatalf("%s %s: the assistant turn renders as %+v", endpoint, body, asst)
			}
			if withTools != strings.Contains(rec.msgs[0].Content, "Tools; to call one") {
				t.Errorf("%s %s: system prompt %q", endpoint, body, rec.msgs[0].Content)
			}
		}
	}
}
