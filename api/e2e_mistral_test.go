package api

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/conveyor-llm/conveyor/tokenizer"
)

// mistralControl are the control tokens of Mistral's v3 tokenizer that the tool-call
// format uses, added as special tokens after Llama 2's SentencePiece vocabulary (the
// layout of Mistral's tokenizers: the same BPE kind, [TOOL_CALLS] a special token).
var mistralControl = []string{"[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
	"[TOOL_RESULTS]", "[/TOOL_RESULTS]"}

// mistralTemplate is Mistral v3's chat template in its essentials: the tools in
// [AVAILABLE_TOOLS] before the last user turn, calls as [TOOL_CALLS][...].
const mistralTemplate = `{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}` +
	`{% if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}` +
	`[INST]{{ message['content'] }}[/INST]{% elif message['role'] == 'assistant' %}{% if message.tool_calls %}` +
	`[TOOL_CALLS][{% for tc in message.tool_calls %}{{ {'name': tc.function.name, 'arguments': tc.function.arguments}|tojson }}` +
	`{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}` +
	`{% elif message['role'] == 'tool' %}[TOOL_RESULTS]{{ message['content'] }}[/TOOL_RESULTS]{% endif %}{% endfor %}`

// mistralTokenizerDir writes tokenizer files of Mistral's layout into a new directory:
// Llama 2's files with Mistral's control tokens added as special tokens and its template.
func mistralTokenizerDir(t *testing.T) string {
	t.Helper()
	realChatTokenizer(t, "llama2") // skips without the files
	root := os.Getenv("CONVEYOR_TOKENIZER_FILES")
	var tj, cfg map[string]any
	for name, into := range map[string]*map[string]any{"tokenizer.json": &tj, "tokenizer_config.json": &cfg} {
		b, err := os.ReadFile(filepath.Join(root, "llama2", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, into); err != nil {
			t.Fatal(err)
		}
	}
	added := tj["added_tokens"].([]any)
	decoder := cfg["added_tokens_decoder"].(map[string]any)
	for i, content := range mistralControl {
		tokenEntry := map[string]any{"id": 32000 + i, "content": content, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true}
		added = append(added, tokenEntry)
		entry := map[string]any{}
		for k, v := range tokenEntry {
			if k != "id" {
				entry[k] = v
			}
		}
		decoder[jsonInt32(32000+i)] = entry
	}
	tj["added_tokens"] = added
	cfg["chat_template"] = mistralTemplate
	dir := t.TempDir()
	for name, v := range map[string]any{"tokenizer.json": tj, "tokenizer_config.json": cfg} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func jsonInt32(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestE2EMistralToolCalls serves a random model with a tokenizer of Mistral's layout, in
// which [TOOL_CALLS] is a special token: the format is detected from the template, and
// calls come back — under auto (a reply forced to open with [TOOL_CALLS] by logit_bias)
// and under required — as valid tool_calls, plain and streamed.
func TestE2EMistralToolCalls(t *testing.T) {
	src := mistralTokenizerDir(t)
	tok, err := tokenizer.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode("[TOOL_CALLS]", false)
	if err != nil || len(ids) != 1 || !tok.IsSpecial(ids[0]) {
		t.Fatalf("[TOOL_CALLS] encodes to %v (%v), want one special token", ids, err)
	}
	callTok := ids[0]
	client := serveRandomModel(t, src, `{"model_type":"llama","architectures":["LlamaForCausalLM"],"vocab_size":32064,
		"hidden_size":32,"intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,
		"max_position_embeddings":1024,"rms_norm_eps":1e-5,"tie_word_embeddings":true,"bos_token_id":1,"eos_token_id":2}`, "mistral")

	validators := map[string]*jsonschema.Schema{}
	for name, s := range e2eToolParams {
		validators[name] = e2eValidator(t, s)
	}
	base := openai.ChatCompletionNewParams{Model: "mistral", Tools: e2eTools(t), N: openai.Int(2), Seed: openai.Int(5),
		ParallelToolCalls: openai.Bool(false), Temperature: openai.Float(1), MaxCompletionTokens: openai.Int(200),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris?")}}
	auto := base
	auto.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")}
	auto.LogitBias = map[string]int64{jsonInt32(int(callTok)): 100}
	required := base
	required.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}
	for label, p := range map[string]openai.ChatCompletionNewParams{"auto": auto, "required": required} {
		r, err := client.Chat.Completions.New(context.Background(), p)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		for _, c := range r.Choices {
			if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) == 0 {
				t.Fatalf("%s: choice %d: finish %q with %d calls, content %q", label, c.Index, c.FinishReason, len(c.Message.ToolCalls), c.Message.Content)
			}
			for _, call := range c.Message.ToolCalls {
				checkCall(t, validators, call.Function.Name, call.Function.Arguments, "")
			}
		}
		checkStreamedCalls(t, client, p, 2, validators, label+" streamed")
	}
}
