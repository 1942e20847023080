package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// ChatRequest is the wire schema of POST /v1/chat/completions.
type ChatRequest struct {
	generationRequest
	MaxCompletionTokens opt[jsonInt]            `json:"max_completion_tokens"`
	Messages            opt[[]opt[chatMessage]] `json:"messages"`
	Logprobs            opt[bool]               `json:"logprobs"`
	TopLogprobs         opt[jsonInt]            `json:"top_logprobs"`
	AddGenerationPrompt opt[bool]               `json:"add_generation_prompt"` // extension (vLLM)
	ChatTemplateKwargs  opt[json.RawMessage]    `json:"chat_template_kwargs"`  // extension (vLLM)
	chatFeatures
	unservedChat
}

// unservedChat are vLLM's chat members Conveyor does not implement, refused when they ask
// for something (see unservedExtensions).
type unservedChat struct {
	Echo                 opt[json.RawMessage] `json:"echo"`
	BestOf               opt[json.RawMessage] `json:"best_of"`
	ChatTemplate         opt[json.RawMessage] `json:"chat_template"`
	ContinueFinalMessage opt[json.RawMessage] `json:"continue_final_message"`
	AddSpecialTokens     opt[json.RawMessage] `json:"add_special_tokens"`
	Documents            opt[json.RawMessage] `json:"documents"`
	MMProcessorKwargs    opt[json.RawMessage] `json:"mm_processor_kwargs"`
}

// check refuses every member that asks for something.
func (u *unservedChat) check(c *check) {
	refuseUnserved(c, []unserved{
		{"echo", u.Echo, []string{"false"}, "echo is not supported in chat; completions echo the prompt"},
		{"best_of", u.BestOf, []string{"1"}, "best_of is not supported in chat; completions take it"},
		{"chat_template", u.ChatTemplate, nil, "chat_template is not supported: the model's own template is used"},
		{"continue_final_message", u.ContinueFinalMessage, []string{"false"}, "continue_final_message is not supported"},
		{"add_special_tokens", u.AddSpecialTokens, []string{"false"}, "add_special_tokens is not supported in chat: the template writes the special tokens"},
		{"documents", u.Documents, []string{"[]"}, "documents are not supported"},
		{"mm_processor_kwargs", u.MMProcessorKwargs, []string{"{}"}, "mm_processor_kwargs is not supported: the models take text only"},
	})
}

// templateKwargs validates chat_template_kwargs: an object (its members are checked as the
// template gets them).
func templateKwargs(c *check, o opt[json.RawMessage]) json.RawMessage {
	if c.failed() || !o.Set || string(o.V) == "null" {
		return nil
	}
	if jsonKind(o.V) != "an object" {
		c.fail(InvalidParam("chat_template_kwargs", "chat_template_kwargs must be an object, got %s", jsonKind(o.V)))
		return nil
	}
	return o.V
}

// chatMessage is one element of messages. Members the chat template does not use
// (refusal, ...) are ignored; tool_calls are used on assistant messages and tool_call_id
// on tool messages only (as vLLM does).
type chatMessage struct {
	Role       opt[string]              `json:"role"`
	Content    opt[messageContent]      `json:"content"`
	Name       opt[string]              `json:"name"`
	ToolCallID opt[string]              `json:"tool_call_id"`
	ToolCalls  opt[[]opt[chatToolCall]] `json:"tool_calls"`
}

// chatToolCall is one element of an assistant message's tool_calls.
type chatToolCall struct {
	ID       opt[string]           `json:"id"`
	Type     opt[string]           `json:"type"`
	Function opt[chatToolFunction] `json:"function"`
}

// chatToolFunction is a tool call's function: its name and arguments (JSON text; a JSON
// object is taken as its text too).
type chatToolFunction struct {
	Name      opt[string]          `json:"name"`
	Arguments opt[json.RawMessage] `json:"arguments"`
}

// messageContent is a message's content: a string or an array of content parts.
type messageContent struct {
	text  string
	parts []opt[contentPart] // nil for a string
}

// UnmarshalJSON implements json.Unmarshaler.
func (m *messageContent) UnmarshalJSON(b []byte) error {
	*m = messageContent{}
	switch jsonKind(b) {
	case "a string":
		return json.Unmarshal(b, &m.text)
	case "an array":
		m.parts = []opt[contentPart]{}
		return json.Unmarshal(b, &m.parts)
	}
	return fmt.Errorf("content must be a string or an array, got %s", jsonKind(b))
}

// contentPart is one content part; only {"type":"text","text":...} is supported.
type contentPart struct {
	Type opt[string] `json:"type"`
	Text opt[string] `json:"text"`
}

