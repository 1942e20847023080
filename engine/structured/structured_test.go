package structured

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/conveyor-llm/conveyor/tokenizer"
)

// defaultVocab is the default model's tokenizer as a Vocabulary.
func defaultVocab(tb testing.TB) *Vocabulary {
	tb.Helper()
	tok, err := tokenizer.Load(filepath.Join("..", "..", "models", "default"))
	if err != nil {
		tb.Fatal(err)
	}
	return NewVocabulary(tok.VocabSize(), tok.TokenBytes, tok.IsSpecial, tok.EOS())
}

// walk samples one output of c with rng: a uniformly random allowed token each step
// (end of sequence, once allowed, with probability pEOS), up to maxTokens. It returns
// the output's bytes and whether it ended with end of sequence.
func walk(tb testing.TB, c *Constraint, rng *rand.Rand, maxTokens int, pEOS float64) ([]byte, bool) {
	tb.Helper()
	m := c.NewMatcher()
	var out []byte
	for n := 0; n < maxTokens; n++ {
		mask := m.Mask()
		var allowed []int32
		eos := int32(-1)
		for id := int32(0); int(id) < c.vocab.Size(); id++ {
			if Allowed(mask, id) {
				if c.vocab.isEOS(id) {
					eos = id
				} else {
					allowed = append(allowed, id)
				}
			}
		}
		if eos >= 0 && (len(allowed) == 0 || rng.Float64() < pEOS) {
			if !m.Accept(eos) {
				tb.Fatalf("end of sequence was allowed but not accepted after %q", out)
			}
			return out, true
		}
		if len(allowed) == 0 {
			tb.Fatalf("no token allowed after %q, and the value is not complete", out)
		}
		id := allowed[rng.IntN(len(allowed))]
		if !m.Accept(id) {
			tb.Fatalf("token %d (%q) was allowed but not accepted after %q", id, c.vocab.bytes(id), out)
		}
		out = append(out, c.vocab.bytes(id)...)
	}
	return out, false
}

// validator compiles schema with a JSON Schema library written independently of this
// package.
func validator(tb testing.TB, schema string) *jsonschema.Schema {
	tb.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		tb.Fatal(err)
	}
	comp := jsonschema.NewCompiler()
	if err := comp.AddResource("schema.json", doc); err != nil {
		tb.Fatal(err)
	}
	s, err := comp.Compile("schema.json")
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

var testSchemas = []string{
	`{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":120},
	  "email":{"type":["string","null"]},"tags":{"type":"array","items":{"type":"string","enum":["a","b","c d"]},"minItems":1,"maxItems":3}},
	  "required":["name","age"],"additionalProperties":false}`,
	`{"type":"object","properties":{"ok":{"type":"boolean"},"score":{"type":"number"},"kind":{"const":"fixed"},
	  "n":{"type":"integer","exclusiveMinimum":-50,"exclusiveMaximum":1000}},"required":["ok","score","kind","n"]}`,
	`{"$defs":{"node":{"type":"object","properties":{"value":{"type":"integer","minimum":-5,"maximum":5},
	  "children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["value"],"additionalProperties":false}},
	  "$ref":"#/$defs/node"}`,
	`{"anyOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false},
	  {"type":"array","items":{"type":"null"},"maxItems":4},{"type":"string","minLength":2,"maxLength":3}]}`,
	`{"type":"object","properties":{"any":{},"list":{"type":"array"},"obj":{"type":"object"}},"required":["any","list","obj"]}`,
	`{"type":"object","properties":{"x":{"enum":[1,"two",{"k":[3]},null,true]},"y":{"type":"integer","minimum":7,"maximum":7}},"required":["x","y"]}`,
}

