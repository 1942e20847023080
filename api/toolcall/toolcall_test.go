package toolcall

import (
	"encoding/json"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/conveyor-llm/conveyor/engine/structured"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// TestParseRecordedOutputs runs each format's parser over replies in that format,
// well-formed and not: a malformed call is returned as text, never dropped or an error.
func TestParseRecordedOutputs(t *testing.T) {
	for _, tc := range []struct {
		f       Format
		text    string
		content string
		calls   []Call
	}{
		{Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>", "",
			[]Call{{"get_weather", `{"city":"Paris","days":3}`}}},
		{Hermes, "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
			"Let me check.", []Call{{"a", `{}`}, {"b", `{"x":[1,2]}`}}},
		{Hermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": \"{\\\"q\\\": 1}\"}\n</tool_call>", "", []Call{{"a", `{"q":1}`}}},
		{Hermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": 1}\n</tool_call>", "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": 1}\n</tool_call>", nil},
		{Hermes, "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>", nil},
		{Hermes, "Plain answer.", "Plain answer.", nil},
		{Llama3JSON, `{"name": "get_weather", "parameters": {"city": "Oslo"}}`, "", []Call{{"get_weather", `{"city":"Oslo"}`}}},
		{Llama3JSON, `<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": "v"}}`, "",
			[]Call{{"a", `{}`}, {"b", `{"k":"v"}`}}},
		{Llama3JSON, `{"name": "a", "parameters": {}} and then some prose`, `{"name": "a", "parameters": {}} and then some prose`, nil},
		{Llama3JSON, `{"name": "a", "parameters": [1]}`, `{"name": "a", "parameters": [1]}`, nil},
		{Llama3JSON, "The weather is fine.", "The weather is fine.", nil},
		{Mistral, `[TOOL_CALLS][{"name": "a", "arguments": {"n": 1}}, {"name": "b", "arguments": {}}]`, "",
			[]Call{{"a", `{"n":1}`}, {"b", `{}`}}},
		{Mistral, `[TOOL_CALLS][{"name": "a", "arguments": {"n": 1}`, `[TOOL_CALLS][{"name": "a", "arguments": {"n": 1}`, nil},
		{Generic, ` {"name": "lookup", "arguments": {"term": "x"}} `, "", []Call{{"lookup", `{"term":"x"}`}}},
		{Generic, `{"answer": 1}`, `{"answer": 1}`, nil},
	} {
		content, calls := tc.f.Parse(tc.text)
		if content != tc.content || !reflect.DeepEqual(calls, tc.calls) {
			t.Errorf("%s %q: got %q %+v, want %q %+v", tc.f.Name, tc.text, content, calls, tc.content, tc.calls)
		}
	}
}

// TestDetect picks the format from the markers a template uses.
func TestDetect(t *testing.T) {
	for tpl, want := range map[string]string{
		`{%- if tools %}<tools>{{ tool | tojson }}</tools> ... <tool_call>`:                    "hermes",
		`{{- "Environment: ipython\n" }}{%- if tool_call %}<|python_tag|>{{ tool_call.name }}`: "llama3_json",
		`[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS] ... [TOOL_CALLS]`:                      "mistral",
		`{% for m in messages %}{{ m.content }}{% endfor %}`:                                   "generic",
	} {
		if got := Detect(tpl).Name; got != want {
			t.Errorf("%q: %s, want %s", tpl, got, want)
		}
	}
	if _, err := ByName("pythonic"); err == nil {
		t.Error("unknown format accepted")
	}
}

var testTools = []Tool{
	{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","maxLength":12},
		"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"],"additionalProperties":false}`)},
	{Name: "search", Parameters: json.RawMessage(`{"type":"object","properties":{"query":{"type":"string","maxLength":20},
		"filters":{"type":"object","properties":{"year":{"type":"integer","minimum":1900,"maximum":2030}},"additionalProperties":false}},"required":["query"]}`)},
}

// TestConstrainedCallsParseAndValidate walks the constraint of each format's calls
// over the default tokenizer's vocabulary: every finished reply parses into calls whose
// arguments validate against the called tool's parameters.
func TestConstrainedCallsParseAndValidate(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join("..", "..", "models", "default"))
	if err != nil {
		t.Fatal(err)
	}
	vocab := structured.NewVocabulary(tok.VocabSize(), tok.TokenBytes, tok.IsSpecial, tok.EOS())
	validators := map[string]*jsonschema.Schema{}
	for _, tl := range testTools {
		doc, _ := jsonschema.UnmarshalJSON(strings.NewReader(string(tl.Parameters)))
		c := jsonschema.NewCompiler()
		if err := c.AddResource("p.json", doc); err != nil {
			t.Fatal(err)
		}
		validators[tl.Name], _ = c.Compile("p.json")
	}
	rng := rand.New(rand.NewPCG(21, 22))
	for _, f := range []Format{Hermes, Llama3JSON, Generic} {
		for _, named := range []string{"", "search"} {
			schema, err := f.CallSchema(testTools, named)
			if err != nil {
				t.Fatal(err)
			}
			g, err := structured.CompileWrapped(f.Prefix, schema, f.Suffix, f.Sep, 1, 2, false)
			if err != nil {
				t.Fatalf("%s: %v", f.Name, err)
			}
			c := structured.NewConstraint(g, vocab)
			finished := 0
			for w := 0; w < 25; w++ {
				out, done := walkOut(c, vocab, rng, 400)
				if !done {
					continue
				}
				finished++
				content, calls := f.Parse(out)
				if content != "" || len(calls) == 0 {
					t.Fatalf("%s: %q parses to content %q and %d calls", f.Name, out, content, len(calls))
				}
				for _, call := range calls {
					if named != "" && call.Name != named {
						t.Fatalf("%s: called %s, want %s", f.Name, call.Name, named)
					}
					v := validators[call.Name]
					inst, err := jsonschema.UnmarshalJSON(strings.NewReader(call.Arguments))
					if err == nil && v != nil {
						err = v.Validate(inst)
					}
					if v == nil || err != nil {
						t.Fatalf("%s: call %+v does not validate: %v", f.Name, call, err)
					}
				}
			}
			if finished < 5 {
				t.Errorf("%s %q: only %d of 25 walks finished", f.Name, named, finished)
			}
		}
	}
	if _, err := Generic.CallSchema(testTools, "nope"); err == nil {
		t.Error("a call schema for an unknown tool")
	}
}

// walkOut samples one reply of c: a random allowed token each step, end of sequence
// with probability 1/2 once allowed.
func walkOut(c *structured.Constraint, v *structured.Vocabulary, rng *rand.Rand, max int) (string, bool) {
	m := c.NewMatcher()
	var out []byte
	for n := 0; n < max; n++ {
		mask := m.Mask()
		var allowed []int32
		eos := int32(-1)
		for id := int32(0); int(id) < v.Size(); id++ {
			if structured.Allowed(mask, id) {
				if v.IsEOS(id) {
					eos = id
				} else {
					allowed = append(allowed, id)
				}
			}
		}
		if eos >= 0 && (len(allowed) == 0 || rng.IntN(2) == 0) {
			return string(out), true
		}
		if len(allowed) == 0 {
			return string(out), false
		}
		id := allowed[rng.IntN(len(allowed))]
		m.Accept(id)
		out = append(out, v.Bytes(id)...)
	}
	return string(out), false
}

// TestRegistry: every format is registered once under its vLLM name, Detect falls back
// to generic, and an unknown name lists the registered ones.
func TestRegistry(t *testing.T) {
	for _, f := range []Format{Hermes, Llama3JSON, Mistral, Generic} {
		got, err := ByName(f.Name)
		if err != nil || got.Name != f.Name {
			t.Errorf("ByName(%q) = %q, %v", f.Name, got.Name, err)
		}
	}
	if len(formats) != 4 {
		t.Errorf("%d formats registered, want 4", len(formats))
	}
	if f := Detect("{{ messages }}"); f.Name != "generic" {
		t.Errorf("a template without markers detects %q, want generic", f.Name)
	}
	if _, err := ByName("pythonic"); err == nil || !strings.Contains(err.Error(), "hermes, mistral, llama3_json, generic") {
		t.Errorf("ByName(pythonic): %v", err)
	}
}

// TestRegisteredTexts: a format's control token reaches ControlLiterals and sets
// ControlPrefix, and its lead is skipped by every format read in the bare layout.
func TestRegisteredTexts(t *testing.T) {
	if !reflect.DeepEqual(ControlLiterals, []string{"[TOOL_CALLS]"}) || !Mistral.ControlPrefix || Hermes.ControlPrefix {
		t.Errorf("ControlLiterals %q, Mistral.ControlPrefix %v, Hermes.ControlPrefix %v", ControlLiterals, Mistral.ControlPrefix, Hermes.ControlPrefix)
	}
	for _, f := range []Format{Llama3JSON, Generic} {
		text := "<|python_tag|> {\"name\": \"a\", \"" + f.ArgsKey + "\": {}}"
		if content, calls := f.Parse(text); content != "" || !reflect.DeepEqual(calls, []Call{{"a", "{}"}}) {
			t.Errorf("%s %q: got %q %+v", f.Name, text, content, calls)
		}
		if _, calls, at := f.ParseCut(text[:30]); calls != nil || at != 15 {
			t.Errorf("%s %q cut: got %+v at %d, want the call open at 15", f.Name, text[:30], calls, at)
		}
	}
}

// TestParseCut reads replies cut short: a call open at the cut is neither a call nor
// content, the calls before it stay calls, and a reply cut between calls or in prose
// reads as Parse reads it.
func TestParseCut(t *testing.T) {
	a := `{"name": "a", "arguments": {"n": 1}}`
	for _, tc := range []struct {
		f       Format
		text    string
		content string
		calls   []Call
		at      int // -1: no call open
	}{
		{Hermes, "<tool_call>\n" + a + "\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"argu", "", []Call{{"a", `{"n":1}`}}, 62},
		{Hermes, "<tool_call>\n" + a + "\n</tool_call>\n<tool_", "", []Call{{"a", `{"n":1}`}}, 62},
		{Hermes, "<tool_call>\n" + a + "\n</tool_call>\n", "", []Call{{"a", `{"n":1}`}}, -1},
		{Hermes, "<tool_call>\n" + a + "\n</tool_", "", nil, 0},
		{Hermes, "<tool_call>\n{", "", nil, 0},
		{Hermes, "<tool", "", nil, 0},
		{Hermes, "Let me look. <tool_call>\n{\"na", "Let me look.", nil, 13},
		{Hermes, "Let me look. <tool", "Let me look. <tool", nil, -1}, // prose: a call may not open here
		{Hermes, "A plain answer cut sh", "A plain answer cut sh", nil, -1},
		{Llama3JSON, `{"name": "a", "parameters": {"n": 1}}; {"name": "b", "param`, "", []Call{{"a", `{"n":1}`}}, 39},
		{Llama3JSON, `<|python_tag|>{"name": "a", "para`, "", nil, 14},
		{Llama3JSON, `{"name": "a", "parameters": {"n": 1}}; `, "", []Call{{"a", `{"n":1}`}}, -1},
		{Llama3JSON, "The weather is", "The weather is", nil, -1},
		{Llama3JSON, `{"name": "a", "parameters": {"n": 1}} and prose`, `{"name": "a", "parameters": {"n": 1}} and prose`, nil, -1},
		{Llama3JSON, `{"name": 7, "par`, "", nil, 0}, // cut short: whatever it was, it opened as a call
		{Generic, "{\n  \"name\": \"a\",\n  \"arguments\": {\n    \"n\": 1\n  }\n}\n{\n  \"na", "", []Call{{"a", `{"n":1}`}}, 51},
		{Generic, `{"name": "a", "arguments": {"n": 1}, "x": tru`, "", nil, 0},
		{Mistral, `[TOOL_CALLS][` + a + `, {"name": "b", "argum`, "", []Call{{"a", `{"n":1}`}}, 51},
		{Mistral, `[TOOL_CALLS][` + a + `, `, "", []Call{{"a", `{"n":1}`}}, -1},
		{Mistral, `Sure. [TOOL_CALLS][{"na`, "Sure.", nil, 6},
		{Mistral, `[TOOL_CALLS]`, "", nil, 0},
		{Mistral, `[TOOL_CALLS][` + a + `]`, "", []Call{{"a", `{"n":1}`}}, -1},
	} {
		content, calls, at := tc.f.ParseCut(tc.text)
		if content != tc.content || !reflect.DeepEqual(calls, tc.calls) || at != tc.at {
			t.Errorf("%s %q: got %q %+v at %d, want %q %+v at %d", tc.f.Name, tc.text, content, calls, at, tc.content, tc.calls, tc.at)
		}
	}
}

