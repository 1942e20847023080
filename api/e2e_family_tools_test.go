package api

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// e2eFamily is a random model of a family's architecture carrying its real tokenizer
// files and chat template, and the tokens that open a call in its tool-call format.
type e2eFamily struct {
	family, cfg string
	openings    []int // logit_bias targets that make an auto reply open a call
}

// e2eFamilies: Qwen3 (hermes: <tool_call>, token 151657) and Llama 3.1 (its template
// knows no tools, so generic: `{"` 5018, or `{\n` 517, the opening of pretty-printed JSON).
var e2eFamilies = []e2eFamily{
	{"qwen3", `{"model_type":"qwen3","architectures":["Qwen3ForCausalLM"],"vocab_size":151936,"hidden_size":32,
		"intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16,
		"max_position_embeddings":2048,"rms_norm_eps":1e-6,"rope_theta":1000000,"tie_word_embeddings":true,
		"bos_token_id":151643,"eos_token_id":[151645,151643]}`, []int{151657}},
	{"llama3_1", `{"model_type":"llama","architectures":["LlamaForCausalLM"],"vocab_size":128256,"hidden_size":32,
		"intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,
		"max_position_embeddings":2048,"rms_norm_eps":1e-5,"rope_theta":500000,"tie_word_embeddings":true,
		"bos_token_id":128000,"eos_token_id":[128001,128008,128009]}`, []int{5018, 517}},
}

// serve serves the family's random model, skipping the test without its tokenizer files.
func (fam e2eFamily) serve(t *testing.T) openai.Client {
	t.Helper()
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
	return serveRandomModel(t, src, fam.cfg, fam.family)
}

func e2eToolValidators(t *testing.T) map[string]*jsonschema.Schema {
	validators := map[string]*jsonschema.Schema{}
	for name, s := range e2eToolParams {
		validators[name] = e2eValidator(t, s)
	}
	return validators
}

