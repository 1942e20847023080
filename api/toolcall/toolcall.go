// Package toolcall knows the formats in which chat models write tool calls: how a
// format's calls look (so that decoding can be constrained to well-formed calls whose
// arguments validate against the tool's parameters), how to find calls in a finished
// reply (Parse) and in one cut short inside a call (ParseCut: the cut call is no call),
// and which format a chat template speaks.
//
// Formats, with vLLM's parser names, one file each that registers the format (its
// detection from the chat template, call layout, trigger and parser): hermes
// (<tool_call>{"name": ..., "arguments": ...}</tool_call>, Qwen2.5, Qwen3 and Hermes
// models), llama3_json ({"name": ..., "parameters": ...}, Llama 3.1 and later, optionally
// after <|python_tag|>), mistral ([TOOL_CALLS][{"name": ..., "arguments": ...}]) and
// generic, for models whose template knows no tools: the whole reply is one {"name":
// ..., "arguments": ...} object. Adding a format is one file and its tests; nothing
// outside this package names a format.
package toolcall

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/conveyor-llm/conveyor/engine/structured"
)

// Tool is one function the model may call.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage // a JSON Schema; empty means any object
}

// Call is one parsed tool call.
type Call struct {
	Name      string
	Arguments string // the arguments object as compact JSON text, as OpenAI returns it
}

// Format is one way of writing tool calls.
type Format struct {
	Name string
	// Prefix, Suffix and Sep surround and separate calls; ArgsKey names the arguments
	// member of a call object; Trigger opens a call in a reply that may also be prose.
	Prefix, Suffix, Sep string
	ArgsKey             string
	Trigger             structured.Trigger
	// DescribeTools: the chat templates of the format know no tools, so the server
	// describes them in a system message.
	DescribeTools bool
	// ControlPrefix: Prefix opens with a token the model's tokenizer makes a control
	// (special) token, which the reply's text must keep for the calls to be found.
	ControlPrefix bool

	// marks are texts whose presence in a chat template means the format (none: the
	// fallback); rank orders the formats when Detect looks for them (lowest first).
	marks []string
	rank  int
	// parse finds the calls in a finished reply (Parse); cut those of a reply cut short
	// (ParseCut). Nil: the bare layout's (one JSON object per call).
	parse func(text string) (content string, calls []Call)
	cut   func(text string) (content string, calls []Call, at int)
}

// formats holds every format, by name; each format's file registers itself.
var formats = map[string]Format{}

// register adds a format; its file calls it from init.
func register(f Format) Format {
	if _, dup := formats[f.Name]; dup {
		panic("toolcall: format " + f.Name + " registered twice")
	}
	formats[f.Name] = f
	return f
}

// byRank returns the formats in Detect's order.
func byRank() []Format {
	out := make([]Format, 0, len(formats))
	for _, f := range formats {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rank < out[j].rank })
	return out
}

// ControlLiterals are the call formats' literals that tokenizers make control tokens
// (Mistral's [TOOL_CALLS]); constrained decoding may emit such a token where its text is
// what the grammar asks for.
var ControlLiterals = []string{"[TOOL_CALLS]"}

// ByName returns the format with vLLM's parser name.
func ByName(name string) (Format, error) {
	if f, ok := formats[name]; ok {
		return f, nil
	}
	var names []string
	for _, f := range byRank() {
		names = append(names, f.Name)
	}
	return Format{}, fmt.Errorf("unknown tool-call format %q (want one of %s)", name, strings.Join(names, ", "))
}

// Detect returns the format a chat template writes calls in, as llama.cpp chooses one:
// by the markers the template itself uses; the fallback (generic) when it has none.
func Detect(template string) Format {
	var fallback Format
	for _, f := range byRank() {
		if len(f.marks) == 0 {
			fallback = f
		}
		for _, m := range f.marks {
			if strings.Contains(template, m) {
				return f
			}
		}
	}
	return fallback
}

// CallSchema returns the JSON Schema of one call object of format f to one of tools
// (the named one when name is set): {"name": <const>, <ArgsKey>: <parameters>}.
func (f Format) CallSchema(tools []Tool, name string) ([]byte, error) {
	var alts []string
	for _, t := range tools {
		if name != "" && t.Name != name {
			continue
		}
		params := bytes.TrimSpace(t.Parameters)
		if len(params) == 0 || string(params) == "null" {
			params = []byte(`{"type":"object"}`)
		}
		n, _ := json.Marshal(t.Name)
		k, _ := json.Marshal(f.ArgsKey)
		alts = append(alts, fmt.Sprintf(`{"type":"object","properties":{"name":{"const":%s},%s:%s},"required":["name",%s],"additionalProperties":false}`,
			n, k, params, k))
	}
	switch len(alts) {
	case 0:
		return nil, fmt.Errorf("no tool named %q", name)
	case 1:
		return []byte(alts[0]), nil
	}
	return []byte(`{"anyOf":[` + strings.Join(alts, ",") + `]}`), nil
}

