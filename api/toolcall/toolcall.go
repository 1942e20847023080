// Package toolcall knows the formats in which chat models write tool calls: how a
// format's calls look (so that decoding can be constrained to well-formed calls whose
// arguments validate against the tool's parameters), how to find calls in a finished
// reply, and which format a chat template speaks.
//
// Formats, with vLLM's parser names: hermes (<tool_call>{"name": ..., "arguments": ...}</tool_call>,
// Qwen2.5, Qwen3 and Hermes models), llama3_json ({"name": ..., "parameters": ...}, Llama
// 3.1 and later, optionally after <|python_tag|>), mistral ([TOOL_CALLS][{"name": ...,
// "arguments": ...}]) and generic, for models whose template knows no tools: the whole
// reply is one {"name": ..., "arguments": ...} object.
package toolcall

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
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
	parse         func(text string) (content string, calls []Call, ok bool)
}

// ControlLiterals are the call formats' literals that tokenizers make control tokens
// (Mistral's [TOOL_CALLS]); constrained decoding may emit such a token where its text is
// what the grammar asks for.
var ControlLiterals = []string{"[TOOL_CALLS]"}

// Formats by name.
var (
	Hermes = Format{Name: "hermes", Prefix: "<tool_call>\n", Suffix: "\n</tool_call>", Sep: "\n", ArgsKey: "arguments",
		Trigger: structured.Trigger{Text: "<tool_call>"}}
	Llama3JSON = Format{Name: "llama3_json", ArgsKey: "parameters", Sep: "; ", Trigger: structured.Trigger{Text: "{", AtStart: true}}
	Mistral    = Format{Name: "mistral", Prefix: "[TOOL_CALLS][", Suffix: "]", Sep: ", ", ArgsKey: "arguments",
		Trigger: structured.Trigger{Text: "[TOOL_CALLS]"}, ControlPrefix: true}
	Generic = Format{Name: "generic", ArgsKey: "arguments", Sep: "\n", Trigger: structured.Trigger{Text: "{", AtStart: true},
		DescribeTools: true}
)

// ByName returns the format with vLLM's parser name.
func ByName(name string) (Format, error) {
	for _, f := range []Format{Hermes, Llama3JSON, Mistral, Generic} {
		if f.Name == name {
			return f, nil
		}
	}
	return Format{}, fmt.Errorf("unknown tool-call format %q (want hermes, llama3_json, mistral or generic)", name)
}

// Detect returns the format a chat template writes calls in, as llama.cpp chooses one:
// by the markers the template itself uses; generic when it has none.
func Detect(template string) Format {
	switch {
	case strings.Contains(template, "<tool_call>"):
		return Hermes
	case strings.Contains(template, "[TOOL_CALLS]"):
		return Mistral
	case strings.Contains(template, "<|python_tag|>") || strings.Contains(template, "Environment: ipython"):
		return Llama3JSON
	}
	return Generic
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
	switch f.Name {
	case "hermes":
		return parseHermes(text)
	case "mistral":
		return parseMistral(text)
	default:
		return parseBare(text, f.ArgsKey)
	}
}

var hermesCall = regexp.MustCompile(`(?s)<tool_call>\s*(.*?)\s*</tool_call>`)

func parseHermes(text string) (string, []Call) {
	matches := hermesCall.FindAllStringSubmatchIndex(text, -1)
	if len(matches) == 0 {
		return text, nil
	}
	var calls []Call
	for _, m := range matches {
		c, ok := callFrom(text[m[2]:m[3]], "arguments")
		if !ok {
			return text, nil
		}
		calls = append(calls, c)
	}
	content := strings.TrimSpace(hermesCall.ReplaceAllString(text, ""))
	return content, calls
}

func parseMistral(text string) (string, []Call) {
	i := strings.Index(text, "[TOOL_CALLS]")
	if i < 0 {
		return text, nil
	}
	var raw []json.RawMessage
	dec := json.NewDecoder(strings.NewReader(text[i+len("[TOOL_CALLS]"):]))
	if err := dec.Decode(&raw); err != nil || len(raw) == 0 {
		return text, nil
	}
	var calls []Call
	for _, r := range raw {
		c, ok := callFrom(string(r), "arguments")
		if !ok {
			return text, nil
		}
		calls = append(calls, c)
	}
	return strings.TrimSpace(text[:i]), calls
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
