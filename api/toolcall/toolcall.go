package toolcall

import (
	"bytes"
	"encoding/json"
	"fmt"
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
	// register sets it from control.
	ControlPrefix bool

	// control is that token's text ("" when Prefix opens with none).
	control string
	// lead is a text a model may write before its calls in the bare layout, which
	// reading them skips (see bare.go).
	lead string
	// marks are texts whose presence in a chat template means the format (none: the
	// fallback); rank orders the formats when Detect looks for them (lowest first).
	marks []string
	rank  int
	// parse finds the calls in a finished reply (Parse); cut those of a reply cut short
	// (ParseCut). Nil: the bare layout's (one JSON object per call, bare.go).
	parse func(text string) (content string, calls []Call)
	cut   func(text string) (content string, calls []Call, at int)
}

// formats holds every format, by name; each format's file registers itself.
var formats = map[string]Format{}

// register adds a format, and its control token to ControlLiterals and its lead to
// leads; its file calls it when the package is initialised.
func register(f Format) Format {
	if _, dup := formats[f.Name]; dup {
		panic("toolcall: format " + f.Name + " registered twice")
	}
	f.ControlPrefix = f.control != ""
	if f.control != "" {
		ControlLiterals = append(ControlLiterals, f.control)
	}
	if f.lead != "" {
		leads = append(leads, f.lead)
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
// (each format with ControlPrefix adds the token its Prefix opens with); constrained
// decoding may emit such a token where its text is what the grammar asks for.
var ControlLiterals []string

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
// by the markers the template itself uses; the fallback (the format registered without
// marks) when it has none.
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

// callFrom reads one call object: a string name and an object of arguments under
// argsKey, or else under "arguments" or "parameters" (models mix the two up).
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
