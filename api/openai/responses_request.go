package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/conveyor-llm/conveyor/engine"
)

// Limits of a /v1/responses request (the stored size is the store's limit).
const (
	MaxInputItems     = 2048 // items of input, and of a conversation continued with previous_response_id
	maxMetadataKeys   = 16
	maxMetadataKey    = 64  // characters
	maxMetadataValue  = 512 // characters
	maxResponseIDSize = 128 // bytes
)

// ParsedResponses is a validated /v1/responses request.
type ParsedResponses struct {
	Generation
	Prompt     []int32
	tools      *toolPlan // nil: no tool calls asked for
	Store      bool
	Background bool
	PreviousID string
	// Input is this request's input as items (ids assigned); Context the items of the
	// conversation previous_response_id continues.
	Input, Context []ResponseItem
	// Echo is the response object's copy of the request: instructions, tools, text, ...
	Echo Response
}

// ConversationLookup returns the items of the stored conversation a response ends
// (its context, its input and its output), or an error for an unknown id.
type ConversationLookup func(id string) ([]ResponseItem, error)

// builtinTools are OpenAI's hosted tools: refused by name.
var builtinTools = map[string]bool{
	"web_search": true, "web_search_preview": true, "web_search_2025_08_26": true, "web_search_preview_2025_03_11": true,
	"file_search": true, "code_interpreter": true, "computer_use_preview": true, "computer": true, "image_generation": true,
	"mcp": true, "local_shell": true, "shell": true, "custom": true, "apply_patch": true,
}