// TestE2EFamilyToolCallsAuto serves random models carrying Qwen3's and Llama 3.1's real
// tokenizer files and chat templates, and forces each reply under tool_choice auto to
// open a call with logit_bias — on <tool_call> for Qwen3 (hermes), on `{"` and on `{\n`
// (the opening of pretty-printed JSON) for Llama 3.1 (generic): every reply must end
// with finish_reason tool_calls and calls that validate, plain and streamed.
func TestE2EFamilyToolCallsAuto(t *testing.T) {
	validators := e2eToolValidators(t)
	for _, fam := range e2eFamilies {
		t.Run(fam.family, func(t *testing.T) {
			client := fam.serve(t)
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

// toolCallFunction is a call's name and arguments, as a reply carries them.
type toolCallFunction struct{ Name, Arguments string }

// e2eReply is one choice of a chat reply, plain or assembled from its stream.
type e2eReply struct {
	finish, content string
	calls           []toolCallFunction // name and arguments, in order
}

// chatReplies sends p plain and streamed and returns each one's choices by index.
func chatReplies(t *testing.T, client openai.Client, p openai.ChatCompletionNewParams) (plain, streamed map[int64]*e2eReply) {
	t.Helper()
	ctx := context.Background()
	r, err := client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	plain = map[int64]*e2eReply{}
	for _, c := range r.Choices {
		rep := &e2eReply{finish: string(c.FinishReason), content: c.Message.Content}
		for _, call := range c.Message.ToolCalls {
			rep.calls = append(rep.calls, toolCallFunction{Name: call.Function.Name, Arguments: call.Function.Arguments})
		}
		plain[c.Index] = rep
	}
	streamed = map[int64]*e2eReply{}
	st := client.Chat.Completions.NewStreaming(ctx, p)
	for st.Next() {
		for _, c := range st.Current().Choices {
			rep := streamed[c.Index]
			if rep == nil {
				rep = &e2eReply{}
				streamed[c.Index] = rep
			}
			if c.FinishReason != "" {
				rep.finish = c.FinishReason
			}
			rep.content += c.Delta.Content
			for _, d := range c.Delta.ToolCalls {
				for int64(len(rep.calls)) <= d.Index {
					rep.calls = append(rep.calls, toolCallFunction{})
				}
				rep.calls[d.Index].Name += d.Function.Name
				rep.calls[d.Index].Arguments += d.Function.Arguments
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	return plain, streamed
}

// TestE2EFamilyToolCallsFinish: random models with Qwen3's and Llama 3.1's real
// tokenizer files and templates, at temperature 1 with max_tokens 200, under required, a
// named function and auto forced open, one call or parallel calls, plain and streamed:
// every reply ends with finish_reason tool_calls, calls that validate and no content.
// A hot random model takes every byte of layout the call grammar allows; with llama.cpp's
// layout (a space or a newline and indentation between any two tokens) these seeds ran
// replies to max_tokens — Llama 3.1's named weather call with seed 4, Qwen3's required,
// named and auto parallel calls with seeds 1, 3 and 4 — and the cut ones were reported
// as calls.
func TestE2EFamilyToolCallsFinish(t *testing.T) {
	validators := e2eToolValidators(t)
	for _, fam := range e2eFamilies {
		t.Run(fam.family, func(t *testing.T) {
			client := fam.serve(t)
			type choice struct {
				label  string
				choice openai.ChatCompletionToolChoiceOptionUnionParam
				bias   map[string]int64
			}
			choices := []choice{{label: "required", choice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}}}
			for _, name := range []string{"weather", "search"} {
				choices = append(choices, choice{label: name, choice: openai.ChatCompletionToolChoiceOptionUnionParam{
					OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: name}}}})
			}
			for _, open := range fam.openings {
				choices = append(choices, choice{label: fmt.Sprintf("auto opened by %d", open),
					choice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")},
					bias:   map[string]int64{jsonInt32(open): 100}})
			}
			replies := 0
			for _, c := range choices {
				for _, parallel := range []bool{false, true} {
					for _, seed := range []int64{1, 3, 4} {
						p := openai.ChatCompletionNewParams{Model: fam.family, Tools: e2eTools(t), N: openai.Int(2), Seed: openai.Int(seed),
							ParallelToolCalls: openai.Bool(parallel), Temperature: openai.Float(1), MaxCompletionTokens: openai.Int(200),
							ToolChoice: c.choice, LogitBias: c.bias,
							Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris?")}}
						plain, streamed := chatReplies(t, client, p)
						for mode, reps := range map[string]map[int64]*e2eReply{"plain": plain, "streamed": streamed} {
							for i, rep := range reps {
								label := fmt.Sprintf("%s, parallel %v, seed %d, %s choice %d", c.label, parallel, seed, mode, i)
								if rep.finish != "tool_calls" || len(rep.calls) == 0 || rep.content != "" {
									t.Fatalf("%s: finish %q with %d calls, content %q", label, rep.finish, len(rep.calls), rep.content)
								}
								want := ""
								if c.choice.OfFunctionToolChoice != nil {
									want = c.choice.OfFunctionToolChoice.Function.Name
								}
								if (!parallel || want != "") && len(rep.calls) != 1 {
									t.Fatalf("%s: %d calls; want one without parallel_tool_calls or under a named choice", label, len(rep.calls))
								}
								for _, call := range rep.calls {
									checkCall(t, validators, call.Name, call.Arguments, want)
								}
								replies++
							}
						}
					}
				}
			}
			t.Logf("%d replies, all finished with valid calls", replies)
		})
	}
}

// callsIn reads the first bytes of a constrained reply of family's format as a client
// would: how many calls ended within them, and whether one was open at their end (a
// hermes block not closed by </tool_call>, or a JSON object not closed).
func callsIn(family, text string) (done int, open bool) {
	end := 0
	if family == "qwen3" {
		done = strings.Count(text, "</tool_call>")
		if i := strings.LastIndex(text, "</tool_call>"); i >= 0 {
			end = i + len("</tool_call>")
		}
	} else {
		depth, inStr, esc := 0, false, false
		for i := 0; i < len(text); i++ {
			switch c := text[i]; {
			case esc:
				esc = false
			case inStr && c == '\\':
				esc = true
			case c == '"':
				inStr = !inStr
			case inStr:
			case c == '{':
				depth++
			case c == '}':
				if depth--; depth == 0 {
					done, end = done+1, i+1
				}
			}
		}
	}
	return done, strings.TrimSpace(text[end:]) != ""
}

// TestE2EFamilyToolCallsCut cuts parallel calls short: the same request (Qwen3's and
// Llama 3.1's real files, tool_choice required, temperature 1, a seed) is sent with
// max_tokens at eight points inside its reply. A reply cut inside a call ends with
// finish_reason "length"; the calls completed before the cut come back as calls, exactly
// the full reply's first calls; the cut call is no call and its text is not content.
// Streamed, only the cut call's deltas already sent may follow the complete calls. Where
// the cut falls between calls the reply ends with tool_calls. Through the Responses API
// the cut reply is incomplete (max_output_tokens) and its output holds only the complete
// calls, though a stream announced the cut one.
func TestE2EFamilyToolCallsCut(t *testing.T) {
	const cutSeed = 10 // four calls on Qwen3 (157 tokens), three on Llama 3.1 (117)
	validators := e2eToolValidators(t)
	for _, fam := range e2eFamilies {
		t.Run(fam.family, func(t *testing.T) {
			client := fam.serve(t)
			ctx := context.Background()
			p := openai.ChatCompletionNewParams{Model: fam.family, Tools: e2eTools(t), Seed: openai.Int(cutSeed),
				ParallelToolCalls: openai.Bool(true), Temperature: openai.Float(1), MaxCompletionTokens: openai.Int(400),
				ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}, Logprobs: openai.Bool(true),
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris?")}}
			full, err := client.Chat.Completions.New(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			whole := full.Choices[0]
			if whole.FinishReason != "tool_calls" || len(whole.Message.ToolCalls) < 2 {
				t.Fatalf("the full reply: finish %q with %d calls; want several calls", whole.FinishReason, len(whole.Message.ToolCalls))
			}
			tokens := whole.Logprobs.Content
			cuts := map[string]int{}
			for i := 1; i <= 8; i++ {
				k := len(tokens) * i / 9
				var prefix []byte
				for _, tok := range tokens[:k] {
					for _, b := range tok.Bytes {
						prefix = append(prefix, byte(b))
					}
				}
				done, open := callsIn(fam.family, string(prefix))
				wantFinish := "tool_calls"
				if open {
					wantFinish = "length"
				}
				cuts[fmt.Sprintf("%s with %v calls", wantFinish, done > 0)]++
				cut := p
				cut.MaxCompletionTokens, cut.Logprobs = openai.Int(int64(k)), openai.Bool(false)
				plain, streamed := chatReplies(t, client, cut)
				for mode, rep := range map[string]*e2eReply{"plain": plain[0], "streamed": streamed[0]} {
					label := fmt.Sprintf("cut after %d of %d tokens, %s", k, len(tokens), mode)
					if rep.finish != wantFinish || rep.content != "" {
						t.Fatalf("%s (%d calls done, one open: %v): finish %q, content %q", label, done, open, rep.finish, rep.content)
					}
					got := rep.calls
					if mode == "streamed" && open && len(got) == done+1 {
						got = got[:done] // the cut call's deltas that had gone out
					}
					if len(got) != done {
						t.Fatalf("%s: %d calls, want the %d completed before the cut: %+v", label, len(got), done, rep.calls)
					}
					for j, call := range got {
						w := whole.Message.ToolCalls[j].Function
						if call.Name != w.Name || call.Arguments != w.Arguments {
							t.Fatalf("%s: call %d is %s(%s), the full reply's %s(%s)", label, j, call.Name, call.Arguments, w.Name, w.Arguments)
						}
						checkCall(t, validators, call.Name, call.Arguments, "")
					}
				}
			}
			t.Logf("%d tokens in the full reply; cuts: %v", len(tokens), cuts)
			checkResponsesCuts(t, client, fam.family, cutSeed, validators)
			if cuts["length with true calls"] == 0 || cuts["length with false calls"] == 0 {
				t.Fatalf("cuts %v: none inside a later call, or none inside the first; the test checks less than it says", cuts)
			}
		})
	}
}

// checkResponsesCuts cuts a Responses API reply (tool_choice required, parallel calls,
// seed) short at eight points: each response is incomplete (max_output_tokens) and its
// output is the full reply's first calls, plain and streamed, though the stream
// announced the cut call where its name was out before the cut.
func checkResponsesCuts(t *testing.T, client openai.Client, model string, seed int64, validators map[string]*jsonschema.Schema) {
	t.Helper()
	ctx := context.Background()
	p := responses.ResponseNewParams{Model: model, Input: inputText("What is the weather in Paris?"), Tools: e2eResponseTools(t),
		ParallelToolCalls: openai.Bool(true), Temperature: openai.Float(1), MaxOutputTokens: openai.Int(400),
		Store: openai.Bool(false), ToolChoice: responses.ResponseNewParamsToolChoiceUnion{
			OfToolChoiceMode: openai.Opt(responses.ToolChoiceOptionsRequired)}}
	calls := func(resp responses.Response) []toolCallFunction {
		var out []toolCallFunction
		for _, it := range resp.Output {
			if it.Type != "function_call" {
				t.Fatalf("responses: a %s item: %s", it.Type, resp.RawJSON())
			}
			fc := it.AsFunctionCall()
			checkCall(t, validators, fc.Name, fc.Arguments, "")
			out = append(out, toolCallFunction{Name: fc.Name, Arguments: fc.Arguments})
		}
		return out
	}
	full, err := client.Responses.New(ctx, p, option.WithJSONSet("seed", seed))
	if err != nil {
		t.Fatal(err)
	}
	whole := calls(*full)
	if full.Status != "completed" || len(whole) < 2 {
		t.Fatalf("responses: the full reply is %s with %d calls; want several calls", full.Status, len(whole))
	}
	dropped, kept := 0, 0
	for i := 1; i <= 8; i++ {
		k := int(full.Usage.OutputTokens) * i / 9
		cut := p
		cut.MaxOutputTokens = openai.Int(int64(k))
		resp, err := client.Responses.New(ctx, cut, option.WithJSONSet("seed", seed))
		if err != nil {
			t.Fatal(err)
		}
		st := client.Responses.NewStreaming(ctx, cut, option.WithJSONSet("seed", seed))
		announced := 0
		var final responses.Response
		for st.Next() {
			switch ev := st.Current(); ev.Type {
			case "response.output_item.added":
				announced++
			case "response.incomplete", "response.completed":
				final = ev.Response
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		for label, r := range map[string]responses.Response{"plain": *resp, "streamed": final} {
			if r.Status != "incomplete" || r.IncompleteDetails.Reason != "max_output_tokens" {
				t.Fatalf("responses %s, cut after %d tokens: status %q, incomplete_details %+v", label, k, r.Status, r.IncompleteDetails)
			}
			got := calls(r)
			if len(got) > len(whole) || !slices.Equal(got, whole[:len(got)]) {
				t.Fatalf("responses %s, cut after %d of %d tokens: calls %+v; the full reply's are %+v", label, k, full.Usage.OutputTokens, got, whole)
			}
		}
		n := len(calls(*resp))
		if len(calls(final)) != n || announced < n || announced > n+1 {
			t.Fatalf("responses, cut after %d tokens: %d calls plain, %d streamed, %d items announced", k, n, len(calls(final)), announced)
		}
		if announced > n {
			dropped++
		}
		if n > 0 {
			kept++
		}
	}
	if dropped == 0 || kept == 0 {
		t.Fatalf("responses: %d cuts dropped an announced call, %d kept complete ones; the test checks less than it says", dropped, kept)
	}
}

// TestE2EFamilyStructuredCut: a json_schema reply (Qwen3's and Llama 3.1's real files,
// temperature 1) finishes with "stop" and JSON that validates, and the same reply cut
// short by max_tokens ends with "length", plain and streamed, and incomplete
// (max_output_tokens) through the Responses API.
func TestE2EFamilyStructuredCut(t *testing.T) {
	v := e2eValidator(t, e2eSchema)
	var schema map[string]any
	if err := json.Unmarshal([]byte(e2eSchema), &schema); err != nil {
		t.Fatal(err)
	}
	for _, fam := range e2eFamilies {
		t.Run(fam.family, func(t *testing.T) {
			client := fam.serve(t)
			ctx := context.Background()
			p := openai.ChatCompletionNewParams{Model: fam.family, Seed: openai.Int(1), Temperature: openai.Float(1),
				MaxCompletionTokens: openai.Int(200), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Describe Paris.")},
				ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
					JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "city", Schema: schema, Strict: openai.Bool(true)}}}}
			plain, streamed := chatReplies(t, client, p)
			for mode, rep := range map[string]*e2eReply{"plain": plain[0], "streamed": streamed[0]} {
				if rep.finish != "stop" {
					t.Fatalf("%s: finish %q after %q; want the reply to finish", mode, rep.finish, rep.content)
				}
				validates(t, mode, rep.content, rep.finish, v)
			}
			cut := p
			cut.MaxCompletionTokens = openai.Int(6)
			plain, streamed = chatReplies(t, client, cut)
			for mode, rep := range map[string]*e2eReply{"plain": plain[0], "streamed": streamed[0]} {
				if rep.finish != "length" || !strings.HasPrefix(plain[0].content, rep.content) {
					t.Fatalf("cut, %s: finish %q with %q", mode, rep.finish, rep.content)
				}
			}
			resp, err := client.Responses.New(ctx, responses.ResponseNewParams{Model: fam.family, Input: inputText("Describe Paris."),
				MaxOutputTokens: openai.Int(6), Store: openai.Bool(false), Temperature: openai.Float(1),
				Text: responses.ResponseTextConfigParam{Format: responses.ResponseFormatTextConfigParamOfJSONSchema("city", schema)}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != "incomplete" || resp.IncompleteDetails.Reason != "max_output_tokens" {
				t.Fatalf("responses, cut: status %q, incomplete_details %+v", resp.Status, resp.IncompleteDetails)
			}
		})
	}
}

// TestE2EFamilyNamedToolChoice: a tool_choice naming a function gives exactly one call of
// it, whatever parallel_tool_calls says (on, off, left to its default of on), as OpenAI
// documents a named choice. Random models carrying Qwen3's and Llama 3.1's real tokenizer
// files and templates, at temperature 1 over many seeds, through the official SDK: every
// reply — chat plain and streamed with n=2, and the Responses API's {"type": "function",
// "name": ...} plain and streamed — holds one valid call of the named function and ends
// with finish_reason tool_calls (the response completed, its output that one call).
func TestE2EFamilyNamedToolChoice(t *testing.T) {
	validators := e2eToolValidators(t)
	ctx := context.Background()
	for _, fam := range e2eFamilies {
		t.Run(fam.family, func(t *testing.T) {
			client := fam.serve(t)
			replies := 0
			for _, name := range []string{"weather", "search"} {
				for _, par := range []struct {
					label string
					v     param.Opt[bool]
				}{{"left out", param.Opt[bool]{}}, {"true", openai.Bool(true)}, {"false", openai.Bool(false)}} {
					parallel := par.v
					for seed := int64(1); seed <= 6; seed++ {
						label := fmt.Sprintf("%s, parallel_tool_calls %s, seed %d", name, par.label, seed)
						p := openai.ChatCompletionNewParams{Model: fam.family, Tools: e2eTools(t), N: openai.Int(2), Seed: openai.Int(seed),
							ParallelToolCalls: parallel, Temperature: openai.Float(1), MaxCompletionTokens: openai.Int(300),
							ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{
								Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: name}}},
							Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris? Search for it too.")}}
						plain, streamed := chatReplies(t, client, p)
						for mode, reps := range map[string]map[int64]*e2eReply{"plain": plain, "streamed": streamed} {
							if len(reps) != 2 {
								t.Fatalf("%s, %s: %d choices, want 2", label, mode, len(reps))
							}
							for i, rep := range reps {
								if rep.finish != "tool_calls" || len(rep.calls) != 1 || rep.content != "" {
									t.Fatalf("%s, %s choice %d: finish %q with calls %+v, content %q; want one call", label, mode, i, rep.finish, rep.calls, rep.content)
								}
								checkCall(t, validators, rep.calls[0].Name, rep.calls[0].Arguments, name)
								replies++
							}
						}
						rp := responses.ResponseNewParams{Model: fam.family, Input: inputText("What is the weather in Paris? Search for it too."),
							Tools: e2eResponseTools(t), ParallelToolCalls: parallel, Temperature: openai.Float(1), MaxOutputTokens: openai.Int(300),
							Store: openai.Bool(false), ToolChoice: responses.ResponseNewParamsToolChoiceUnion{
								OfFunctionTool: &responses.ToolChoiceFunctionParam{Name: name}}}
						resp, err := client.Responses.New(ctx, rp, option.WithJSONSet("seed", seed))
						if err != nil {
							t.Fatal(err)
						}
						st := client.Responses.NewStreaming(ctx, rp, option.WithJSONSet("seed", seed))
						var final responses.Response
						for st.Next() {
							if ev := st.Current(); ev.Type == "response.completed" || ev.Type == "response.incomplete" {
								final = ev.Response
							}
						}
						if err := st.Err(); err != nil {
							t.Fatal(err)
						}
						for mode, r := range map[string]responses.Response{"plain": *resp, "streamed": final} {
							if r.Status != "completed" || len(r.Output) != 1 || r.Output[0].Type != "function_call" {
								t.Fatalf("responses %s, %s: status %q with output %s; want one function_call", label, mode, r.Status, r.RawJSON())
							}
							fc := r.Output[0].AsFunctionCall()
							checkCall(t, validators, fc.Name, fc.Arguments, name)
							replies++
						}
					}
				}
			}
			t.Logf("%d replies, each one call of the named function", replies)
		})
	}
}