// chatRoles are the message roles the server accepts.
var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// ParsedChat is a validated /v1/chat/completions request.
type ParsedChat struct {
	Generation
	Prompt []int32   // the messages rendered through the chat template
	tools  *toolPlan // nil: no tool calls asked for
}

// ParseChat validates a /v1/chat/completions request and renders its prompt.
func ParseChat(w *ChatRequest, m *Model) (*ParsedChat, error) {
	c := &check{}
	g := w.parse(c, m, maxTokensParam{"max_tokens", w.MaxTokens}, maxTokensParam{"max_completion_tokens", w.MaxCompletionTokens})
	g.Names["prompt"], g.Names["logprobs"] = "messages", "top_logprobs"
	r := &ParsedChat{Generation: g}
	logprobs := c.boolean("logprobs", w.Logprobs, false)
	top := c.integer("top_logprobs", w.TopLogprobs, engine.NoLogprobs, minInt32, maxInt32)
	addGen := c.boolean("add_generation_prompt", w.AddGenerationPrompt, true)
	kwargs := templateKwargs(c, w.ChatTemplateKwargs)
	w.chatFeatures.check(c)
	w.unservedChat.check(c)
	msgs := parseMessages(c, w.Messages)
	plan, parallel := parseTools(c, &w.chatFeatures, m)
	if c.err != nil {
		return nil, c.err
	}
	switch {
	case top < 0 && top != engine.NoLogprobs:
		r.Params.Logprobs = int(top) // as sent: the engine's logprobs rule refuses it, named top_logprobs
	case top >= 0 && !logprobs:
		return nil, InvalidParam("top_logprobs", "top_logprobs requires logprobs to be true")
	case logprobs:
		r.Params.Logprobs = 0 // the chosen token's logprob, no alternatives
		if top != engine.NoLogprobs {
			r.Params.Logprobs = int(top)
		}
	}
	if plan != nil {
		var err error
		if msgs, err = plan.apply(&r.Params, parallel, m, msgs); err != nil {
			return nil, err
		}
		r.tools = plan
	}
	ids, err := renderChat(m, msgs, addGen, plan, kwargs)
	if err != nil {
		return nil, err
	}
	r.Prompt = ids
	return r, nil
}

// renderChat renders messages through the chat template into token ids, with the
// request's tools when it has some. Under a format whose templates know no tools, the
// tools are described in the system message (toolPlan.describe) and earlier tool calls
// are written into their messages' content in the form it teaches (withCallsAsText);
// without tools the messages are the template's to render, as they are.
func renderChat(m *Model, msgs []Message, addGen bool, plan *toolPlan, kwargs json.RawMessage) ([]int32, error) {
	if plan != nil && plan.format.DescribeTools {
		msgs = withCallsAsText(msgs)
	}
	o := ChatOptions{AddGenerationPrompt: addGen, Kwargs: kwargs}
	if plan != nil {
		o.Tools = plan.raw
	}
	ids, err := m.Tokenizer.EncodeChatWith(msgs, o)
	if errors.Is(err, tokenizer.ErrTemplateKwargs) {
		_, why, _ := strings.Cut(err.Error(), tokenizer.ErrTemplateKwargs.Error()+": ")
		return nil, InvalidParam("chat_template_kwargs", "chat_template_kwargs: %s", why)
	}
	if err != nil {
		return nil, InvalidParam("messages", "the messages could not be rendered with the chat template: %v", err)
	}
	if len(ids) == 0 {
		return nil, InvalidParam("messages", "the rendered messages have no tokens")
	}
	return ids, nil
}

// parseMessages validates messages: [{role, content: string | [{type:"text", text}]}].
func parseMessages(c *check, o opt[[]opt[chatMessage]]) []Message {
	if c.failed() {
		return nil
	}
	if !o.Set {
		c.fail(InvalidParam("messages", "messages is required"))
		return nil
	}
	if !shape(c, "messages", "an array", o) {
		return nil
	}
	if len(o.V) == 0 {
		c.fail(InvalidParam("messages", "messages must not be empty"))
		return nil
	}
	out := make([]Message, 0, len(o.V))
	for i, e := range o.V {
		if !e.OK {
			kind := "null"
			if e.Set {
				kind = e.kind()
			}
			c.fail(InvalidParam("messages", "messages[%d] must be an object, got %s", i, kind))
			return nil
		}
		m := e.V
		prefix := fmt.Sprintf("messages[%d].", i)
		role, ok := c.str(prefix+"role", m.Role)
		if !c.failed() && !ok {
			c.fail(InvalidParam(prefix+"role", "messages[%d].role is required", i))
		}
		if !c.failed() && !chatRoles[role] {
			c.fail(InvalidParam(prefix+"role", "messages[%d].role %q is not one of system, developer, user, assistant, tool", i, role))
		}
		content, parts := parseContent(c, prefix+"content", m.Content, role)
		name, _ := c.str(prefix+"name", m.Name)
		msg := Message{Role: role, Content: content, Parts: parts, Name: name}
		switch role {
		case "tool":
			var ok bool
			msg.ToolCallID, ok = c.str(prefix+"tool_call_id", m.ToolCallID)
			if !c.failed() && !ok {
				c.fail(InvalidParam(prefix+"tool_call_id", "messages[%d].tool_call_id is required: the id of the call it answers", i))
			}
		case "assistant":
			msg.ToolCalls = parseToolCalls(c, prefix+"tool_calls", m.ToolCalls)
		}
		if c.failed() {
			return nil
		}
		out = append(out, msg)
	}
	return out
}

