package api

import (
	"encoding/json"

	"github.com/conveyor-llm/conveyor/api/toolcall"
	"github.com/conveyor-llm/conveyor/engine/structured"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// NewFormats returns the response_format cache of a served model (Backend.Formats):
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

// NewTokenizer adapts a loaded model tokenizer to the server's Tokenizer interface.
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
	return a.encodeChat(msgs, addGenerationPrompt, nil)
}

func (a tokAdapter) encodeChat(msgs []Message, addGenerationPrompt bool, tools []json.RawMessage) ([]int32, error) {
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
	text, err := a.t.ApplyChatTemplateWith(tm, tokenizer.ChatOptions{AddGenerationPrompt: addGenerationPrompt, Tools: tools})
	if err != nil {
		return nil, err
	}
	return a.t.Encode(text, !a.t.HasChatTemplate())
}

// EncodeChatTools implements ToolTemplater: EncodeChat with the request's tools passed
// to the template.
func (a tokAdapter) EncodeChatTools(msgs []Message, addGenerationPrompt bool, tools []json.RawMessage) ([]int32, error) {
	return a.encodeChat(msgs, addGenerationPrompt, tools)
}

// ChatTemplateSource implements ToolTemplater.
func (a tokAdapter) ChatTemplateSource() string { return a.t.ChatTemplateSource() }
