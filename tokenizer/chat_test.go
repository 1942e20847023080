package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Real-world chat templates. The expected strings were rendered with Python's jinja2 3.1
// (ImmutableSandboxedEnvironment, trim_blocks and lstrip_blocks, as transformers renders).

const qwenTemplate = `{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
`

const llama2Template = `{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}`

var chatMessages = []Message{
	{Role: "system", Content: "Be brief."},
	{Role: "user", Content: " Hi there "},
	{Role: "assistant", Content: "Hello!"},
	{Role: "user", Content: "Bye"},
}

func chatFixture(t *testing.T, template string) *Tokenizer {
	t.Helper()
	return writeFixture(t, llama2Legacy(), configFixture(t, map[string]any{
		"bos_token": "<s>", "eos_token": "</s>", "chat_template": template,
	}))
}

func TestChatTemplateQwen(t *testing.T) {
	tk := chatFixture(t, qwenTemplate)
	cases := []struct {
		msgs []Message
		gen  bool
		want string
	}{
		{chatMessages, true, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi there <|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"},
		{chatMessages[1:], false, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hi there <|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"},
	}
	for _, c := range cases {
		got, err := tk.ApplyChatTemplate(c.msgs, c.gen)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
}

func TestChatTemplateLlama2(t *testing.T) {
	tk := chatFixture(t, llama2Template)
	cases := []struct {
		msgs []Message
		want string
	}{
		{chatMessages, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi there [/INST] Hello! </s><s>[INST] Bye [/INST]"},
		{chatMessages[1:], "<s>[INST] Hi there [/INST] Hello! </s><s>[INST] Bye [/INST]"},
	}
	for _, c := range cases {
		got, err := tk.ApplyChatTemplate(c.msgs, true)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
	// Two user turns in a row: the template raises.
	_, err := tk.ApplyChatTemplate([]Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}}, true)
	if !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), "Conversation roles must alternate") {
		t.Errorf("err = %v, want ErrTemplate carrying the template's message", err)
	}
}

func TestChatTemplateFilters(t *testing.T) {
	tk := chatFixture(t, "{% for m in messages %}\n  {{ m | tojson }}\n{{ m['content'] | trim }}|{{ m | tojson(indent=2) }}\n{% endfor %}\n")
	got, err := tk.ApplyChatTemplate([]Message{{Role: "user", Content: "é <b>&"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	want := "  {\"role\": \"user\", \"content\": \"é <b>&\"}\né <b>&|{\n  \"role\": \"user\",\n  \"content\": \"é <b>&\"\n}\n"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestChatTemplateFeatures(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "features.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tk := chatFixture(t, string(src))
	got, err := tk.ApplyChatTemplate(chatMessages, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := "<s>[26 Jul 2024] Be brief!\n1/2 HI THERE,\n2/2 BYE\nsystem user assistant user True Be"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	tk = writeFixture(t, llama2Legacy(), `{"bos_token": "<s>", "unk_token": {"content": "<unk>"}, "pad_token": "</s>",
		"chat_template": "{{ bos_token }}|{{ unk_token }}|{{ pad_token }}|{{ eos_token }}"}`)
	if got, err := tk.ApplyChatTemplate(nil, false); err != nil || got != "<s>|<unk>|</s>|" {
		t.Errorf("special token variables = %q, %v", got, err)
	}
	// strftime_now formats the current date with Python directives.
	tk = chatFixture(t, `{{ strftime_now("%Y-%m-%d %b %%") }}`)
	got, err = tk.ApplyChatTemplate(nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, perr := time.Parse("2006-01-02 Jan %", got); perr != nil {
		t.Errorf("strftime_now gave %q: %v", got, perr)
	}
}

func TestChatTemplateTestTokenizer(t *testing.T) {
	tk := loadTest(t)
	got, err := tk.ApplyChatTemplate([]Message{{Role: "system", Content: "Be kind."}, {Role: "user", Content: "Hi"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := "<s><|system|>\nBe kind.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	// The rendered prompt starts with BOS, so EncodeChat does not add another.
	ids, err := tk.EncodeChat([]Message{{Role: "system", Content: "Be kind."}, {Role: "user", Content: "Hi"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := tk.Encode(got, false)
	if !slices.Equal(ids, want) || ids[0] != 1 || ids[1] == 1 {
		t.Errorf("EncodeChat = %v, want %v (one BOS)", ids, want)
	}
}

func TestChatTemplateErrors(t *testing.T) {
	for name, src := range map[string]string{
		"unclosed block":      "{% if messages %}",
		"unknown filter":      "{{ messages | no_such_filter }}",
		"bad expression":      "{{ messages[ }}",
		"call a non-function": "{{ messages() }}",
	} {
		tk := chatFixture(t, src)
		_, err := tk.ApplyChatTemplate(chatMessages, true)
		if !errors.Is(err, ErrTemplate) {
			t.Errorf("%s: err = %v, want ErrTemplate", name, err)
		}
	}
}

func TestChatFallback(t *testing.T) {
	tk := writeFixture(t, llama2Legacy(), "")
	if tk.HasChatTemplate() {
		t.Fatal("HasChatTemplate without a template")
	}
	got, err := tk.ApplyChatTemplate(chatMessages[:2], true)
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|system|>\nBe brief.\n<|user|>\n Hi there \n<|assistant|>\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	got, _ = tk.ApplyChatTemplate(chatMessages[:1], false)
	if want := "<|system|>\nBe brief.\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// The fallback does not write BOS: EncodeChat adds it.
	ids, err := tk.EncodeChat(chatMessages[:1], false)
	if err != nil || len(ids) == 0 || ids[0] != 1 || ids[1] == 1 {
		t.Errorf("EncodeChat(fallback) = %v, %v; want one leading BOS", ids, err)
	}
}

func TestChatTemplateConcurrent(t *testing.T) {
	tk := chatFixture(t, llama2Template)
	want, err := tk.ApplyChatTemplate(chatMessages, true)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				got, err := tk.ApplyChatTemplate(chatMessages, true)
				if err != nil || got != want {
					t.Errorf("concurrent render = %q, %v", got, err)
					return
				}
				if _, err := tk.ApplyChatTemplate(chatMessages[1:2:2], true); err != nil {
					t.Errorf("concurrent render: %v", err)
					return
				}
				if _, err := tk.Encode(got, false); err != nil {
					t.Errorf("concurrent encode: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestChatTemplateInlineConditionals: Jinja's `A if B else C` inside parentheses, list
// items, dict values and call arguments, as Gemma 3's template writes
// `(first_user_prefix if loop.first else "")`. The expected string is Python jinja2's.
func TestChatTemplateInlineConditionals(t *testing.T) {
	tk := chatFixture(t, `{{ bos_token }}{% for m in messages %}{{ '<' + m['role'] + '>\n' + ('Note: ' if loop.first else '') + m['content'] | trim }}{{ ('!' if m['role'] == 'user') }}
{% endfor %}{{ [1 if messages|length > 3 else 2, 3] | join(',') }} {{ {'k': 'a' if false else 'b'}['k'] }} {{ 'x,y'.split(',' if true else ';') | length }}`)
	got, err := tk.ApplyChatTemplate(chatMessages, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := "<s><system>\nNote: Be brief.\n<user>\nHi there!\n<assistant>\nHello!\n<user>\nBye!\n1,3 b 2"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

// TestChatTemplateToolsOrder renders tools, tool calls and tool results: dicts built from
// JSON keep their key order in iteration, keys(), str() and tojson, and a message's
// optional keys are defined only when set. The expected text is Python jinja2's (rendered
// with transformers' tojson, messages and tools as vLLM passes them).
func TestChatTemplateToolsOrder(t *testing.T) {
	tk := chatFixture(t, "{% set p = tools[0].function.parameters.properties %}{% for k, v in p.items() %}{{ k }}={{ v.type }},{% endfor %}|{% for k in p %}{{ k }},{% endfor %}|{{ p.keys() | list }}|{{ p['zeta'] }}|{{ tools[0] | tojson }}|{% for m in messages %}{{ m.tool_calls is defined }},{{ m.name is defined }},{{ m.tool_call_id is defined }};{% endfor %}{{ messages[1].tool_calls[0].function.arguments }}|{{ messages[1].tool_calls[0] | tojson }}|{{ messages[2] | tojson }}")
	tools := []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"zeta":{"type":"string","enum":["b","a"]},"alpha":{"type":"integer"},"Mid":{"type":"number","default":1.5}}}}}`)}
	msgs := []Message{
		{Role: "user", Content: "hi", Name: "ann"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "c1", Type: "function", Function: ToolCallFunction{Name: "f", Arguments: `{"zeta": "x", "alpha": 2, "Mid": [1.0, {"y": 1, "x": null}]}`}}}},
		{Role: "tool", Content: "ok", ToolCallID: "c1"},
	}
	want := "zeta=string,alpha=integer,Mid=number,|zeta,alpha,Mid,|['zeta', 'alpha', 'Mid']|{'type': 'string', 'enum': ['b', 'a']}|{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"zeta\": {\"type\": \"string\", \"enum\": [\"b\", \"a\"]}, \"alpha\": {\"type\": \"integer\"}, \"Mid\": {\"type\": \"number\", \"default\": 1.5}}}}}|False,True,False;True,False,False;False,False,True;{'zeta': 'x', 'alpha': 2, 'Mid': [1.0, {'y': 1, 'x': None}]}|{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"zeta\": \"x\", \"alpha\": 2, \"Mid\": [1.0, {\"y\": 1, \"x\": null}]}}}|{\"role\": \"tool\", \"content\": \"ok\", \"tool_call_id\": \"c1\"}"
	got, err := tk.ApplyChatTemplateWith(msgs, ChatOptions{Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("\n got %q\nwant %q", got, want)
	}
	// The orders are forgotten after the render.
	n := 0
	keyOrders.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Errorf("%d key orders left registered after the render", n)
	}
	if _, err := tk.ApplyChatTemplateWith(msgs, ChatOptions{Tools: []json.RawMessage{json.RawMessage(`{"a":`)}}); !errors.Is(err, ErrTemplate) {
		t.Errorf("invalid tool JSON: err = %v, want ErrTemplate", err)
	}
}

// TestChatTemplateKwargs: ChatOptions.Kwargs are template variables (Qwen3's
// enable_thinking, as vLLM's chat_template_kwargs pass it); the variables the render sets
// itself cannot be replaced, and kwargs that are not an object are refused.
func TestChatTemplateKwargs(t *testing.T) {
	tok := chatFixture(t, `{% if enable_thinking is defined and enable_thinking is false %}<no-think>{% endif %}{{ style.tone if style is defined }}|{% for m in messages %}{{ m.content }}{% endfor %}`)
	msgs := []Message{{Role: "user", Content: "hi"}}
	for _, tc := range []struct{ kwargs, want string }{
		{``, "|hi"},
		{`null`, "|hi"},
		{`{"enable_thinking": false}`, "<no-think>|hi"},
		{`{"enable_thinking": true, "style": {"tone": "dry"}}`, "dry|hi"},
	} {
		got, err := tok.ApplyChatTemplateWith(msgs, ChatOptions{Kwargs: json.RawMessage(tc.kwargs)})
		if err != nil || got != tc.want {
			t.Errorf("kwargs %s: %q, %v; want %q", tc.kwargs, got, err, tc.want)
		}
	}
	for _, bad := range []string{`{"messages": []}`, `{"bos_token": "x"}`, `[1]`, `"x"`} {
		if _, err := tok.ApplyChatTemplateWith(msgs, ChatOptions{Kwargs: json.RawMessage(bad)}); !errors.Is(err, ErrTemplate) {
			t.Errorf("kwargs %s: %v, want ErrTemplate", bad, err)
		}
	}
}

// TestChatTemplateIsFalseIsTheBoolean: `x is false` holds for the boolean false only, as
// in Jinja (Qwen3's `enable_thinking is false`): "true", 1, 0, "" or [] leave thinking on.
func TestChatTemplateIsFalseIsTheBoolean(t *testing.T) {
	tok := chatFixture(t, `{{ 'F' if enable_thinking is false else 'f' }}{{ 'T' if enable_thinking is true else 't' }}`)
	for kwargs, want := range map[string]string{
		`{"enable_thinking": false}`: "Ft", `{"enable_thinking": true}`: "fT", `{"enable_thinking": "true"}`: "ft",
		`{"enable_thinking": 0}`: "ft", `{"enable_thinking": 1}`: "ft", `{"enable_thinking": ""}`: "ft", `{"enable_thinking": []}`: "ft", `{}`: "ft",
	} {
		got, err := tok.ApplyChatTemplateWith(nil, ChatOptions{Kwargs: json.RawMessage(kwargs)})
		if err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", kwargs, got, err, want)
		}
	}
}