// Parse finds the calls in a finished reply: the text outside them is content. A reply
// whose call text is malformed (not JSON, no name, arguments not an object) has no
// calls: it is returned whole as content, never an error.
func (f Format) Parse(text string) (content string, calls []Call) {
	if f.parse == nil {
		return parseBare(text, f.ArgsKey)
	}
	return f.parse(text)
}

// ParseCut is Parse for a reply cut short (at max_tokens or the end of the context). A
// call still open at the cut (its opening written, its end not) is no call: at is where
// its text begins, and the calls completed before it come back with the text outside
// them as content; the open call's text is in neither. A cut between two calls leaves
// none open. at < 0 when no call was open, and then it is Parse.
func (f Format) ParseCut(text string) (content string, calls []Call, at int) {
	if f.cut == nil {
		return cutBare(text, f.ArgsKey)
	}
	return f.cut(text)
}

// parseBare reads a reply that is one call object, or several separated by ';' or
// newlines (llama3_json, generic), optionally after <|python_tag|>.
func parseBare(text, argsKey string) (string, []Call) {
	body := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "<|python_tag|>"))
	if !strings.HasPrefix(body, "{") {
		return text, nil
	}
	dec := json.NewDecoder(strings.NewReader(body))
	var calls []Call
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return text, nil
		}
		c, ok := callFrom(string(raw), argsKey)
		if !ok {
			return text, nil
		}
		calls = append(calls, c)
		rest := strings.TrimLeft(body[dec.InputOffset():], " \t\r\n;")
		if rest == "" {
			return "", calls
		}
		if !strings.HasPrefix(rest, "{") {
			return text, nil
		}
		dec = json.NewDecoder(strings.NewReader(rest))
		body = rest
	}
}

// cutBare is ParseCut of the bare layout: a call object that the reply's end cuts
// short (the JSON stops inside it) is the open call.
func cutBare(text, argsKey string) (string, []Call, int) {
	content, calls := parseBare(text, argsKey)
	off := len(text) - len(strings.TrimLeft(text, " \t\r\n"))
	if rest := text[off:]; strings.HasPrefix(rest, "<|python_tag|>") {
		off += len("<|python_tag|>")
		off += len(text[off:]) - len(strings.TrimLeft(text[off:], " \t\r\n"))
	}
	if len(calls) > 0 || !strings.HasPrefix(text[off:], "{") {
		return content, calls, -1 // whole calls, or no call at all
	}
	calls = nil
	for {
		dec := json.NewDecoder(strings.NewReader(text[off:]))
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return "", calls, off // the reply ends inside this object
			}
			return text, nil, -1 // malformed: Parse's answer
		}
		c, ok := callFrom(string(raw), argsKey)
		if !ok {
			return text, nil, -1
		}
		calls = append(calls, c)
		off += int(dec.InputOffset())
		off += len(text[off:]) - len(strings.TrimLeft(text[off:], " \t\r\n;"))
		switch {
		case off == len(text):
			return "", calls, -1
		case text[off] != '{':
			return text, nil, -1 // what follows the calls is not a call: Parse's answer
		}
	}
}

// callFrom reads one call object: a string name and an object of arguments under
// argsKey ("arguments" also accepted for llama3_json, "parameters" for the others).
func callFrom(obj, argsKey string) (Call, bool) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(obj), &m); err != nil {
		return Call{}, false
	}
	var name string
	if err := json.Unmarshal(m["name"], &name); err != nil || name == "" {
		return Call{}, false
	}
	args, ok := m[argsKey]
	if !ok {
		args, ok = m["arguments"]
	}
	if !ok {
		args, ok = m["parameters"]
	}
	if !ok {
		return Call{}, false
	}
	// OpenAI-style string arguments are accepted when they hold an object.
	var s string
	if json.Unmarshal(args, &s) == nil {
		args = json.RawMessage(s)
	}
	var obj2 map[string]any
	if json.Unmarshal(args, &obj2) != nil {
		return Call{}, false
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, args); err != nil {
		return Call{}, false
	}
	return Call{Name: name, Arguments: buf.String()}, true
}