// ParseResponses validates a /v1/responses request, continues the conversation of
// previous_response_id (through lookup) and renders the prompt. defaultStore is what an
// omitted store means.
func ParseResponses(w *ResponsesRequest, m *Model, lookup ConversationLookup, defaultStore bool) (*ParsedResponses, error) {
	c := &check{}
	r := &ParsedResponses{}
	text, format := parseResponsesText(c, w.Text)
	gw := generationRequest{Model: w.Model, Temperature: w.Temperature, TopP: w.TopP, Stream: w.Stream, Stop: w.Stop,
		Seed: w.Seed, User: w.User, ResponseFormat: format, PresencePenalty: w.PresencePenalty,
		FrequencyPenalty: w.FrequencyPenalty, samplingExtensions: w.samplingExtensions}
	// An omitted max_output_tokens leaves the whole context: the engine clips it to the room left.
	maxOut := w.MaxOutputTokens
	if !maxOut.Set {
		maxOut = opt[jsonInt]{Set: true, OK: true, V: jsonInt{N: int64(max(m.MaxModelLen, 1))}}
	}
	r.Generation = gw.parse(c, m, maxTokensParam{"max_output_tokens", maxOut})
	c.err = renameFormatError(c.err)
	r.Names["prompt"], r.Names["logprobs"] = "input", "top_logprobs"
	if shape(c, "stream_options", "an object", w.StreamOptions) {
		c.boolean("stream_options.include_obfuscation", w.StreamOptions.V.IncludeObfuscation, false)
		if !c.failed() && !r.Stream {
			c.fail(InvalidParam("stream_options", "stream_options is only allowed when stream is true"))
		}
	}
	refuse(c, "max_tool_calls", w.MaxToolCalls, "max_tool_calls is not supported")
	refuse(c, "conversation", w.Conversation, "conversation is not supported: continue a conversation with previous_response_id")
	refuse(c, "prompt", w.Prompt, "prompt (stored prompt templates) is not supported")
	refuse(c, "context_management", w.ContextManagement, "context_management is not supported")
	refuse(c, "moderation", w.Moderation, "moderation is not supported")
	if t, ok := c.str("truncation", w.Truncation); ok && t != "disabled" {
		if t == "auto" {
			c.fail(UnsupportedValue("truncation", "truncation \"auto\" is not supported; only \"disabled\" is"))
		} else {
			c.fail(InvalidParam("truncation", "truncation %q is not one of auto, disabled", t))
		}
	}
	if shape(c, "include", "an array of strings", w.Include) && len(w.Include.V) > 0 {
		c.fail(UnsupportedValue("include", "include %q is not supported", w.Include.V[0]))
	}
	if shape(c, "reasoning", "an object", w.Reasoning) {
		if e, ok := c.str("reasoning.effort", w.Reasoning.V.Effort); ok && e != "none" {
			c.fail(UnsupportedValue("reasoning.effort", "reasoning.effort %q is not supported: the model does not reason; only \"none\" is", e))
		}
		if s := w.Reasoning.V.Summary; !c.failed() && len(s) > 0 && !isNull(s) {
			c.fail(UnsupportedParam("reasoning.summary", "reasoning.summary is not supported: the model does not reason"))
		}
	}
	// The engine's logprobs rule judges the range (renamed top_logprobs); within it only
	// 0 is supported.
	if n := c.integer("top_logprobs", w.TopLogprobs, 0, minInt32, maxInt32); n > 0 && n <= engine.MaxLogprobs {
		c.fail(UnsupportedValue("top_logprobs", "top_logprobs is not supported by /v1/responses; only 0 is"))
	} else if n != 0 {
		r.Params.Logprobs = int(n)
	}
	meta := parseMetadata(c, w.Metadata)
	w.platformHints.check(c)
	r.Store = c.boolean("store", w.Store, defaultStore)
	r.Background = c.boolean("background", w.Background, false)
	if r.Background && !c.failed() {
		switch {
		case !r.Store:
			c.fail(InvalidParam("background", "background requires store to be true"))
		case r.Stream:
			c.fail(UnsupportedValue("stream", "stream with background is not supported: poll GET /v1/responses/{id} instead"))
		}
	}
	prev, hasPrev := c.str("previous_response_id", w.PreviousResponseID)
	if hasPrev && !c.failed() && (prev == "" || len(prev) > maxResponseIDSize) {
		c.fail(InvalidParam("previous_response_id", "previous_response_id must be a response id"))
	}
	instructions, hasInstr := c.str("instructions", w.Instructions)
	input := parseInput(c, w.Input)
	toolsEcho, features := convertTools(c, w)
	plan, parallel := parseTools(c, features, m)
	if c.err != nil {
		return nil, c.err
	}
	if hasPrev {
		ctx, err := lookup(prev)
		if err != nil {
			return nil, err
		}
		r.Context, r.PreviousID = ctx, prev
	}
	if len(r.Context)+len(input) > MaxInputItems {
		return nil, InvalidParam("input", "the conversation has %d items; at most %d are allowed", len(r.Context)+len(input), MaxInputItems)
	}
	r.Input = input
	msgs, err := itemsToMessages(append(append([]ResponseItem(nil), r.Context...), input...), len(r.Context))
	if err != nil {
		return nil, err
	}
	if hasInstr && instructions != "" {
		msgs = append([]Message{{Role: "system", Content: instructions}}, msgs...)
	}
	if plan != nil {
		if msgs, err = plan.apply(&r.Params, parallel, m, msgs); err != nil {
			return nil, renameFormatError(err)
		}
		r.tools = plan
	}
	if r.Prompt, err = renderChat(m, msgs, true, plan, nil); err != nil {
		var pe *ParamError
		if errors.As(err, &pe) {
			pe.Param, pe.Message = "input", strings.Replace(pe.Message, "messages", "input", 1)
		}
		return nil, err
	}

	e := &r.Echo
	if hasInstr {
		e.Instructions = &instructions
	}
	if w.MaxOutputTokens.Set {
		n := int64(r.Params.MaxTokens)
		e.MaxOutputTokens = &n
	}
	e.Model = r.Model
	e.ParallelToolCalls = parallel
	if hasPrev {
		e.PreviousResponseID = &prev
	}
	e.Reasoning = json.RawMessage(`{"effort":null,"summary":null}`)
	e.Store = r.Store
	e.Background = r.Background
	e.Temperature, e.TopP = float64(r.Params.Temperature), float64(r.Params.TopP)
	e.Text = text
	e.ToolChoice = json.RawMessage(`"auto"`)
	if w.ToolChoice.Set {
		e.ToolChoice = compactJSON(w.ToolChoice.V)
	}
	e.Tools = toolsEcho
	e.Truncation = "disabled"
	if u, ok := w.User.V, w.User.OK; ok {
		e.User = &u
	}
	e.Metadata = meta
	return r, nil
}

// renameFormatError reports an error of response_format (which text.format is decoded
// into) under text.format's names.
func renameFormatError(err error) error {
	var pe *ParamError
	if !errors.As(err, &pe) || !strings.Contains(pe.Param+pe.Message, "response_format") {
		return err
	}
	rn := strings.NewReplacer("response_format.json_schema.", "text.format.", "response_format", "text.format")
	return &ParamError{Param: rn.Replace(pe.Param), Message: rn.Replace(pe.Message), Kind: pe.Kind}
}

