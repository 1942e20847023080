package api

import (
	"testing"

	"github.com/conveyor-llm/conveyor/engine/structured"
)

// TestOpenAIParameterPolicy checks the OpenAI parameters Conveyor does not implement:
// refused with a 400 naming them, or accepted where what they ask for is what Conveyor
// does anyway. Every accepted request reaches the engine; no refused one does.
func TestOpenAIParameterPolicy(t *testing.T) {
	type tc struct {
		path, extra string
		status      int
		param, code string // for a refusal
	}
	refused := func(path, extra, param, code string) tc { return tc{path, extra, 400, param, code} }
	accepted := func(path, extra string) tc { return tc{path, extra, 200, "", ""} }
	cases := []tc{
		accepted(chp, `,"response_format":{"type":"text"}`),
		accepted(cp, `,"response_format":{"type":"text"}`),
		refused(chp, `,"response_format":{"type":"json_object"}`, "response_format", "unsupported_value"),
		refused(chp, `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}`, "response_format", "unsupported_value"),
		refused(cp, `,"response_format":{"type":"json_object"}`, "response_format", "unsupported_value"),
		refused(chp, `,"response_format":{"type":"yaml"}`, "response_format.type", "invalid_value"),
		refused(chp, `,"response_format":{}`, "response_format.type", "invalid_value"),
		refused(chp, `,"response_format":"json"`, "response_format", "invalid_value"),

		accepted(chp, `,"tools":[],"tool_choice":"none","parallel_tool_calls":false`),
		accepted(chp, `,"tool_choice":"auto"`),
		refused(chp, `,"tools":[{"type":"function","function":{"name":"f g"}}]`, "tools", "invalid_value"),
		refused(chp, `,"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]`, "tools", "invalid_value"),
		refused(chp, `,"tools":[{"type":"function","function":{"name":"f","parameters":[1]}}]`, "tools", "invalid_value"),
		refused(chp, `,"tools":[{"type":"code","function":{"name":"f"}}]`, "tools", "invalid_value"),
		refused(chp, `,"tool_choice":"required"`, "tool_choice", "invalid_value"),
		refused(chp, `,"tools":[{"type":"function","function":{"name":"f","strict":true,"parameters":{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}}}]`, "tools", "unsupported_value"),
		refused(chp, `,"tool_choice":{"type":"function","function":{"name":"f"}}`, "tool_choice", "invalid_value"),
		refused(chp, `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}`, "tool_choice", "invalid_value"),
		refused(chp, `,"tool_choice":"sometimes"`, "tool_choice", "invalid_value"),
		refused(chp, `,"tools":{}`, "tools", "invalid_value"),
		accepted(chp, `,"functions":[],"function_call":"none"`),
		refused(chp, `,"functions":[{"name":"f"}]`, "functions", "unsupported_parameter"),
		refused(chp, `,"function_call":{"name":"f"}`, "function_call", "unsupported_value"),
		refused(chp, `,"parallel_tool_calls":"yes"`, "parallel_tool_calls", "invalid_value"),

		accepted(chp, `,"modalities":["text"]`),
		refused(chp, `,"modalities":["text","audio"]`, "modalities", "unsupported_value"),
		refused(chp, `,"modalities":["video"]`, "modalities", "invalid_value"),
		refused(chp, `,"audio":{"voice":"alloy","format":"wav"}`, "audio", "unsupported_parameter"),
		refused(chp, `,"prediction":{"type":"content","content":"x"}`, "prediction", "unsupported_parameter"),
		refused(chp, `,"web_search_options":{}`, "web_search_options", "unsupported_parameter"),
		refused(chp, `,"moderation":{"model":"m"}`, "moderation", "unsupported_parameter"),
		accepted(chp, `,"reasoning_effort":"none","verbosity":"medium"`),
		refused(chp, `,"reasoning_effort":"high"`, "reasoning_effort", "unsupported_value"),
		refused(chp, `,"verbosity":"low"`, "verbosity", "unsupported_value"),

		accepted(chp, `,"store":false,"metadata":{"k":"v"},"user":"u","safety_identifier":"s","service_tier":"auto"`),
		accepted(chp, `,"prompt_cache_key":"k","prompt_cache_retention":"24h","prompt_cache_options":{"mode":"explicit"}`),
		accepted(chp, `,"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false}`),
		refused(chp, `,"store":true`, "store", "unsupported_value"),
		refused(chp, `,"metadata":{"k":1}`, "metadata", "invalid_value"),
		refused(chp, `,"service_tier":5`, "service_tier", "invalid_value"),
		refused(chp, `,"prompt_cache_retention":"forever"`, "prompt_cache_retention", "invalid_value"),
		refused(chp, `,"stream":true,"stream_options":{"include_obfuscation":1}`, "stream_options.include_obfuscation", "invalid_value"),

		accepted(cp, `,"suffix":""`),
		refused(cp, `,"suffix":"tail"`, "suffix", "unsupported_parameter"),
		// Members that are not OpenAI parameters are ignored, and names match exactly.
		accepted(cp, `,"tools":[{"type":"function"}],"Suffix":"tail","RESPONSE_FORMAT":{"type":"json_object"}`),
		accepted(chp, `,"Tools":[{"type":"function"}],"nonsense":{"x":1}`),
	}
	for _, c := range cases {
		eng := newFakeEngine()
		s := newTestServer(t, eng, nil)
		body := comp(`,"max_tokens":1` + c.extra)
		if c.path == chp {
			body = chat(`,"max_tokens":1` + c.extra)
		}
		rec := do(t, s.Handler(), "POST", c.path, body)
		if rec.Code != c.status {
			t.Errorf("%s %s: status %d, want %d: %s", c.path, c.extra, rec.Code, c.status, rec.Body)
			continue
		}
		if c.status != 200 {
			e := errorObject(t, rec.Body.Bytes())
			if e["param"] != c.param || e["code"] != c.code || e["type"] != "invalid_request_error" {
				t.Errorf("%s %s: error %v, want param %s, code %s", c.path, c.extra, e, c.param, c.code)
			}
			if len(eng.reqs) != 0 {
				t.Errorf("%s %s: a refused request reached the engine", c.path, c.extra)
			}
		}
	}
}

