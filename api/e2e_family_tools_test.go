package api

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// TestE2EFamilyToolCallsAuto serves random models carrying Qwen3's and Llama 3.1's real
// tokenizer files and chat templates, and forces each reply under tool_choice auto to
// open a call with logit_bias — on <tool_call> for Qwen3 (hermes), on `{"` and on `{\n`
// (the opening of pretty-printed JSON) for Llama 3.1 (llama3_json): every reply must end
// with finish_reason tool_calls and calls that validate, plain and streamed.
func TestE2EFamilyToolCallsAuto(t *testing.T) {
	validators := map[string]*jsonschema.Schema{}
	for name, s := range e2eToolParams {
		validators[name] = e2eValidator(t, s)
	}
	for _, fam := range []struct {
		family, cfg string
		openings    []int
	}{
		{"qwen3", `{"model_type":"qwen3","architectures":["Qwen3ForCausalLM"],"vocab_size":151936,"hidden_size":32,
			"intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16,
			"max_position_embeddings":2048,"rms_norm_eps":1e-6,"rope_theta":1000000,"tie_word_embeddings":true,
			"bos_token_id":151643,"eos_token_id":[151645,151643]}`, []int{151657}},
		{"llama3_1", `{"model_type":"llama","architectures":["LlamaForCausalLM"],"vocab_size":128256,"hidden_size":32,
			"intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,
			"max_position_embeddings":2048,"rms_norm_eps":1e-5,"rope_theta":500000,"tie_word_embeddings":true,
			"bos_token_id":128000,"eos_token_id":[128001,128008,128009]}`, []int{5018, 517}},
	} {
		t.Run(fam.family, func(t *testing.T) {
			realChatTokenizer(t, fam.family) // skips without the files
			src := t.TempDir()
			for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
				b, err := os.ReadFile(filepath.Join(os.Getenv("CONVEYOR_TOKENIZER_FILES"), fam.family, name))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			client := serveRandomModel(t, src, fam.cfg, fam.family)
			for _, open := range fam.openings {
				p := openai.ChatCompletionNewParams{Model: fam.family, Tools: e2eTools(t), N: openai.Int(2), Seed: openai.Int(9),
					ParallelToolCalls: openai.Bool(false), Temperature: openai.Float(1), MaxCompletionTokens: openai.Int(200),
					ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")},
					LogitBias:  map[string]int64{jsonInt32(open): 100},
					Messages:   []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris?")}}
				r, err := client.Chat.Completions.New(context.Background(), p)
				if err != nil {
					t.Fatalf("opening %d: %v", open, err)
				}
				for _, c := range r.Choices {
					if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) == 0 {
						t.Fatalf("opening %d: choice %d: finish %q with %d calls, content %q", open, c.Index, c.FinishReason,
							len(c.Message.ToolCalls), c.Message.Content)
					}
					for _, call := range c.Message.ToolCalls {
						checkCall(t, validators, call.Function.Name, call.Function.Arguments, "")
					}
				}
				checkStreamedCalls(t, client, p, 2, validators, fam.family+" streamed")
			}
		})
	}
}
