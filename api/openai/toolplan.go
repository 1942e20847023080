package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/conveyor-llm/conveyor/api/toolcall"
	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/engine/structured"
)

// toolPlan is what a chat request's tools, tool_choice and parallel_tool_calls ask for,
// and this file is its one owner, for the chat and responses endpoints alike:
// parseTools builds it from the request; apply sets what it asks of the engine (the
// calls' constraint, eager or from the format's trigger on) and of the prompt (the
// tools described in the system message); reply reads a finished reply against it
// (parsed in the format, a cut call left out, every call checked against its tool's
// schema). The converters only stream what it decides.
type toolPlan struct {
	tools  []toolcall.Tool
	raw    []json.RawMessage // the tool objects as sent, for the chat template
	format toolcall.Format
	choice string // "auto", "required" or "named"
	named  string
	// params validates each tool's arguments against its full parameters schema,
	// including keywords the decoding constraint does not enforce.
	params map[string]*jsonschema.Schema
	// streamArgs: the constraint enforces every tool's parameters in full, so a
	// constrained call cannot fail its check and its arguments may be streamed as they
	// are generated; otherwise a call is held until it can be checked whole.
	streamArgs bool
}

// maxParallelCalls bounds the calls of one reply under tool_choice required (or auto,
// once a call opens) with parallel_tool_calls.
const maxParallelCalls = 4

