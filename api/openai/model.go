package openai

import (
	"encoding/json"
	"errors"

	"github.com/conveyor-llm/conveyor/api/toolcall"
	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/engine/structured"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// Model is what the converters read of the served model.
type Model struct {
	Tokenizer Tokenizer
	// MaxModelLen is the model's context length in tokens (prompt + completion).
	MaxModelLen int
	// ToolCallParser names the tool-call format (hermes, llama3_json, mistral, generic);
	// empty chooses it from the chat template.
	ToolCallParser string
	// Formats compiles response_format and tool calls into structured-output constraints
	// (NewFormats); nil refuses the JSON formats.
	Formats *structured.Cache
	// Defaults replace the OpenAI defaults of the sampling fields a request leaves out.
	Defaults SamplingDefaults
}

// vocab is the tokenizer's vocabulary size.
func (m *Model) vocab() int { return m.Tokenizer.VocabSize() }

// Message is one chat message after parsing: a role and its text, and what else the chat
// template is given of it.
type Message struct {
	Role    string
	Content string // the text (the text parts joined when content was an array)
	// Parts is the content as sent when it was an array of text parts (nil for a
	// string); templates that iterate over a message's content get it as such.
	Parts      []ContentPart
	Name       string     // name, when set
	ToolCallID string     // tool_call_id of a tool message, when set
	ToolCalls  []ToolCall // tool_calls of an assistant message
}

// ChatOptions are what a chat render passes the template besides the messages.
type ChatOptions struct {
	AddGenerationPrompt bool
	Tools               []json.RawMessage // the request's tools; nil = none
	Kwargs              json.RawMessage   // chat_template_kwargs, a JSON object; nil = none
}

// ContentPart is one text content part of a message.
type ContentPart struct{ Type, Text string }

// ToolCall is one tool call of an assistant message in the history. Arguments is the
// JSON text of the arguments, as the OpenAI API carries it.
type ToolCall struct {
	ID, Type        string
	Name, Arguments string
}

// Tokenizer is what the converters need from the model's tokenizer. NewTokenizer adapts
// *tokenizer.Tokenizer to it; handler tests use a fake.
type Tokenizer interface {
	// Encode turns text into token ids; addSpecial prepends BOS when the model wants it.
	Encode(text string, addSpecial bool) ([]int32, error)
	// Decode turns token ids back into text.
	Decode(ids []int32, skipSpecial bool) string
	// TokenText is the display text of one token (for logprobs).
	TokenText(id int32) string
	// TokenBytes is the raw bytes of one token, and IsSpecial whether it is a special
	// token (left out of generated text). The chat logprobs' "bytes" field carries a
	// token's own bytes even when it holds only part of a multi-byte character (whose
	// TokenText is U+FFFD), and completion logprobs' text_offset counts characters of
	// the text.
	TokenBytes(id int32) []byte
	IsSpecial(id int32) bool
	// VocabSize is the number of token ids; valid ids are 0 .. VocabSize-1.
	VocabSize() int
	// EncodeChat renders messages through the model's chat template (ending with the
	// assistant turn's opening when addGenerationPrompt is true) and tokenizes the result.
	EncodeChat(msgs []Message, addGenerationPrompt bool) ([]int32, error)
	// EncodeChatWith is EncodeChat with the request's tools and template keyword
	// arguments passed to the template (as vLLM passes request.tools and
	// chat_template_kwargs).
	EncodeChatWith(msgs []Message, o ChatOptions) ([]int32, error)
	// ChatTemplateSource is the chat template's text, from which the tool-call format is
	// chosen.
	ChatTemplateSource() string
}

// NewFormats returns the response_format cache of a served model (Model.Formats):
// constraints over the model's vocabSize token ids with t's token bytes, ended by the
// engine's end-of-sequence tokens eos (control tokens never match, but for those
// spelling toolcall.ControlLiterals); the 64 most recently used schemas are kept
// compiled, with the token masks computed so far.
func NewFormats(t *tokenizer.Tokenizer, vocabSize int, eos []int32) *structured.Cache {
	control := map[string]bool{}
	for _, lit := range toolcall.ControlLiterals {
		control[lit] = true
	}
	// Control tokens never match, except those that spell a call format's literal.
	special := func(id int32) bool { return t.IsSpecial(id) && !control[string(t.TokenBytes(id))] }
	v := structured.NewVocabulary(max(vocabSize, t.VocabSize()), t.TokenBytes, special, eos)
	return structured.NewCache(v, 64)
}

// NewTokenizer adapts a loaded model tokenizer to the Tokenizer interface.
// Chat prompts are rendered with the model's chat template (with the messages' names,
// tool calls and tool call ids; content parts as a list when the template iterates over
// content, as vLLM decides, else as their joined text) and tokenized without adding
// special tokens (the template writes BOS itself); with the tokenizer's plain fallback
// format (no template in tokenizer_config.json) the usual special tokens are added.
func NewTokenizer(t *tokenizer.Tokenizer) Tokenizer { return tokAdapter{t} }

type tokAdapter struct{ t *tokenizer.Tokenizer }

func (a tokAdapter) Encode(text string, addSpecial bool) ([]int32, error) {
	return a.t.Encode(text, addSpecial)
}
func (a tokAdapter) Decode(ids []int32, skipSpecial bool) string { return a.t.Decode(ids, skipSpecial) }
func (a tokAdapter) TokenText(id int32) string                   { return a.t.TokenText(id) }
func (a tokAdapter) TokenBytes(id int32) []byte                  { return a.t.TokenBytes(id) }
func (a tokAdapter) IsSpecial(id int32) bool                     { return a.t.IsSpecial(id) }
func (a tokAdapter) VocabSize() int                              { return a.t.VocabSize() }

func (a tokAdapter) EncodeChat(msgs []Message, addGenerationPrompt bool) ([]int32, error) {
	return a.EncodeChatWith(msgs, ChatOptions{AddGenerationPrompt: addGenerationPrompt})
}

// EncodeChatWith is EncodeChat with the request's tools and keyword arguments passed to
// the template.
func (a tokAdapter) EncodeChatWith(msgs []Message, o ChatOptions) ([]int32, error) {
	tm := make([]tokenizer.Message, len(msgs))
	parts := a.t.ChatUsesContentParts()
	for i, m := range msgs {
		tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
		if parts && m.Parts != nil {
			// As vLLM's "openai" content format: a template that iterates over content
			// gets the parts; others get the text.
			tm[i].Parts = make([]tokenizer.ContentPart, len(m.Parts))
			for j, p := range m.Parts {
				tm[i].Parts[j] = tokenizer.ContentPart{Type: p.Type, Text: p.Text}
			}
		}
		for _, tc := range m.ToolCalls {
			tm[i].ToolCalls = append(tm[i].ToolCalls, tokenizer.ToolCall{ID: tc.ID, Type: tc.Type,
				Function: tokenizer.ToolCallFunction{Name: tc.Name, Arguments: tc.Arguments}})
		}
	}
	text, err := a.t.ApplyChatTemplateWith(tm, tokenizer.ChatOptions{AddGenerationPrompt: o.AddGenerationPrompt, Tools: o.Tools, Kwargs: o.Kwargs})
	if err != nil {
		return nil, err
	}
	return a.t.Encode(text, !a.t.HasChatTemplate())
}

// ChatTemplateSource returns the chat template's text.
func (a tokAdapter) ChatTemplateSource() string { return a.t.ChatTemplateSource() }

// SamplingDefaults are a model's own defaults for sampling fields a request leaves out,
// as vLLM takes them from generation_config.json (its --generation-config auto). A nil
// field keeps the OpenAI default (temperature 1, top_p 1, no top_k, min_p 0, no
// repetition penalty). They are used as they are: whoever sets them keeps only values the
// engine's rules accept (see Checked).
type SamplingDefaults struct {
	Temperature, TopP, MinP, RepetitionPenalty *float64
	TopK                                       *int
}

// apply sets the defaults that are set in p.
func (d SamplingDefaults) apply(p *engine.SamplingParams) {
	set := func(dst *float32, v *float64) {
		if v != nil {
			*dst = float32(*v)
		}
	}
	set(&p.Temperature, d.Temperature)
	set(&p.TopP, d.TopP)
	set(&p.MinP, d.MinP)
	set(&p.RepetitionPenalty, d.RepetitionPenalty)
	if d.TopK != nil {
		p.TopK = *d.TopK
	}
}

// Checked returns d without the defaults the engine's rules refuse, and why each was
// dropped: a generation_config.json with temperature 5 leaves requests at OpenAI's 1.
func (d SamplingDefaults) Checked(l engine.Limits) (SamplingDefaults, []error) {
	var dropped []error
	for {
		p := engine.DefaultSamplingParams()
		d.apply(&p)
		_, err := l.Check(&engine.Request{Prompt: []int32{0}, Params: p})
		var pe *engine.ParamError
		if !errors.As(err, &pe) {
			return d, dropped
		}
		switch pe.Param {
		case "temperature":
			d.Temperature = nil
		case "top_p":
			d.TopP = nil
		case "min_p":
			d.MinP = nil
		case "repetition_penalty":
			d.RepetitionPenalty = nil
		case "top_k":
			d.TopK = nil
		default: // not a default's rule
			return d, append(dropped, err)
		}
		dropped = append(dropped, err)
	}
}