// TestRandomWalksValidate samples many outputs of each schema by random walks through
// its constraint over the default tokenizer's vocabulary and validates every finished
// one with an independent JSON Schema validator.
func TestRandomWalksValidate(t *testing.T) {
	vocab := defaultVocab(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for i, schema := range append(testSchemas, generatedSchemas(rand.New(rand.NewPCG(7, 8)), 20)...) {
		g, err := CompileSchema([]byte(schema), true)
		if err != nil {
			t.Fatalf("schema %d: %v\n%s", i, err, schema)
		}
		c := NewConstraint(g, vocab)
		v := validator(t, schema)
		finished := 0
		for w := 0; w < 20; w++ {
			out, done := walk(t, c, rng, 600, 0.5)
			if !done {
				continue
			}
			finished++
			if !utf8.Valid(out) {
				t.Fatalf("schema %d: output %q is not well-formed UTF-8", i, out)
			}
			var inst any
			if err := json.Unmarshal(out, &inst); err != nil {
				t.Fatalf("schema %d: output %q is not JSON: %v", i, out, err)
			}
			inst, _ = jsonschema.UnmarshalJSON(bytes.NewReader(out))
			if err := v.Validate(inst); err != nil {
				t.Fatalf("schema %d: output %q does not validate: %v\n%s", i, out, err, schema)
			}
		}
		if finished < 5 {
			t.Errorf("schema %d: only %d of 20 walks finished", i, finished)
		}
	}
}

// TestJSONObject checks response_format json_object: any object, nothing else.
func TestJSONObject(t *testing.T) {
	c := NewConstraint(CompileJSONObject(), defaultVocab(t))
	rng := rand.New(rand.NewPCG(3, 4))
	finished := 0
	for w := 0; w < 30; w++ {
		out, done := walk(t, c, rng, 800, 0.5)
		if !done {
			continue
		}
		finished++
		var obj map[string]any
		if err := json.Unmarshal(out, &obj); err != nil {
			t.Fatalf("output %q is not a JSON object: %v", out, err)
		}
	}
	if finished < 3 {
		t.Errorf("only %d of 30 walks finished", finished)
	}
	m := c.NewMatcher()
	for _, s := range []string{"[", "x", `"a"`, "1"} {
		if id := tokenFor(c.vocab, s); id >= 0 && Allowed(m.Mask(), id) {
			t.Errorf("%q allowed at the start of a JSON object", s)
		}
	}
}

// tokenFor returns the id of the token whose bytes are s, or -1.
func tokenFor(v *Vocabulary, s string) int32 {
	for id := int32(0); int(id) < v.Size(); id++ {
		if string(v.bytes(id)) == s {
			return id
		}
	}
	return -1
}

// TestUnsupportedKeywords checks that keywords the compiler does not implement are
// refused by name under strict and ignored otherwise.
func TestUnsupportedKeywords(t *testing.T) {
	for _, tc := range []struct{ schema, keyword string }{
		{`{"type":"string","pattern":"^a+$"}`, `"pattern"`},
		{`{"type":"string","format":"date-time"}`, `"format"`},
		{`{"type":"number","minimum":0}`, `"minimum"`},
		{`{"oneOf":[{"type":"string"}]}`, `"oneOf"`},
		{`{"allOf":[{"type":"string"}]}`, `"allOf"`},
		{`{"type":"array","prefixItems":[{"type":"string"}]}`, `"prefixItems"`},
		{`{"type":"object","additionalProperties":{"type":"string"}}`, "additionalProperties"},
		{`{"type":"integer","multipleOf":3}`, `"multipleOf"`},
		{`{"$ref":"https://example.com/s.json"}`, "$ref"},
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["b"]}`, `"b"`},
	} {
		_, err := CompileSchema([]byte(tc.schema), true)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), tc.keyword) {
			t.Errorf("%s: got %v, want ErrUnsupported naming %s", tc.schema, err, tc.keyword)
		}
	}
	if _, err := CompileSchema([]byte(`{"type":"string","pattern":"^a+$","format":"email"}`), false); err != nil {
		t.Errorf("non-strict: %v", err)
	}
	for _, bad := range []string{`[`, `"x"`, `{"type":"strin"}`, `{"type":"array","maxItems":-1}`, `{"enum":[]}`,
		`{"type":"integer","minimum":5,"maximum":4}`, `{"$ref":"#/$defs/missing"}`} {
		if _, err := CompileSchema([]byte(bad), true); !errors.Is(err, ErrBadSchema) {
			t.Errorf("%s: got %v, want ErrBadSchema", bad, err)
		}
	}
}

// TestIntegerRanges checks the bounded-integer grammar against its definition on every
// numeral of a few hundred values around the bounds.
func TestIntegerRanges(t *testing.T) {
	for _, r := range [][2]int{{0, 0}, {-5, 5}, {7, 7}, {13, 250}, {-1000, -37}, {99, 1001}, {-9, 0}} {
		schema := fmt.Sprintf(`{"type":"integer","minimum":%d,"maximum":%d}`, r[0], r[1])
		g, err := CompileSchema([]byte(schema), true)
		if err != nil {
			t.Fatal(err)
		}
		for n := r[0] - 300; n <= r[1]+300; n++ {
			want := n >= r[0] && n <= r[1]
			if got := acceptsBytes(g, fmt.Sprint(n)); got != want {
				t.Fatalf("[%d, %d]: %d accepted = %v", r[0], r[1], n, got)
			}
		}
		if acceptsBytes(g, "007") || acceptsBytes(g, "-0") && r[0] > 0 {
			t.Fatalf("[%d, %d]: leading zeros accepted", r[0], r[1])
		}
	}
}

// TestIntegerBoundsBeyondInt64 checks bounds the float64 conversion of a bound would
// get wrong: past int64 (which overflowed to a dropped bound), past the 16 digits the
// grammar writes (a range with no numeral in it: refused, not silently widened), and
// between 2^53 and 10^16, where a float is not exact.
func TestIntegerBoundsBeyondInt64(t *testing.T) {
	for _, tc := range []struct {
		schema   string
		accepts  []string
		refuses  []string
		badRange bool // no integer the grammar writes: ErrUnsupported (ErrBadSchema for a bound not taken)
	}{
		{schema: `{"type":"integer","minimum":0,"maximum":9223372036854775807}`, accepts: []string{"0", "9999999999999999"}, refuses: []string{"-1"}},
		{schema: `{"type":"integer","minimum":100,"maximum":1e30}`, accepts: []string{"100", "9999999999999999"}, refuses: []string{"99"}},
		{schema: `{"type":"integer","exclusiveMaximum":1e400}`, accepts: []string{"-9999999999999999", "9999999999999999"}},
		{schema: `{"type":"integer","minimum":-1e19,"maximum":-5}`, accepts: []string{"-9999999999999999", "-5"}, refuses: []string{"-4", "0"}},
		{schema: `{"type":"integer","minimum":9007199254740993}`, accepts: []string{"9007199254740993"}, refuses: []string{"9007199254740992"}},
		{schema: `{"type":"integer","maximum":1000000000000000.0000001}`, accepts: []string{"1000000000000000"}, refuses: []string{"1000000000000001"}},
		{schema: `{"type":"integer","minimum":1000000000000000.0000001}`, accepts: []string{"1000000000000001"}, refuses: []string{"1000000000000000"}},
		{schema: `{"type":"integer","exclusiveMinimum":9999999999999998}`, accepts: []string{"9999999999999999"}, refuses: []string{"9999999999999998"}},
		{schema: `{"type":"integer","minimum":1e19}`, badRange: true},
		{schema: `{"type":"integer","minimum":10000000000000000}`, badRange: true},
		{schema: `{"type":"integer","exclusiveMinimum":9223372036854775807}`, badRange: true},
		{schema: `{"type":"integer","exclusiveMaximum":-9223372036854775808}`, badRange: true},
		{schema: `{"type":"integer","minimum":1e308}`, badRange: true},
		{schema: `{"type":"integer","minimum":1e-999999999}`, badRange: true}, // not expanded
	} {
		g, err := CompileSchema([]byte(tc.schema), true)
		if tc.badRange {
			if !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrBadSchema) {
				t.Errorf("%s: got %v, want ErrUnsupported or ErrBadSchema", tc.schema, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.schema, err)
			continue
		}
		for _, n := range tc.accepts {
			if !acceptsBytes(g, n) {
				t.Errorf("%s: %s refused", tc.schema, n)
			}
		}
		for _, n := range tc.refuses {
			if acceptsBytes(g, n) {
				t.Errorf("%s: %s accepted", tc.schema, n)
			}
		}
	}
}

// TestSchemaMatchingNothing: $refs that lead only to each other match no value and are
// refused, in a response format and in a tool call's wrapped schema; a recursive schema
// with a way out is not.
func TestSchemaMatchingNothing(t *testing.T) {
	for _, schema := range []string{`{"$ref":"#"}`, `{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`,
		`{"type":"object","properties":{"x":{"$ref":"#"}},"required":["x"]}`,
		`{"type":"array","items":{"$ref":"#"},"minItems":1}`} {
		if _, err := CompileSchema([]byte(schema), true); !errors.Is(err, ErrBadSchema) || !strings.Contains(err.Error(), "matches no value") {
			t.Errorf("%s: got %v, want ErrBadSchema: matches no value", schema, err)
		}
		if _, err := CompileWrapped("<c>", []byte(schema), "</c>", "", 1, 1, true); !errors.Is(err, ErrBadSchema) {
			t.Errorf("wrapped %s: got %v, want ErrBadSchema", schema, err)
		}
	}
	for _, schema := range []string{`{"type":"object","properties":{"x":{"$ref":"#"}}}`, `{"anyOf":[{"$ref":"#"},{"type":"null"}]}`,
		`{"type":"array","items":{"$ref":"#"}}`} {
		if _, err := CompileSchema([]byte(schema), true); err != nil {
			t.Errorf("%s: %v", schema, err)
		}
	}
}

// acceptsBytes runs s through g byte by byte.
func acceptsBytes(g *Grammar, s string) bool {
	c := NewConstraint(g, NewVocabulary(0, func(int32) []byte { return nil }, func(int32) bool { return false }, nil))
	c.mu.Lock()
	defer c.mu.Unlock()
	id := int32(0)
	for i := 0; i < len(s); i++ {
		if id = c.step(id, s[i]); id == dead {
			return false
		}
	}
	return c.states[id].accepting
}

// generatedSchemas returns n random schemas of the supported kinds.
func generatedSchemas(rng *rand.Rand, n int) []string {
	var gen func(depth int) string
	gen = func(depth int) string {
		k := rng.IntN(9)
		if depth > 2 {
			k = rng.IntN(5)
		}
		switch k {
		case 0:
			return fmt.Sprintf(`{"type":"string","maxLength":%d}`, 1+rng.IntN(8))
		case 1:
			lo := rng.IntN(200) - 100
			return fmt.Sprintf(`{"type":"integer","minimum":%d,"maximum":%d}`, lo, lo+rng.IntN(300))
		case 2:
			return `{"type":"boolean"}`
		case 3:
			return `{"enum":["red","green",3,null]}`
		case 4:
			return `{"type":["number","null"]}`
		case 5, 6:
			var props, req []string
			for i := 0; i < 1+rng.IntN(4); i++ {
				name := fmt.Sprintf("p%d", i)
				props = append(props, fmt.Sprintf(`"%s":%s`, name, gen(depth+1)))
				if rng.IntN(2) == 0 {
					req = append(req, `"`+name+`"`)
				}
			}
			return fmt.Sprintf(`{"type":"object","properties":{%s},"required":[%s],"additionalProperties":false}`,
				strings.Join(props, ","), strings.Join(req, ","))
		case 7:
			return fmt.Sprintf(`{"type":"array","items":%s,"minItems":%d,"maxItems":%d}`, gen(depth+1), rng.IntN(2), 2+rng.IntN(3))
		default:
			return fmt.Sprintf(`{"anyOf":[%s,%s]}`, gen(depth+1), gen(depth+1))
		}
	}
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, gen(0))
	}
	return out
}

func TestMain(m *testing.M) { os.Exit(m.Run()) }

// FuzzCompileSchema feeds arbitrary schemas to the compiler: it never panics, every
// error is ErrBadSchema or ErrUnsupported, and a grammar it returns runs.
func FuzzCompileSchema(f *testing.F) {
	for _, s := range testSchemas {
		f.Add([]byte(s), true)
	}
	for _, s := range []string{`{}`, `true`, `false`, `{"type":"string","maxLength":3}`, `{"$ref":"#"}`,
		`{"anyOf":[{"$ref":"#"},{"type":"null"}]}`, `{"type":"integer","minimum":-3.5,"maximum":2.5}`} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, schema []byte, strict bool) {
		g, err := CompileSchema(schema, strict)
		if err != nil {
			if !errors.Is(err, ErrBadSchema) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("error %v is neither ErrBadSchema nor ErrUnsupported", err)
			}
			return
		}
		acceptsBytes(g, `{"a": [1, "x", null]}`)
		acceptsBytes(g, `"abc"`)
	})
}

// TestCacheShares checks that the cache hands the same constraint to the same schema
// and evicts the least recently used one.
func TestCacheShares(t *testing.T) {
	c := NewCache(defaultVocab(t), 2)
	a1, err := c.Schema([]byte(testSchemas[0]), true)
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := c.Schema([]byte(testSchemas[0]), true)
	if a1 != a2 {
		t.Error("the same schema compiled twice")
	}
	if c.JSONObject() != c.JSONObject() {
		t.Error("json_object compiled twice")
	}
	c.Schema([]byte(testSchemas[1]), true) // evicts schema 0 (json_object was used later)
	if a3, _ := c.Schema([]byte(testSchemas[0]), true); a3 == a1 {
		t.Error("the least recently used schema was not evicted")
	}
	if _, err := c.Schema([]byte(`{"type":"string","pattern":"x"}`), true); !errors.Is(err, ErrUnsupported) {
		t.Errorf("unsupported schema: %v", err)
	}
}

// TestConcurrentMatchers runs walks of one shared Constraint from several goroutines
// (the engine samples while the API compiles and other requests share the schema):
// every finished output still validates. Run under -race by make test.
func TestConcurrentMatchers(t *testing.T) {
	vocab := defaultVocab(t)
	cache := NewCache(vocab, 8)
	v := validator(t, testSchemas[2])
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := cache.Schema([]byte(testSchemas[2]), true)
			if err != nil {
				errs <- err
				return
			}
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for w := 0; w < 5; w++ {
				out, done := walk(t, c, rng, 300, 0.5)
				if !done {
					continue
				}
				inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(out))
				if err == nil {
					err = v.Validate(inst)
				}
				if err != nil {
					errs <- fmt.Errorf("%q: %v", out, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestCompileWrapped checks values wrapped in literals, one or several: every finished
// walk is the literals around values that validate.
func TestCompileWrapped(t *testing.T) {
	schema := `{"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object",
		"properties":{"city":{"type":"string","maxLength":10},"days":{"type":"integer","minimum":1,"maximum":7}},
		"required":["city","days"],"additionalProperties":false}},"required":["name","arguments"],"additionalProperties":false}`
	g, err := CompileWrapped("<tool_call>\n", []byte(schema), "\n</tool_call>", "\n", 1, 3, true)
	if err != nil {
		t.Fatal(err)
	}
	c := NewConstraint(g, defaultVocab(t))
	v := validator(t, schema)
	rng := rand.New(rand.NewPCG(11, 12))
	finished := 0
	for w := 0; w < 30; w++ {
		out, done := walk(t, c, rng, 400, 0.5)
		if !done {
			continue
		}
		finished++
		parts := strings.Split(string(out), "\n</tool_call>")
		if len(parts) < 2 || len(parts) > 4 || parts[len(parts)-1] != "" {
			t.Fatalf("%q: want 1 to 3 wrapped calls", out)
		}
		for i, p := range parts[:len(parts)-1] {
			if i > 0 {
				p = strings.TrimPrefix(p, "\n")
			}
			body, ok := strings.CutPrefix(p, "<tool_call>\n")
			if !ok {
				t.Fatalf("%q: call %d lacks its prefix", out, i)
			}
			inst, err := jsonschema.UnmarshalJSON(strings.NewReader(body))
			if err == nil {
				err = v.Validate(inst)
			}
			if err != nil {
				t.Fatalf("%q: call %d: %v", out, i, err)
			}
		}
	}
	if finished < 5 {
		t.Errorf("only %d of 30 walks finished", finished)
	}
	if _, err := CompileWrapped("a", []byte(`{}`), "b", ",", 2, 1, true); !errors.Is(err, ErrBadSchema) {
		t.Errorf("max < min: %v", err)
	}
}

// TestWrappedLayout: a call grammar takes calls compact or pretty-printed, as models write
// them, and no other layout: a newline and one kind of indentation where a pretty-printer
// breaks lines, one space after a colon, nothing before a colon or a comma, so that a hot
// model cannot spend its tokens on layout.
func TestWrappedLayout(t *testing.T) {
	schema := `{"type":"object","properties":{"name":{"const":"f"},"arguments":{"type":"object",
		"properties":{"x":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["x"]}},
		"required":["name","arguments"],"additionalProperties":false}`
	g, err := CompileWrapped("", []byte(schema), "", "\n", 1, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{
		`{"name":"f","arguments":{"x":1}}`,
		`{"name": "f", "arguments": {"x": 1, "tags": ["a", "b"]}}`,
		"{\n  \"name\": \"f\",\n  \"arguments\": {\n    \"x\": 1,\n    \"tags\": [\n      \"a\"\n    ]\n  }\n}",
		"{\n\t\"name\": \"f\",\n\t\"arguments\": {\"x\": 1}\n}\n{ \"name\": \"f\", \"arguments\": { \"x\": 2 } }",
		"{\n" + strings.Repeat(" ", maxIndent) + `"name":"f","arguments":{"x":1}}`,
	} {
		if !acceptsBytes(g, ok) {
			t.Errorf("refused %q", ok)
		}
	}
	for _, bad := range []string{
		`{  "name":"f","arguments":{"x":1}}`,           // two spaces
		"{\n\n\"name\":\"f\",\"arguments\":{\"x\":1}}", // a blank line
		"{\n" + strings.Repeat(" ", maxIndent+1) + `"name":"f","arguments":{"x":1}}`,
		"{\n" + strings.Repeat("\t", maxIndent+1) + `"name":"f","arguments":{"x":1}}`,
		"{\n \t\"name\":\"f\",\"arguments\":{\"x\":1}}",      // spaces and tabs mixed
		`{"name" :"f","arguments":{"x":1}}`,                  // before a colon
		`{"name":"f" ,"arguments":{"x":1}}`,                  // before a comma
		`{"name":  "f","arguments":{"x":1}}`,                 // two spaces after a colon
		"{\"name\":\n\"f\",\"arguments\":{\"x\":1}}",         // a newline after a colon
		`{"name":"f","arguments":{"x":1,"tags":["a" ,"b"]}}`, // before a comma in an array
		`{"name":"g","arguments":{"x":1}}`,
	} {
		if acceptsBytes(g, bad) {
			t.Errorf("accepted %q", bad)
		}
	}
}