// wireTool is one element of tools.
type wireTool struct {
	Type     opt[string] `json:"type"`
	Function opt[struct {
		Name        opt[string]     `json:"name"`
		Description opt[string]     `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
		Strict      opt[bool]       `json:"strict"`
	}] `json:"function"`
}

// parseTools validates tools, tool_choice and parallel_tool_calls; nil when the request
// asks for no tool calls (no tools, or tool_choice "none").
func parseTools(c *check, f *chatFeatures, m *Model) (*toolPlan, bool) {
	parallel := c.boolean("parallel_tool_calls", f.ParallelToolCalls, true)
	if c.failed() {
		return nil, parallel
	}
	p := &toolPlan{choice: "auto", params: map[string]*jsonschema.Schema{}, streamArgs: true}
	if shape(c, "tools", "an array", f.Tools) {
		seen := map[string]bool{}
		for i, raw := range f.Tools.V {
			name := fmt.Sprintf("tools[%d]", i)
			var w wireTool
			if err := json.Unmarshal(raw, &w); err != nil || jsonKind(raw) != "an object" {
				c.fail(InvalidParam("tools", "%s must be an object", name))
				return nil, parallel
			}
			if typ, ok := c.str(name+".type", w.Type); !c.failed() && (!ok || typ != "function") {
				c.fail(InvalidParam("tools", "%s.type must be \"function\"", name))
			}
			if !shape(c, name+".function", "an object", w.Function) {
				if !c.failed() {
					c.fail(InvalidParam("tools", "%s.function is required", name))
				}
				return nil, parallel
			}
			fn := w.Function.V
			at := name + ".function" // where the function's fields are, for errors
			if f.flatTools {
				at = name
			}
			fname, ok := c.str(at+".name", fn.Name)
			if !c.failed() && (!ok || !validSchemaName(fname)) {
				c.fail(InvalidParam("tools", "%s.name must be 1 to 64 letters, digits, underscores and dashes", at))
			}
			if !c.failed() && seen[fname] {
				c.fail(InvalidParam("tools", "%s.name %q is given twice", at, fname))
			}
			desc, _ := c.str(at+".description", fn.Description)
			strict := c.boolean(at+".strict", fn.Strict, false)
			if len(fn.Parameters) > 0 && string(fn.Parameters) != "null" && jsonKind(fn.Parameters) != "an object" {
				c.fail(InvalidParam("tools", "%s.parameters must be a JSON Schema object", at))
			}
			if !c.failed() {
				// Whether the constraint can enforce every keyword of the parameters: a strict
				// tool's must be (as response_format's strict, a keyword it cannot honour is
				// refused by name rather than ignored), and only then may arguments stream.
				// A schema it finds bad (nested too deep, matching no value, ...) is refused
				// before the validator below spends time on it.
				_, strictErr := structured.CompileSchema(parametersOrObject(fn.Parameters), true)
				switch why := strings.TrimPrefix(fmt.Sprint(strictErr), "structured: "); {
				case errors.Is(strictErr, structured.ErrBadSchema):
					c.fail(InvalidParam("tools", "%s.parameters is not a valid JSON Schema: %s", at, strings.TrimPrefix(why, "bad schema: ")))
				case strict && strictErr != nil:
					c.fail(UnsupportedValue("tools", "%s.parameters: %s", at, why))
				}
				p.streamArgs = p.streamArgs && strictErr == nil
			}
			if !c.failed() {
				v, err := compileParameters(fn.Parameters)
				if err != nil {
					c.fail(InvalidParam("tools", "%s.parameters is not a valid JSON Schema: %s", at, strings.Join(strings.Fields(err.Error()), " ")))
				}
				p.params[fname] = v
			}
			if c.failed() {
				return nil, parallel
			}
			seen[fname] = true
			p.tools = append(p.tools, toolcall.Tool{Name: fname, Description: desc, Parameters: fn.Parameters})
			p.raw = append(p.raw, raw)
		}
	}
	if f.ToolChoice.Set && !c.failed() {
		var s string
		var named struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		switch {
		case json.Unmarshal(f.ToolChoice.V, &s) == nil:
			switch s {
			case "none", "auto", "required":
				p.choice = s
			default:
				c.fail(InvalidParam("tool_choice", "tool_choice %q is not one of none, auto, required", s))
			}
		case json.Unmarshal(f.ToolChoice.V, &named) == nil && named.Type == "function" && named.Function.Name != "":
			p.choice, p.named = "named", named.Function.Name
		default:
			c.fail(InvalidParam("tool_choice", "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}"))
		}
	}
	if c.failed() {
		return nil, parallel
	}
	if len(p.tools) == 0 {
		if p.choice == "required" || p.choice == "named" {
			c.fail(InvalidParam("tool_choice", "tool_choice %s needs tools", p.choice))
		}
		return nil, parallel
	}
	if p.choice == "none" {
		return nil, parallel
	}
	if p.choice == "named" {
		found := false
		for _, t := range p.tools {
			found = found || t.Name == p.named
		}
		if !found {
			c.fail(InvalidParam("tool_choice", "tool_choice names %q, which is not in tools", p.named))
			return nil, parallel
		}
	}
	p.format = m.toolFormat()
	return p, parallel
}

// toolFormat is the model's tool-call format: --tool-call-parser's, else the one its chat
// template shows.
func (m *Model) toolFormat() toolcall.Format {
	if m.ToolCallParser != "" {
		if f, err := toolcall.ByName(m.ToolCallParser); err == nil {
			return f
		}
	}
	return toolcall.Detect(m.Tokenizer.ChatTemplateSource())
}

// parametersOrObject returns a tool's parameters, or any object when absent.
func parametersOrObject(params json.RawMessage) json.RawMessage {
	if t := bytes.TrimSpace(params); len(t) == 0 || string(t) == "null" {
		return json.RawMessage(`{"type":"object"}`)
	}
	return params
}

// compileParameters compiles a tool's parameters (any object when absent) for checking
// parsed calls.
func compileParameters(params json.RawMessage) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(parametersOrObject(params)))
	if err != nil {
		return nil, err
	}
	// An absolute URL of its own: a relative one is resolved against the working
	// directory, which errors would then show the client.
	const url = "urn:parameters"
	c := jsonschema.NewCompiler()
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, errors.New(strings.ReplaceAll(err.Error(), `"`+url+`#`, `"#`))
	}
	return s, nil
}

// Reasons a parsed call is not returned as a call (the label of
// conveyor_tool_calls_rejected_total).
const (
	RejectUnknownTool      = "unknown_tool"
	RejectInvalidArguments = "invalid_arguments"
)

// check returns "" when every call names an offered tool (the named one, under a named
// tool_choice) with arguments that validate against its parameters, else the reason
// the reply's calls are rejected.
func (p *toolPlan) check(calls []toolcall.Call) string {
	for _, c := range calls {
		v, ok := p.params[c.Name]
		if !ok || (p.choice == "named" && c.Name != p.named) {
			return RejectUnknownTool
		}
		args, err := jsonschema.UnmarshalJSON(strings.NewReader(c.Arguments))
		if err != nil || v.Validate(args) != nil {
			return RejectInvalidArguments
		}
	}
	return ""
}

// replyCalls is what a finished reply under tools holds.
type replyCalls struct {
	content string // the text outside the calls; the whole text when there are none
	calls   []toolCallOut
	// cut: the reply was cut short (max_tokens, the context) inside a call, which is in
	// neither content nor calls; its finish reason stays "length".
	cut bool
}

// reply reads a finished reply: its content and the tool calls it holds that validate. A
// reply whose calls name a tool that was not offered or carry arguments its parameters
// reject is content (reason says why): no call that fails its tool's schema is ever
// returned as a call. Nor is a call the reply's end cut short (cut: it finished with
// "length"): the calls completed before it stay calls, and its text is left out.
func (p *toolPlan) reply(text string, cut bool) (rc replyCalls, reason string) {
	var content string
	var calls []toolcall.Call
	at := -1
	if cut {
		content, calls, at = p.format.ParseCut(text)
	} else {
		content, calls = p.format.Parse(text)
	}
	if at >= 0 {
		text = text[:at]
	}
	if len(calls) > 0 {
		if reason := p.check(calls); reason != "" {
			return replyCalls{content: text, cut: at >= 0}, reason
		}
	}
	out := make([]toolCallOut, len(calls))
	for i, c := range calls {
		out[i] = toolCallOut{ID: NewID("call_"), Type: "function", Function: toolCallFunction{Name: c.Name, Arguments: c.Arguments}}
	}
	return replyCalls{content: content, calls: out, cut: at >= 0}, ""
}

// constraint returns the constraint of the calls in the model's format, each to a listed
// tool with arguments that validate against its parameters: under a named tool_choice
// exactly one call of the named function, whatever parallel_tool_calls says (as OpenAI
// documents a named choice and vLLM builds it), the grammar ending the reply after it;
// otherwise one to maxParallelCalls calls (one without parallel_tool_calls). With auto
// it is applied lazily, from the format's trigger on (nil when the format has none).
func (p *toolPlan) constraint(m *Model, parallel bool) (*structured.Constraint, error) {
	if p.choice == "auto" && (p.format.Trigger.Text == "" || m.Formats == nil) {
		return nil, nil
	}
	if m.Formats == nil {
		return nil, UnsupportedValue("tool_choice", "tool_choice %s is not supported by this server", p.choice)
	}
	schema, err := p.format.CallSchema(p.tools, p.named)
	if err != nil {
		return nil, InvalidParam("tool_choice", "%v", err)
	}
	most := 1
	if parallel && p.choice != "named" {
		most = maxParallelCalls
	}
	con, err := m.Formats.Wrapped(p.format.Prefix, schema, p.format.Suffix, p.format.Sep, 1, most, false)
	if errors.Is(err, structured.ErrBadSchema) || errors.Is(err, structured.ErrUnsupported) {
		return nil, InvalidParam("tools", "a tool's parameters cannot be used: %s", strings.TrimPrefix(err.Error(), "structured: "))
	}
	return con, err
}

// apply sets what the plan asks of the engine in params — the calls' constraint, eager
// or lazy from the format's trigger, and the control tokens kept in the text — and
// returns msgs with the tools described in the system message when the format wants it.
// The chat and responses endpoints share it.
func (p *toolPlan) apply(params *engine.SamplingParams, parallel bool, m *Model, msgs []Message) ([]Message, error) {
	// A format whose calls open with a control token needs it in the text.
	params.KeepSpecialTokens = params.KeepSpecialTokens || p.format.ControlPrefix
	con, err := p.constraint(m, parallel)
	if err != nil {
		return nil, err
	}
	if con != nil && p.choice == "auto" {
		params.LazyConstraint, params.LazyTrigger = con, p.format.Trigger
	} else if con != nil {
		if params.Constraint != nil {
			return nil, InvalidParam("tool_choice", "tool_choice %s cannot be combined with a JSON response_format", p.choice)
		}
		params.Constraint = con
	}
	return p.describe(msgs), nil
}

// describe puts the tools' description into the messages when the format's chat
// templates know no tools.
func (p *toolPlan) describe(msgs []Message) []Message {
	if p.format.DescribeTools {
		return withToolsSystemPrompt(msgs, p.systemPrompt())
	}
	return msgs
}

// systemPrompt describes the tools for the generic format, whose chat template knows
// none: the reply is either text or one JSON object per call. Each tool is one
// signature line — name(param: type, optional?: type) and its description — so that
// a small model's context holds several tools and still has room for the call; the
// decoding constraint and the schema check hold the arguments to the full schema.
func (p *toolPlan) systemPrompt() string {
	var b strings.Builder
	b.WriteString("Tools; to call one, reply {\"name\": tool, \"arguments\": {...}}, one call per line:\n")
	for _, t := range p.tools {
		b.WriteString(t.Name)
		b.WriteString(signature(t.Parameters))
		if d := strings.TrimSpace(t.Description); d != "" {
			b.WriteString(": ")
			b.WriteString(strings.Join(strings.Fields(d), " "))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// withToolsSystemPrompt puts the tools' description at the start of the system message
// (adding one when there is none), for templates that know no tools.
func withToolsSystemPrompt(msgs []Message, prompt string) []Message {
	out := make([]Message, 0, len(msgs)+1)
	if len(msgs) > 0 && msgs[0].Role == "system" {
		first := msgs[0]
		first.Content = prompt + "\n" + first.Content
		first.Parts = nil
		return append(append(out, first), msgs[1:]...)
	}
	return append(append(out, Message{Role: "system", Content: prompt}), msgs...)
}

// withCallsAsText writes each assistant message's tool calls into its content, one
// {"name": ..., "arguments": {...}} line per call as the generic format's system prompt
// asks for them, for templates that know no tools: without it the conversation the model
// reads after a call holds the call's result but not the call. Arguments that are not
// JSON are written as a JSON string. msgs is not modified.
func withCallsAsText(msgs []Message) []Message {
	var out []Message
	for i, m := range msgs {
		if m.Role != "assistant" || len(m.ToolCalls) == 0 {
			if out != nil {
				out = append(out, m)
			}
			continue
		}
		if out == nil {
			out = append(make([]Message, 0, len(msgs)), msgs[:i]...)
		}
		lines := make([]string, 0, len(m.ToolCalls)+1)
		if strings.TrimSpace(m.Content) != "" {
			lines = append(lines, m.Content)
		}
		for _, tc := range m.ToolCalls {
			args := json.RawMessage(tc.Arguments)
			if strings.TrimSpace(tc.Arguments) == "" {
				args = json.RawMessage("{}")
			} else if !json.Valid(args) {
				args, _ = json.Marshal(tc.Arguments)
			}
			line, _ := json.Marshal(struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			}{tc.Name, args})
			lines = append(lines, string(line))
		}
		m.Content, m.Parts, m.ToolCalls = strings.Join(lines, "\n"), nil, nil
		out = append(out, m)
	}
	if out == nil {
		return msgs
	}
	return out
}

// signature renders an object schema's properties as (name: type, opt?: type), required
// ones first in the schema's order.
func signature(params json.RawMessage) string {
	var obj struct {
		Properties orderedProps `json:"properties"`
		Required   []string     `json:"required"`
	}
	if json.Unmarshal(params, &obj) != nil || len(obj.Properties) == 0 {
		return "()"
	}
	req := map[string]bool{}
	for _, r := range obj.Required {
		req[r] = true
	}
	var parts []string
	for _, pass := range []bool{true, false} {
		for _, pr := range obj.Properties {
			if req[pr.name] != pass {
				continue
			}
			mark := ""
			if !pass {
				mark = "?"
			}
			parts = append(parts, pr.name+mark+": "+typeName(pr.schema, 0))
		}
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// typeName is a short TypeScript-like name of a property's schema.
func typeName(raw json.RawMessage, depth int) string {
	var s struct {
		Type  json.RawMessage   `json:"type"`
		Enum  []json.RawMessage `json:"enum"`
		Const json.RawMessage   `json:"const"`
		Items json.RawMessage   `json:"items"`
		AnyOf []json.RawMessage `json:"anyOf"`
		OneOf []json.RawMessage `json:"oneOf"`
	}
	if json.Unmarshal(raw, &s) != nil {
		return "any"
	}
	if len(s.Const) > 0 {
		return string(s.Const)
	}
	if len(s.Enum) > 0 {
		vals := make([]string, len(s.Enum))
		for i, e := range s.Enum {
			var buf bytes.Buffer
			_ = json.Compact(&buf, e)
			vals[i] = buf.String()
		}
		return strings.Join(vals, "|")
	}
	if alts := append(s.AnyOf, s.OneOf...); len(alts) > 0 && depth < 3 {
		names := make([]string, len(alts))
		for i, a := range alts {
			names[i] = typeName(a, depth+1)
		}
		return strings.Join(names, "|")
	}
	var types []string
	if json.Unmarshal(s.Type, &types) != nil {
		var one string
		if json.Unmarshal(s.Type, &one) != nil {
			return "any"
		}
		types = []string{one}
	}
	for i, t := range types {
		if t == "array" {
			item := "any"
			if len(s.Items) > 0 && depth < 3 {
				item = typeName(s.Items, depth+1)
			}
			if strings.Contains(item, "|") {
				item = "(" + item + ")"
			}
			types[i] = item + "[]"
		}
	}
	return strings.Join(types, "|")
}

// orderedProps reads a JSON object's members in document order.
type orderedProps []struct {
	name   string
	schema json.RawMessage
}

func (o *orderedProps) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("properties must be an object")
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		*o = append(*o, struct {
			name   string
			schema json.RawMessage
		}{t.(string), v})
	}
	return nil
}

// toolCallOut is one element of message.tool_calls.
type toolCallOut struct {
	Index    *int             `json:"index,omitempty"` // streamed deltas only
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"`
	Function toolCallFunction `json:"function"`
}

type toolCallFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}