// parseToolCalls validates an assistant message's tool_calls: [{id, type: "function",
// function: {name, arguments}}], arguments a string (or a JSON object).
func parseToolCalls(c *check, name string, o opt[[]opt[chatToolCall]]) []ToolCall {
	if !shape(c, name, "an array", o) {
		return nil
	}
	var out []ToolCall
	for k, e := range o.V {
		if !e.OK {
			kind := "null"
			if e.Set {
				kind = e.kind()
			}
			c.fail(InvalidParam(name, "%s[%d] must be an object, got %s", name, k, kind))
			return nil
		}
		pname := fmt.Sprintf("%s[%d].", name, k)
		id, _ := c.str(pname+"id", e.V.ID)
		typ, ok := c.str(pname+"type", e.V.Type)
		if !c.failed() && ok && typ != "function" {
			c.fail(InvalidParam(pname+"type", "%stype must be \"function\", got %q", pname, typ))
		}
		fn := e.V.Function
		if !c.failed() && !fn.Set {
			c.fail(InvalidParam(pname+"function", "%sfunction is required", pname))
		}
		if !shape(c, pname+"function", "an object", fn) {
			return nil
		}
		fname, ok := c.str(pname+"function.name", fn.V.Name)
		if !c.failed() && !ok {
			c.fail(InvalidParam(pname+"function.name", "%sfunction.name is required", pname))
		}
		args := ""
		if a := fn.V.Arguments; !c.failed() && a.Set {
			switch jsonKind(a.V) {
			case "a string":
				_ = json.Unmarshal(a.V, &args)
			case "an object":
				args = string(a.V)
			default:
				c.fail(InvalidParam(pname+"function.arguments", "%sfunction.arguments must be a string, got %s", pname, jsonKind(a.V)))
			}
		}
		if c.failed() {
			return nil
		}
		out = append(out, ToolCall{ID: id, Type: "function", Name: fname, Arguments: args})
	}
	return out
}

// parseContent returns a message's text: the string, or its text parts joined (and then
// the parts). Content may be absent only on assistant messages (which then carry tool
// calls).
func parseContent(c *check, name string, o opt[messageContent], role string) (string, []ContentPart) {
	if c.failed() {
		return "", nil
	}
	if !o.Set {
		if role != "assistant" {
			c.fail(InvalidParam(name, "%s is required", name))
		}
		return "", nil
	}
	if !shape(c, name, "a string or an array of content parts", o) {
		return "", nil
	}
	if o.V.parts == nil {
		return o.V.text, nil
	}
	if len(o.V.parts) == 0 && role != "assistant" {
		c.fail(InvalidParam(name, "%s must not be an empty array", name))
		return "", nil
	}
	parts := make([]ContentPart, 0, len(o.V.parts))
	var sb strings.Builder
	for k, p := range o.V.parts {
		if !p.OK {
			kind := "null"
			if p.Set {
				kind = p.kind()
			}
			c.fail(InvalidParam(name, "%s[%d] must be an object, got %s", name, k, kind))
			return "", nil
		}
		pname := fmt.Sprintf("%s[%d].", name, k)
		typ, _ := c.str(pname+"type", p.V.Type)
		if !c.failed() && typ != "text" {
			if typ == "" {
				c.fail(InvalidParam(pname+"type", "%stype is required", pname))
			} else {
				c.fail(UnsupportedParam(pname+"type", "content part type %q is not supported; only \"text\" parts are", typ))
			}
		}
		text, ok := c.str(pname+"text", p.V.Text)
		if !c.failed() && !ok {
			c.fail(InvalidParam(pname+"text", "%stext is required", pname))
		}
		if c.failed() {
			return "", nil
		}
		sb.WriteString(text)
		parts = append(parts, ContentPart{Type: "text", Text: text})
	}
	return sb.String(), parts
}