// TestMemberNamesAreCaseSensitive checks that "Stream" and "MAX_TOKENS" are not stream
// and max_tokens (encoding/json alone would match them) but unknown members, ignored.
func TestMemberNamesAreCaseSensitive(t *testing.T) {
	eng := newFakeEngine()
	s := newTestServer(t, eng, nil)
	rec := do(t, s.Handler(), "POST", cp, comp(`,"Stream":true,"MAX_TOKENS":2,"Temperature":"hot"`))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, %s: %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	if p := eng.lastRequest().Params; p.MaxTokens != 16 || p.Temperature != 1 {
		t.Fatalf("case-folded members were read: %+v", p)
	}
	rec = do(t, s.Handler(), "POST", chp, chatMsgs(`[{"Role":"user","content":"x"}]`))
	if e := errorObject(t, rec.Body.Bytes()); rec.Code != 400 || e["param"] != "messages[0].role" {
		t.Fatalf("a message's Role was read as role: %d %v", rec.Code, e)
	}
}

// TestResponseFormatParsing checks response_format against a backend that serves
// structured output: the JSON formats reach the engine as a constraint, text as none,
// and every malformed or unsupported part is a 400 naming it.
func TestResponseFormatParsing(t *testing.T) {
	type tc struct {
		path, extra string
		status      int
		constrained bool
		param, code string
	}
	rf := func(v string) string { return `,"response_format":` + v }
	schema := func(s string) string {
		return rf(`{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":` + s + `}}`)
	}
	for _, c := range []tc{
		{chp, rf(`{"type":"text"}`), 200, false, "", ""},
		{chp, rf(`{"type":"json_object"}`), 200, true, "", ""},
		{cp, rf(`{"type":"json_object"}`), 200, true, "", ""},
		{chp, schema(`{"type":"object","properties":{"a":{"type":"integer"}}}`), 200, true, "", ""},
		{cp, rf(`{"type":"json_schema","json_schema":{"name":"no-schema"}}`), 200, true, "", ""},
		{chp, rf(`{"type":"json_schema","json_schema":{"name":"x","strict":false,"schema":{"type":"string","pattern":"a"}}}`), 200, true, "", ""},
		{chp, schema(`{"type":"string","pattern":"a"}`), 400, false, "response_format.json_schema.schema", "unsupported_value"},
		{chp, schema(`{"type":"strin"}`), 400, false, "response_format.json_schema.schema", "invalid_value"},
		{chp, schema(`[1]`), 400, false, "response_format.json_schema.schema", "invalid_value"},
		{chp, rf(`{"type":"json_schema"}`), 400, false, "response_format.json_schema", "invalid_value"},
		{chp, rf(`{"type":"json_schema","json_schema":{"schema":{}}}`), 400, false, "response_format.json_schema.name", "invalid_value"},
		{chp, rf(`{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}`), 400, false, "response_format.json_schema.name", "invalid_value"},
		{chp, rf(`{"type":"json_schema","json_schema":{"name":"a","strict":"yes","schema":{}}}`), 400, false, "response_format.json_schema.strict", "invalid_value"},
	} {
		eng := newFakeEngine()
		s := newTestServer(t, eng, nil)
		vocab := structured.NewVocabulary(fakeTokenizer{}.VocabSize(), func(id int32) []byte { return []byte{byte(id)} }, func(int32) bool { return false }, []int32{0})
		s.SetBackend(Backend{Engine: eng, Tokenizer: fakeTokenizer{}, MaxModelLen: testMaxLen, Formats: structured.NewCache(vocab, 4)})
		body := comp(`,"max_tokens":1` + c.extra)
		if c.path == chp {
			body = chat(`,"max_tokens":1` + c.extra)
		}
		rec := do(t, s.Handler(), "POST", c.path, body)
		if rec.Code != c.status {
			t.Errorf("%s %s: status %d, want %d: %s", c.path, c.extra, rec.Code, c.status, rec.Body)
			continue
		}
		if c.status != 200 {
			if e := errorObject(t, rec.Body.Bytes()); e["param"] != c.param || e["code"] != c.code {
				t.Errorf("%s: error %v, want param %s code %s", c.extra, e, c.param, c.code)
			}
			continue
		}
		if got := eng.lastRequest().Params.Constraint != nil; got != c.constrained {
			t.Errorf("%s: constrained %v, want %v", c.extra, got, c.constrained)
		}
	}
}