// parseResponsesText validates text: {"format": {...}, "verbosity"}; it returns the
// object the response echoes and text.format as response_format.
func parseResponsesText(c *check, o opt[json.RawMessage]) (json.RawMessage, opt[responseFormat]) {
	echo := json.RawMessage(`{"format":{"type":"text"},"verbosity":"medium"}`)
	if !o.Set {
		return echo, opt[responseFormat]{}
	}
	var t responsesText
	if jsonKind(o.V) != "an object" || decodeObject(o.V, &t) != nil {
		c.fail(InvalidParam("text", "text must be an object, got %s", jsonKind(o.V)))
		return echo, opt[responseFormat]{}
	}
	if v, ok := c.str("text.verbosity", t.Verbosity); ok && v != "medium" {
		c.fail(UnsupportedValue("text.verbosity", "text.verbosity %q is not supported; only \"medium\", the default, is", v))
	}
	if !shape(c, "text.format", "an object", t.Format) {
		return echo, opt[responseFormat]{}
	}
	f := t.Format.V
	rf := responseFormat{Type: f.Type}
	if f.Type.OK && f.Type.V == "json_schema" {
		if s := bytes.TrimSpace(f.Schema); len(s) == 0 || string(s) == "null" {
			// The Responses API requires it (chat's response_format takes none as any JSON).
			c.fail(InvalidParam("text.format.schema", "text.format.schema is required with type json_schema"))
			return echo, opt[responseFormat]{}
		}
		rf.JSONSchema = opt[jsonSchemaFormat]{Set: true, OK: true, V: jsonSchemaFormat{Name: f.Name, Description: f.Description, Schema: f.Schema, Strict: f.Strict}}
	}
	var fm map[string]json.RawMessage
	_ = json.Unmarshal(o.V, &fm)
	echo = json.RawMessage(fmt.Sprintf(`{"format":%s,"verbosity":"medium"}`, compactJSON(fm["format"])))
	return echo, opt[responseFormat]{Set: true, OK: true, V: rf}
}

func compactJSON(v json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return json.RawMessage("null")
	}
	return b.Bytes()
}

// parseMetadata validates metadata: at most 16 string pairs, keys up to 64 characters
// and values up to 512.
func parseMetadata(c *check, o opt[map[string]string]) map[string]string {
	out := map[string]string{}
	if !shape(c, "metadata", "an object of strings", o) {
		return out
	}
	if len(o.V) > maxMetadataKeys {
		c.fail(InvalidParam("metadata", "metadata has %d keys; at most %d are allowed", len(o.V), maxMetadataKeys))
		return out
	}
	for k, v := range o.V {
		if utf8.RuneCountInString(k) > maxMetadataKey || utf8.RuneCountInString(v) > maxMetadataValue {
			c.fail(InvalidParam("metadata", "metadata keys are at most %d characters and values at most %d", maxMetadataKey, maxMetadataValue))
			return out
		}
		out[k] = v
	}
	return out
}

// convertTools validates tools and tool_choice in the Responses shape ({"type":
// "function", "name", "parameters", ...}) and returns them in the chat shape for
// parseTools, with the tools as the response echoes them. Built-in tools are refused by
// name.
func convertTools(c *check, w *ResponsesRequest) ([]json.RawMessage, *chatFeatures) {
	f := &chatFeatures{ParallelToolCalls: w.ParallelToolCalls, flatTools: true}
	echo := []json.RawMessage{}
	if shape(c, "tools", "an array", w.Tools) {
		chat := make([]json.RawMessage, 0, len(w.Tools.V))
		for i, raw := range w.Tools.V {
			var m map[string]json.RawMessage
			if jsonKind(raw) != "an object" || json.Unmarshal(raw, &m) != nil {
				c.fail(InvalidParam("tools", "tools[%d] must be an object", i))
				return echo, f
			}
			var typ string
			_ = json.Unmarshal(m["type"], &typ)
			switch {
			case typ == "function":
			case builtinTools[typ]:
				c.fail(UnsupportedValue("tools", "tools[%d]: the built-in tool %q is not supported; only function tools are", i, typ))
				return echo, f
			default:
				c.fail(InvalidParam("tools", "tools[%d].type must be \"function\"", i))
				return echo, f
			}
			delete(m, "type")
			fn, _ := json.Marshal(m)
			chat = append(chat, json.RawMessage(`{"type":"function","function":`+string(fn)+`}`))
			echo = append(echo, compactJSON(raw))
		}
		f.Tools = opt[[]json.RawMessage]{Set: true, OK: true, V: chat}
	}
	if c.failed() || !w.ToolChoice.Set {
		return echo, f
	}
	tc := w.ToolChoice.V
	if jsonKind(tc) == "an object" {
		var named struct {
			Type string          `json:"type"`
			Name json.RawMessage `json:"name"`
		}
		_ = json.Unmarshal(tc, &named)
		switch {
		case named.Type == "function":
			tc = json.RawMessage(`{"type":"function","function":{"name":` + string(compactJSON(named.Name)) + `}}`)
		case named.Type == "allowed_tools" || builtinTools[named.Type] || strings.HasPrefix(named.Type, "web_search"):
			c.fail(UnsupportedValue("tool_choice", "tool_choice {\"type\": %q} is not supported", named.Type))
			return echo, f
		}
	}
	f.ToolChoice = opt[json.RawMessage]{Set: true, OK: true, V: tc}
	return echo, f
}