// TestParseCutPrefixes cuts constrained replies of every format after each byte: the
// calls read are always the first calls of the whole reply, exactly, and no text of a
// call is ever content.
func TestParseCutPrefixes(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join("..", "..", "models", "default"))
	if err != nil {
		t.Fatal(err)
	}
	vocab := structured.NewVocabulary(tok.VocabSize(), tok.TokenBytes, tok.IsSpecial, tok.EOS())
	rng := rand.New(rand.NewPCG(5, 6))
	replies := map[string][]string{"mistral": {`[TOOL_CALLS][{"name": "search", "arguments": {"query": "x"}}, {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}]`}}
	for _, f := range []Format{Hermes, Llama3JSON, Generic} {
		schema, err := f.CallSchema(testTools, "")
		if err != nil {
			t.Fatal(err)
		}
		g, err := structured.CompileWrapped(f.Prefix, schema, f.Suffix, f.Sep, 1, 3, false)
		if err != nil {
			t.Fatal(err)
		}
		c := structured.NewConstraint(g, vocab)
		for len(replies[f.Name]) < 6 {
			if out, done := walkOut(c, vocab, rng, 400); done {
				if _, calls := f.Parse(out); len(calls) > 1 {
					replies[f.Name] = append(replies[f.Name], out)
				}
			}
		}
	}
	for name, outs := range replies {
		f, _ := ByName(name)
		for _, out := range outs {
			_, whole := f.Parse(out)
			for n := 0; n <= len(out); n++ {
				if f.ControlPrefix && n > 0 && n < len(ControlLiterals[0]) {
					continue // [TOOL_CALLS] is one control token: no reply ends inside it
				}
				content, calls, at := f.ParseCut(out[:n])
				if content != "" || len(calls) > len(whole) || (len(calls) > 0 && !reflect.DeepEqual(calls, whole[:len(calls)])) {
					t.Fatalf("%s: %q cut after %d bytes reads as content %q, calls %+v (at %d); the whole reply's calls are %+v",
						f.Name, out, n, content, calls, at, whole)
				}
				if at > n {
					t.Fatalf("%s: cut after %d bytes: open call at %d", f.Name, n, at)
				}
			}
			if _, calls, at := f.ParseCut(out); at >= 0 || !reflect.DeepEqual(calls, whole) {
				t.Fatalf("%s: the whole reply %q reads as cut at %d with calls %+v", f.Name, out, at, calls)
			}
		}
	}
}
