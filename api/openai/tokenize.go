package openai

import (
	"encoding/json"

	"github.com/conveyor-llm/conveyor/engine"
)

// TokenizeRequest is the wire schema of POST /tokenize: a prompt, or chat messages.
type TokenizeRequest struct {
	Model               opt[string]             `json:"model"`
	Prompt              opt[string]             `json:"prompt"`
	AddSpecialTokens    opt[bool]               `json:"add_special_tokens"`
	Messages            opt[[]opt[chatMessage]] `json:"messages"`
	AddGenerationPrompt opt[bool]               `json:"add_generation_prompt"`
	// Tools and ToolChoice render the messages as chat would with them (the tools passed
	// to the template, or described in the system message).
	Tools              opt[[]json.RawMessage] `json:"tools"`
	ToolChoice         opt[json.RawMessage]   `json:"tool_choice"`
	ChatTemplateKwargs opt[json.RawMessage]   `json:"chat_template_kwargs"`
}

// TokenizeResponse is /tokenize's answer.
type TokenizeResponse struct {
	Count       int     `json:"count"`
	MaxModelLen int     `json:"max_model_len"`
	Tokens      []int32 `json:"tokens"`
}

// DetokenizeRequest is the wire schema of POST /detokenize.
type DetokenizeRequest struct {
	Model  opt[string]    `json:"model"`
	Tokens opt[[]jsonInt] `json:"tokens"`
}

// DetokenizeResponse is /detokenize's answer.
type DetokenizeResponse struct {
	Prompt string `json:"prompt"`
}

// checkModel reports a model other than the served one; the model is optional here.
func checkModel(c *check, o opt[string], served string) {
	if name, ok := c.str("model", o); ok && name != served {
		c.fail(ModelNotFound(name))
	}
}

// ParseTokenize validates a /tokenize request to the model served as served and
// tokenizes it exactly as the completion and chat endpoints would: {"prompt": text,
// "add_special_tokens": bool (default true)} or {"messages": [...],
// "add_generation_prompt": bool (default true), "tools": [...], "tool_choice": ...}.
func ParseTokenize(w *TokenizeRequest, m *Model, served string) ([]int32, error) {
	c := &check{}
	checkModel(c, w.Model, served)
	if w.Messages.Set && w.Prompt.Set && !c.failed() {
		c.fail(InvalidParam("prompt", "give prompt or messages, not both"))
	}
	if (w.Tools.Set || w.ToolChoice.Set || w.ChatTemplateKwargs.Set) && !w.Messages.Set && !c.failed() {
		c.fail(InvalidParam("prompt", "tools, tool_choice and chat_template_kwargs go with messages"))
	}
	if w.Messages.Set {
		msgs := parseMessages(c, w.Messages)
		addGen := c.boolean("add_generation_prompt", w.AddGenerationPrompt, true)
		kwargs := templateKwargs(c, w.ChatTemplateKwargs)
		plan, _ := parseTools(c, &chatFeatures{Tools: w.Tools, ToolChoice: w.ToolChoice}, m)
		if c.err != nil {
			return nil, c.err
		}
		if plan != nil {
			msgs = plan.describe(msgs)
		}
		return renderChat(m, msgs, addGen, plan, kwargs)
	}
	p, ok := c.str("prompt", w.Prompt)
	addSpecial := c.boolean("add_special_tokens", w.AddSpecialTokens, true)
	if !c.failed() && !ok {
		c.fail(InvalidParam("prompt", "prompt (a string) or messages is required"))
	}
	if c.err != nil {
		return nil, c.err
	}
	ids, err := m.Tokenizer.Encode(p, addSpecial)
	if err != nil {
		return nil, InvalidParam("prompt", "could not tokenize: %v", err)
	}
	return ids, nil
}

// ParseDetokenize validates a /detokenize request to the model served as served: its
// token ids, {"tokens": [ids]}.
func ParseDetokenize(w *DetokenizeRequest, m *Model, served string) ([]int32, error) {
	c := &check{}
	checkModel(c, w.Model, served)
	ids := c.tokenIDList("tokens", w.Tokens)
	if !c.failed() && !w.Tokens.Set {
		c.fail(InvalidParam("tokens", "tokens is required"))
	}
	if c.err == nil {
		c.fail(engine.Limits{VocabSize: m.vocab()}.CheckTokens("tokens", ids))
	}
	return ids, c.err
}