// inputRoles are the roles of input messages.
var inputRoles = map[string]bool{"user": true, "assistant": true, "system": true, "developer": true}

// unsupportedItems are item types of OpenAI's that Conveyor does not produce or accept.
var unsupportedItems = map[string]bool{
	"item_reference": true, "reasoning": true, "file_search_call": true, "web_search_call": true, "computer_call": true,
	"computer_call_output": true, "image_generation_call": true, "code_interpreter_call": true, "local_shell_call": true,
	"local_shell_call_output": true, "mcp_list_tools": true, "mcp_approval_request": true, "mcp_approval_response": true,
	"mcp_call": true, "custom_tool_call": true, "custom_tool_call_output": true, "compaction": true,
}

// parseInput validates input: a string (one user message) or an array of items —
// messages, function_call and function_call_output — and returns them as items with ids.
func parseInput(c *check, o opt[json.RawMessage]) []ResponseItem {
	if c.failed() {
		return nil
	}
	if !o.Set {
		c.fail(InvalidParam("input", "input is required"))
		return nil
	}
	switch jsonKind(o.V) {
	case "a string":
		var s string
		_ = json.Unmarshal(o.V, &s)
		return []ResponseItem{{Type: "message", ID: NewID("msg_"), Status: StatusCompleted, Role: "user",
			Content: []ResponseContent{{Type: "input_text", Text: s}}}}
	case "an array":
	default:
		c.fail(InvalidParam("input", "input must be a string or an array of items, got %s", jsonKind(o.V)))
		return nil
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(o.V, &raws); err != nil {
		c.fail(InvalidParam("input", "input is not a valid array: %v", err))
		return nil
	}
	if len(raws) == 0 {
		c.fail(InvalidParam("input", "input must not be empty"))
		return nil
	}
	if len(raws) > MaxInputItems {
		c.fail(InvalidParam("input", "input has %d items; at most %d are allowed", len(raws), MaxInputItems))
		return nil
	}
	out := make([]ResponseItem, 0, len(raws))
	for i, raw := range raws {
		it := parseInputItem(c, fmt.Sprintf("input[%d]", i), raw)
		if c.failed() {
			return nil
		}
		out = append(out, it)
	}
	return out
}

// parseInputItem validates one input item.
func parseInputItem(c *check, name string, raw json.RawMessage) ResponseItem {
	var w inputItem
	if jsonKind(raw) != "an object" || decodeObject(raw, &w) != nil {
		c.fail(InvalidParam(name, "%s must be an object, got %s", name, jsonKind(raw)))
		return ResponseItem{}
	}
	typ, ok := c.str(name+".type", w.Type)
	if !ok && !c.failed() {
		typ = "message" // an easy input message: {role, content}
	}
	id, _ := c.str(name+".id", w.ID)
	c.str(name+".status", w.Status)
	if c.failed() {
		return ResponseItem{}
	}
	required := func(field string, o opt[string]) string {
		v, ok := c.str(name+"."+field, o)
		if !c.failed() && !ok {
			c.fail(InvalidParam(name+"."+field, "%s.%s is required", name, field))
		}
		return v
	}
	switch typ {
	case "message":
		role := required("role", w.Role)
		if !c.failed() && !inputRoles[role] {
			c.fail(InvalidParam(name+".role", "%s.role %q is not one of user, assistant, system, developer", name, role))
		}
		parts := parseInputContent(c, name+".content", w.Content, role)
		if id == "" {
			id = NewID("msg_")
		}
		return ResponseItem{Type: "message", ID: id, Status: StatusCompleted, Role: role, Content: parts}
	case "function_call":
		callID := required("call_id", w.CallID)
		fname := required("name", w.Name)
		args := required("arguments", w.Arguments)
		if id == "" {
			id = NewID("fc_")
		}
		return ResponseItem{Type: "function_call", ID: id, Status: StatusCompleted, CallID: callID, Name: fname, Arguments: &args}
	case "function_call_output":
		callID := required("call_id", w.CallID)
		out := parseCallOutput(c, name+".output", w.Output)
		if id == "" {
			id = NewID("fco_")
		}
		return ResponseItem{Type: "function_call_output", ID: id, Status: StatusCompleted, CallID: callID, Output: &out}
	}
	if unsupportedItems[typ] {
		c.fail(UnsupportedValue(name+".type", "input items of type %q are not supported; only message, function_call and function_call_output are", typ))
	} else {
		c.fail(InvalidParam(name+".type", "%s.type %q is not one of message, function_call, function_call_output", name, typ))
	}
	return ResponseItem{}
}

// parseInputContent validates a message's content: a string or an array of input_text
// (or output_text) parts.
func parseInputContent(c *check, name string, o opt[json.RawMessage], role string) []ResponseContent {
	if c.failed() {
		return nil
	}
	textType := "input_text"
	if role == "assistant" {
		textType = "output_text"
	}
	mk := func(text string) ResponseContent {
		if textType == "output_text" {
			return outputText(text)
		}
		return ResponseContent{Type: textType, Text: text}
	}
	if !o.Set {
		c.fail(InvalidParam(name, "%s is required", name))
		return nil
	}
	var s string
	if jsonKind(o.V) == "a string" && json.Unmarshal(o.V, &s) == nil {
		return []ResponseContent{mk(s)}
	}
	var parts []json.RawMessage
	if jsonKind(o.V) != "an array" || json.Unmarshal(o.V, &parts) != nil {
		c.fail(InvalidParam(name, "%s must be a string or an array of content parts, got %s", name, jsonKind(o.V)))
		return nil
	}
	out := make([]ResponseContent, 0, len(parts))
	for k, raw := range parts {
		pname := fmt.Sprintf("%s[%d]", name, k)
		var p inputPart
		if jsonKind(raw) != "an object" || decodeObject(raw, &p) != nil {
			c.fail(InvalidParam(pname, "%s must be an object, got %s", pname, jsonKind(raw)))
			return nil
		}
		typ, ok := c.str(pname+".type", p.Type)
		switch {
		case c.failed():
			return nil
		case !ok:
			c.fail(InvalidParam(pname+".type", "%s.type is required", pname))
			return nil
		case typ != "input_text" && typ != "output_text":
			c.fail(UnsupportedValue(pname+".type", "content part type %q is not supported; only input_text and output_text are", typ))
			return nil
		}
		text, ok := c.str(pname+".text", p.Text)
		if !c.failed() && !ok {
			c.fail(InvalidParam(pname+".text", "%s.text is required", pname))
		}
		if c.failed() {
			return nil
		}
		out = append(out, mk(text))
	}
	return out
}

// parseCallOutput validates a function_call_output's output: a string or an array of
// input_text parts (joined).
func parseCallOutput(c *check, name string, o opt[json.RawMessage]) string {
	if c.failed() {
		return ""
	}
	if !o.Set {
		c.fail(InvalidParam(name, "%s is required", name))
		return ""
	}
	parts := parseInputContent(c, name, o, "user")
	var sb strings.Builder
	for _, p := range parts {
		sb.WriteString(p.Text)
	}
	return sb.String()
}

// itemsToMessages turns a conversation's items into chat messages: messages as they
// are, function_call items as the tool_calls of an assistant message (joined to the
// assistant message just before them), function_call_output items as tool messages.
// Every function_call_output must answer an earlier function_call; from is the index
// of the first item of this request (for the error's name).
func itemsToMessages(items []ResponseItem, from int) ([]Message, error) {
	var out []Message
	names := map[string]string{} // call_id -> function name
	for i, it := range items {
		switch it.Type {
		case "message":
			var sb strings.Builder
			for _, p := range it.Content {
				sb.WriteString(p.Text)
			}
			out = append(out, Message{Role: it.Role, Content: sb.String()})
		case "function_call":
			names[it.CallID] = it.Name
			args := ""
			if it.Arguments != nil {
				args = *it.Arguments
			}
			tc := ToolCall{ID: it.CallID, Type: "function", Name: it.Name, Arguments: args}
			if n := len(out); n > 0 && out[n-1].Role == "assistant" {
				out[n-1].ToolCalls = append(out[n-1].ToolCalls, tc)
			} else {
				out = append(out, Message{Role: "assistant", ToolCalls: []ToolCall{tc}})
			}
		case "function_call_output":
			name, ok := names[it.CallID]
			if !ok {
				return nil, InvalidParam(fmt.Sprintf("input[%d].call_id", i-from), "no function_call with call_id %q comes before this function_call_output", it.CallID)
			}
			output := ""
			if it.Output != nil {
				output = *it.Output
			}
			out = append(out, Message{Role: "tool", Content: output, ToolCallID: it.CallID, Name: name})
		}
	}
	return out, nil
}
