package api

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// chatRefCase is a case of tokenizer/testdata/chat_refs.json (written by
// tokenizer/testdata/gen_chat_refs.py): messages as the OpenAI API sends them and the text
// Python's jinja2 renders with the family's real chat template.
type chatRefCase struct {
	Family              string            `json:"family"`
	Name                string            `json:"name"`
	AddGenerationPrompt bool              `json:"add_generation_prompt"`
	Messages            json.RawMessage   `json:"messages"`
	Tools               []json.RawMessage `json:"tools"`
	Text                *string           `json:"text"`
}

// realChatTokenizer loads the real tokenizer files of family from
// $CONVEYOR_TOKENIZER_FILES, skipping the test when they are absent.
func realChatTokenizer(t *testing.T, family string) *tokenizer.Tokenizer {
	t.Helper()
	root := os.Getenv("CONVEYOR_TOKENIZER_FILES")
	if root == "" {
		t.Skip("CONVEYOR_TOKENIZER_FILES is not set")
	}
	dir := filepath.Join(root, family)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("no %s tokenizer files: %v", family, err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func chatRefCaseNamed(t *testing.T, family, name string, gen bool) chatRefCase {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", "chat_refs.json"))
	if err != nil {
		t.Fatal(err)
	}
	var refs struct {
		Cases []chatRefCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &refs); err != nil {
		t.Fatal(err)
	}
	for _, c := range refs.Cases {
		if c.Family == family && c.Name == name && c.AddGenerationPrompt == gen {
			if c.Text == nil {
				t.Fatalf("chat_refs.json: %s/%s raises", family, name)
			}
			return c
		}
	}
	t.Fatalf("chat_refs.json has no case %s/%s (gen=%v)", family, name, gen)
	return chatRefCase{}
}

// TestTokenizeChatHistoryMatchesPython posts histories with tool calls, tool results,
// names and content parts to /tokenize with the real tokenizer files and requires exactly
// the ids of encoding the text Python's jinja2 renders (transformers' apply_chat_template,
// tool call arguments parsed as vLLM does).
func TestTokenizeChatHistoryMatchesPython(t *testing.T) {
	for _, tc := range []struct {
		family, name string
		gen          bool
	}{
		{"qwen3", "tool_history_no_tools", true},
		{"qwen3", "tool_history_no_tools", false},
		{"qwen3", "user_name", true},
		{"llama3_1", "tool_history_no_tools", true},
		{"gemma3", "content_parts", true}, // gemma3's template iterates over content: parts
	} {
		t.Run(tc.family+"/"+tc.name, func(t *testing.T) {
			tok := realChatTokenizer(t, tc.family)
			c := chatRefCaseNamed(t, tc.family, tc.name, tc.gen)
			if len(c.Tools) != 0 {
				t.Fatalf("%s has tools, which the API refuses", tc.name)
			}
			s := newTestServer(t, nil, nil)
			s.SetBackend(Backend{Engine: newFakeEngine(), Tokenizer: openai.NewTokenizer(tok), MaxModelLen: 1 << 16})
			body := `{"messages":` + string(c.Messages) + `,"add_generation_prompt":` + map[bool]string{true: "true", false: "false"}[tc.gen] + `}`
			rec := do(t, s.Handler(), "POST", "/tokenize", body)
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			var got struct{ Tokens []int32 }
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			want, err := tok.Encode(*c.Text, false)
			if err != nil {
				t.Fatal(err)
			}
			if !equalIDs(got.Tokens, want) {
				t.Fatalf("/tokenize = %v\nwant %v (the ids of %q)", got.Tokens, want, *c.Text)
			}
			if strings.Contains(tc.name, "tool") && !strings.Contains(*c.Text, "get_weather") && tc.family == "qwen3" {
				t.Fatalf("the reference does not render the tool call: %q", *c.Text)
			}
		})
	}
}

// TestChatToolCallsValidation: malformed tool_calls are a 400 naming them; non-empty tools
// are still refused.
func TestChatToolCallsValidation(t *testing.T) {
	eng := newFakeEngine()
	eng.maxLen = 256 // the history below renders its call into the assistant turn
	s := newTestServer(t, eng, nil)
	for _, tc := range []struct{ body, want string }{
		{`{"model":"test-model","messages":[{"role":"assistant","tool_calls":{}}]}`, "messages[0].tool_calls must be an array"},
		{`{"model":"test-model","messages":[{"role":"assistant","tool_calls":[1]}]}`, "messages[0].tool_calls[0] must be an object"},
		{`{"model":"test-model","messages":[{"role":"assistant","tool_calls":[{"type":"function"}]}]}`, "function is required"},
		{`{"model":"test-model","messages":[{"role":"assistant","tool_calls":[{"type":"x","function":{"name":"f"}}]}]}`, "tool_calls[0].type must be"},
		{`{"model":"test-model","messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]}`, "function.name is required"},
		{`{"model":"test-model","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":1}}]}]}`, "function.arguments must be a string"},
		{`{"model":"test-model","messages":[{"role":"tool","content":"x","tool_call_id":5}]}`, "messages[0].tool_call_id must be a string"},
		{`{"model":"test-model","messages":[{"role":"tool","content":"x"}]}`, "messages[0].tool_call_id is required"},
		{`{"model":"test-model","messages":[{"role":"user","content":[]}]}`, "messages[0].content must not be an empty array"},
		{`{"model":"test-model","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"sometimes"}`, "tool_choice"},
	} {
		rec := do(t, s.Handler(), "POST", "/v1/chat/completions", tc.body)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%s: status %d %s, want 400 carrying %q", tc.body, rec.Code, rec.Body, tc.want)
		}
	}
	ok := `{"model":"test-model","max_tokens":1,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[]}`
	if rec := do(t, s.Handler(), "POST", "/v1/chat/completions", ok); rec.Code != http.StatusOK {
		t.Errorf("a history with tool calls: status %d %s", rec.Code, rec.Body)
	}
}

// TestTokenizeTextsMatchReferences posts every text of the tokenizer corpus
// (tokenizer/testdata/hf_refs.json: 307 texts, ids from an independent implementation
// of the Hugging Face tokenizers) to /tokenize with each family's real tokenizer files:
// the ids must be the reference's, special tokens added as the files say.
func TestTokenizeTextsMatchReferences(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", "hf_refs.json"))
	if err != nil {
		t.Fatal(err)
	}
	var refs struct {
		AddSpecialTokens bool                 `json:"add_special_tokens"`
		Texts            []string             `json:"texts"`
		IDs              map[string][][]int32 `json:"ids"`
	}
	if err := json.Unmarshal(raw, &refs); err != nil {
		t.Fatal(err)
	}
	for family, want := range refs.IDs {
		t.Run(family, func(t *testing.T) {
			tok := realChatTokenizer(t, family)
			s := newTestServer(t, nil, nil)
			s.SetBackend(Backend{Engine: newFakeEngine(), Tokenizer: openai.NewTokenizer(tok), MaxModelLen: 1 << 20})
			for i, text := range refs.Texts {
				body, _ := json.Marshal(map[string]any{"prompt": text, "add_special_tokens": refs.AddSpecialTokens})
				rec := do(t, s.Handler(), "POST", "/tokenize", string(body))
				if rec.Code != http.StatusOK {
					if len(want[i]) == 0 && rec.Code == http.StatusBadRequest {
						continue // an empty prompt is a 400, as the completions endpoint answers it
					}
					t.Fatalf("text %d: status %d: %s", i, rec.Code, rec.Body)
				}
				var got struct {
					Tokens []int32 `json:"tokens"`
				}
				if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
					t.Fatal(err)
				}
				if !slicesEqual(got.Tokens, want[i]) {
					t.Fatalf("text %d %q: /tokenize gives %v, want %v", i, text, got.Tokens, want[i])
				}
			}
		})
	}
}

