package api

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/conveyor-llm/conveyor/api/toolcall"
	"github.com/conveyor-llm/conveyor/engine/structured"
)

// toolPlan is what a chat request's tools and tool_choice ask for.
type toolPlan struct {
	tools  []toolcall.Tool
	raw    []json.RawMessage // the tool objects as sent, for the chat template
	format toolcall.Format
	choice string // "auto", "required" or "named"
	named  string
	// params validates each tool's arguments against its full parameters schema,
	// including keywords the decoding constraint does not enforce.
	params map[string]*jsonschema.Schema
}

// maxParallelCalls bounds the calls of one reply under a required or named choice with
// parallel_tool_calls.
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
func parseTools(c *check, f *chatFeatures, b *Backend) (*toolPlan, bool) {
	parallel := c.boolean("parallel_tool_calls", f.ParallelToolCalls, true)
	if c.failed() {
		return nil, parallel
	}
	p := &toolPlan{choice: "auto", params: map[string]*jsonschema.Schema{}}
	if shape(c, "tools", "an array", f.Tools) {
		seen := map[string]bool{}
		for i, raw := range f.Tools.V {
			name := fmt.Sprintf("tools[%d]", i)
			var w wireTool
			if err := json.Unmarshal(raw, &w); err != nil || jsonKind(raw) != "an object" {
				c.fail(invalidParam("tools", "%s must be an object", name))
				return nil, parallel
			}
			if typ, ok := c.str(name+".type", w.Type); !c.failed() && (!ok || typ != "function") {
				c.fail(invalidParam("tools", "%s.type must be \"function\"", name))
			}
			if !shape(c, name+".function", "an object", w.Function) {
				if !c.failed() {
					c.fail(invalidParam("tools", "%s.function is required", name))
				}
				return nil, parallel
			}
			fn := w.Function.V
			fname, ok := c.str(name+".function.name", fn.Name)
			if !c.failed() && (!ok || !validSchemaName(fname)) {
				c.fail(invalidParam("tools", "%s.function.name must be 1 to 64 letters, digits, underscores and dashes", name))
			}
			if !c.failed() && seen[fname] {
				c.fail(invalidParam("tools", "%s.function.name %q is given twice", name, fname))
			}
			desc, _ := c.str(name+".function.description", fn.Description)
			strict := c.boolean(name+".function.strict", fn.Strict, false)
			if len(fn.Parameters) > 0 && string(fn.Parameters) != "null" && jsonKind(fn.Parameters) != "an object" {
				c.fail(invalidParam("tools", "%s.function.parameters must be a JSON Schema object", name))
			}
			if strict && !c.failed() && len(fn.Parameters) > 0 {
				// As response_format's strict: a keyword the constraint cannot honour is refused
				// by name rather than ignored.
				if _, err := structured.CompileSchema(fn.Parameters, true); err != nil {
					c.fail(unsupportedValue("tools", "%s.function.parameters: %s", name, strings.TrimPrefix(err.Error(), "structured: ")))
				}
			}
			if !c.failed() {
				v, err := compileParameters(fn.Parameters)
				if err != nil {
					c.fail(invalidParam("tools", "%s.function.parameters is not a valid JSON Schema: %s", name, strings.Join(strings.Fields(err.Error()), " ")))
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
				c.fail(invalidParam("tool_choice", "tool_choice %q is not one of none, auto, required", s))
			}
		case json.Unmarshal(f.ToolChoice.V, &named) == nil && named.Type == "function" && named.Function.Name != "":
			p.choice, p.named = "named", named.Function.Name
		default:
			c.fail(invalidParam("tool_choice", "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}"))
		}
	}
	if c.failed() {
		return nil, parallel
	}
	if len(p.tools) == 0 {
		if p.choice == "required" || p.choice == "named" {
			c.fail(invalidParam("tool_choice", "tool_choice %s needs tools", p.choice))
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
			c.fail(invalidParam("tool_choice", "tool_choice names %q, which is not in tools", p.named))
			return nil, parallel
		}
	}
	p.format = toolcall.Generic
	if tt, ok := b.Tokenizer.(ToolTemplater); ok {
		p.format = toolcall.Detect(tt.ChatTemplateSource())
	}
	if b.ToolCallParser != "" {
		if f, err := toolcall.ByName(b.ToolCallParser); err == nil {
			p.format = f
		}
	}
	if p.format.Name == toolcall.Mistral.Name && p.choice != "auto" {
		// [TOOL_CALLS] is a control token, which constrained decoding does not emit.
		c.fail(unsupportedValue("tool_choice", "tool_choice %s is not supported with the mistral tool-call format", p.choice))
		return nil, parallel
	}
	return p, parallel
}

// compileParameters compiles a tool's parameters (any object when absent) for checking
// parsed calls.
func compileParameters(params json.RawMessage) (*jsonschema.Schema, error) {
	if len(bytes.TrimSpace(params)) == 0 || string(bytes.TrimSpace(params)) == "null" {
		params = json.RawMessage(`{"type":"object"}`)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(params))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("tool.json", doc); err != nil {
		return nil, err
	}
	return c.Compile("tool.json")
}

// Reasons a parsed call is not returned as a call (the label of
// conveyor_tool_calls_rejected_total).
const (
	rejectUnknownTool      = "unknown_tool"
	rejectInvalidArguments = "invalid_arguments"
)

// check returns "" when every call names an offered tool (the named one, under a named
// tool_choice) with arguments that validate against its parameters, else the reason
// the reply's calls are rejected.
func (p *toolPlan) check(calls []toolcall.Call) string {
	for _, c := range calls {
		v, ok := p.params[c.Name]
		if !ok || (p.choice == "named" && c.Name != p.named) {
			return rejectUnknownTool
		}
		args, err := jsonschema.UnmarshalJSON(strings.NewReader(c.Arguments))
		if err != nil || v.Validate(args) != nil {
			return rejectInvalidArguments
		}
	}
	return ""
}

// constraint returns the constraint of the calls: one to maxParallelCalls calls (one
// without parallel_tool_calls) in the model's format, each to a listed tool (the named
// one) with arguments that validate against its parameters. With auto it is applied
// lazily, from the format's trigger on (nil when the format has none).
func (p *toolPlan) constraint(b *Backend, parallel bool) (*structured.Constraint, error) {
	if p.choice == "auto" && (p.format.Trigger == "" || b.Formats == nil) {
		return nil, nil
	}
	if b.Formats == nil {
		return nil, unsupportedValue("tool_choice", "tool_choice %s is not supported by this server", p.choice)
	}
	schema, err := p.format.CallSchema(p.tools, p.named)
	if err != nil {
		return nil, invalidParam("tool_choice", "%v", err)
	}
	most := 1
	if parallel {
		most = maxParallelCalls
	}
	con, err := b.Formats.Wrapped(p.format.Prefix, schema, p.format.Suffix, p.format.Sep, 1, most, false)
	if errors.Is(err, structured.ErrBadSchema) || errors.Is(err, structured.ErrUnsupported) {
		return nil, invalidParam("tools", "a tool's parameters cannot be used: %s", strings.TrimPrefix(err.Error(), "structured: "))
	}
	return con, err
}

// systemPrompt describes the tools for the generic format, whose chat template knows
// none: the reply is either text or one JSON object per call.
func (p *toolPlan) systemPrompt() string {
	var b strings.Builder
	b.WriteString("Tools; to call one, reply {\"name\": tool, \"arguments\": {...}}, one call per line:\n")
	for _, t := range p.tools {
		var params bytes.Buffer
		if json.Compact(&params, t.Parameters) != nil || params.Len() == 0 {
			params.Reset()
			params.WriteString("{}")
		}
		if t.Description != "" {
			fmt.Fprintf(&b, "%s (%s): %s\n", t.Name, t.Description, params.String())
		} else {
			fmt.Fprintf(&b, "%s: %s\n", t.Name, params.String())
		}
	}
	return b.String()
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

// newToolCallID returns an OpenAI-style call id.
func newToolCallID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "call_" + hex.EncodeToString(b[:])
}
