package api

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// TestE2EGemma3ChatCompletes serves a small random Gemma model with Gemma 3's real
// tokenizer files (262k tokens, its own chat template) and completes a multi-turn chat
// through the official client, streamed and not: the template renders, generation runs
// to max_tokens or end of turn, and structured output works over that vocabulary.
func TestE2EGemma3ChatCompletes(t *testing.T) {
	tok := realChatTokenizer(t, "gemma3")
	src := t.TempDir()
	root := os.Getenv("CONVEYOR_TOKENIZER_FILES")
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(root, "gemma3", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	client := serveRandomModel(t, src, `{"model_type":"gemma","architectures":["GemmaForCausalLM"],"vocab_size":262144,"hidden_size":32,
		"intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16,
		"max_position_embeddings":512,"rms_norm_eps":1e-6,"tie_word_embeddings":true,"bos_token_id":2,"eos_token_id":[1,106]}`, "gemma")

	p := openai.ChatCompletionNewParams{Model: "gemma", MaxCompletionTokens: openai.Int(12), Temperature: openai.Float(0),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Hi there"),
			openai.AssistantMessage("Hello! How can I help?"), openai.UserMessage("Tell me a joke.")}}
	r, err := client.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Choices) != 1 || r.Usage.CompletionTokens == 0 || (r.Choices[0].FinishReason != "length" && r.Choices[0].FinishReason != "stop") {
		t.Fatalf("chat did not complete: %+v", r)
	}
	want, err := tok.EncodeChat([]tokenizer.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi there"},
		{Role: "assistant", Content: "Hello! How can I help?"}, {Role: "user", Content: "Tell me a joke."}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if int(r.Usage.PromptTokens) != len(want) {
		t.Errorf("prompt of %d tokens, the template renders %d", r.Usage.PromptTokens, len(want))
	}
	st := client.Chat.Completions.NewStreaming(context.Background(), p)
	var text string
	for st.Next() {
		for _, c := range st.Current().Choices {
			text += c.Delta.Content
		}
	}
	if err := st.Err(); err != nil || text != r.Choices[0].Message.Content {
		t.Fatalf("streamed %q (%v), want %q", text, err, r.Choices[0].Message.Content)
	}

	js := p
	js.MaxCompletionTokens, js.Temperature, js.Seed, js.N = openai.Int(60), openai.Float(1), openai.Int(4), openai.Int(3)
	js.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}
	r, err = client.Chat.Completions.New(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range r.Choices {
		validates(t, "gemma3 json_object", c.Message.Content, string(c.FinishReason), nil)
	}
}

// serveRandomModel builds a random model of config cfg beside the tokenizer files in
// src and serves it as name on a real port (startE2EModel), returning an official client.
func serveRandomModel(t *testing.T, src, cfg, name string) openai.Client {
	t.Helper()
	tinyModel(t) // initialises ONNX Runtime
	if err := os.WriteFile(filepath.Join(src, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := convert.BuildRandom(filepath.Join(src, "config.json"), dir, 3, convert.Options{}); err != nil {
		t.Fatal(err)
	}
	e := startE2EModel(t, dir, func(c *Config) { c.ModelName = name }, func(c *engine.Config) { c.KVCacheBytes = 4 << 20 })
	return e.client
}