func slicesEqual(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTemplateRaiseIs400 sends Gemma 3's template a conversation it refuses (roles must
// alternate): the answer is a 400 carrying the template's own message, on the chat
// endpoint and /tokenize alike.
func TestTemplateRaiseIs400(t *testing.T) {
	tok := realChatTokenizer(t, "gemma3")
	s := newTestServer(t, nil, nil)
	s.SetBackend(Backend{Engine: newFakeEngine(), Tokenizer: openai.NewTokenizer(tok), MaxModelLen: 4096})
	msgs := `[{"role":"user","content":"a"},{"role":"user","content":"b"}]`
	for _, req := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"test-model","max_tokens":1,"messages":` + msgs + `}`},
		{"/tokenize", `{"messages":` + msgs + `}`},
	} {
		rec := do(t, s.Handler(), "POST", req.path, req.body)
		e := errorObject(t, rec.Body.Bytes())
		if rec.Code != http.StatusBadRequest || !strings.Contains(e["message"].(string), "alternate") {
			t.Errorf("%s: status %d, error %v; want a 400 carrying the template's message", req.path, rec.Code, e)
		}
	}
}

// TestChatTemplateKwargs: chat_template_kwargs reach the model's template as vLLM passes
// them — Qwen3's {"enable_thinking": false} opens the reply with an empty think block —
// in chat and /tokenize alike; a member the server sets itself, or kwargs that are not an
// object, are a 400 naming chat_template_kwargs.
func TestChatTemplateKwargs(t *testing.T) {
	tok := realChatTokenizer(t, "qwen3")
	eng := newFakeEngine()
	eng.vocab = tok.VocabSize()
	s := newTestServer(t, nil, nil)
	s.SetBackend(Backend{Engine: eng, Tokenizer: openai.NewTokenizer(tok), MaxModelLen: 1 << 16})
	h := s.Handler()
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	render := func(extra string) string {
		rec := do(t, h, "POST", "/tokenize", `{`+msgs+extra+`}`)
		if rec.Code != 200 {
			t.Fatalf("/tokenize %s: %d %s", extra, rec.Code, rec.Body)
		}
		var got struct{ Tokens []int32 }
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		return tok.Decode(got.Tokens, false)
	}
	thinking, plain := render(""), render(`,"chat_template_kwargs":{"enable_thinking":false}`)
	if strings.Contains(thinking, "<think>") || !strings.HasSuffix(plain, "<|im_start|>assistant\n<think>\n\n</think>\n\n") {
		t.Fatalf("default %q\nenable_thinking false %q", thinking, plain)
	}
	rec := do(t, h, "POST", "/v1/chat/completions", `{"model":"test-model","max_tokens":1,`+msgs+`,"chat_template_kwargs":{"enable_thinking":false}}`)
	if rec.Code != 200 || !strings.HasSuffix(tok.Decode(eng.lastRequest().Prompt, false), "</think>\n\n") {
		t.Fatalf("chat: %d %s", rec.Code, rec.Body)
	}
	for _, bad := range []string{`{"messages":[]}`, `[1]`} {
		rec := do(t, h, "POST", "/v1/chat/completions", `{"model":"test-model",`+msgs+`,"chat_template_kwargs":`+bad+`}`)
		if rec.Code != 400 || errorObject(t, rec.Body.Bytes())["param"] != "chat_template_kwargs" {
			t.Errorf("chat_template_kwargs %s: %d %s", bad, rec.Code, rec.Body)
		}
	}
}
