package api

import (
	"net/http"

	"github.com/conveyor-llm/conveyor/engine"
	"github.com/gin-gonic/gin"
)

// tokenizeRequest is the wire schema of POST /tokenize: a prompt, or chat messages.
type tokenizeRequest struct {
	Model               opt[string]             `json:"model"`
	Prompt              opt[string]             `json:"prompt"`
	AddSpecialTokens    opt[bool]               `json:"add_special_tokens"`
	Messages            opt[[]opt[chatMessage]] `json:"messages"`
	AddGenerationPrompt opt[bool]               `json:"add_generation_prompt"`
}

// detokenizeRequest is the wire schema of POST /detokenize.
type detokenizeRequest struct {
	Model  opt[string]    `json:"model"`
	Tokens opt[[]jsonInt] `json:"tokens"`
}

// checkModel reports a model other than the served one; the model is optional here.
func (s *Server) checkModel(c *check, o opt[string]) {
	if m, ok := c.str("model", o); ok && m != s.cfg.ModelName {
		c.fail(modelNotFound(m))
	}
}

// handleTokenize serves POST /tokenize: {"prompt": text, "add_special_tokens": bool (default
// true)} or {"messages": [...], "add_generation_prompt": bool (default true)}, tokenized
// exactly as the completion and chat endpoints would → {"tokens", "count", "max_model_len"}.
func (s *Server) handleTokenize(c *gin.Context) {
	b, ids, ok := openRequest(s, c, s.tokenize)
	if !ok {
		return
	}
	if ids == nil {
		ids = []int32{}
	}
	writeJSON(c.Writer, http.StatusOK, gin.H{"tokens": ids, "count": len(ids), "max_model_len": b.MaxModelLen})
}

// tokenize validates a /tokenize request and tokenizes it.
func (s *Server) tokenize(w *tokenizeRequest, b *Backend) ([]int32, error) {
	c := &check{}
	s.checkModel(c, w.Model)
	if w.Messages.Set {
		msgs := parseMessages(c, w.Messages)
		addGen := c.boolean("add_generation_prompt", w.AddGenerationPrompt, true)
		if c.err != nil {
			return nil, c.err
		}
		ids, err := b.Tokenizer.EncodeChat(msgs, addGen)
		if err != nil {
			return nil, invalidParam("messages", "the messages could not be rendered with the chat template: %v", err)
		}
		return ids, nil
	}
	p, ok := c.str("prompt", w.Prompt)
	addSpecial := c.boolean("add_special_tokens", w.AddSpecialTokens, true)
	if !c.failed() && !ok {
		c.fail(invalidParam("prompt", "prompt (a string) or messages is required"))
	}
	if c.err != nil {
		return nil, c.err
	}
	ids, err := b.Tokenizer.Encode(p, addSpecial)
	if err != nil {
		return nil, invalidParam("prompt", "could not tokenize: %v", err)
	}
	return ids, nil
}

// handleDetokenize serves POST /detokenize: {"tokens": [ids]} → {"prompt": text}.
func (s *Server) handleDetokenize(c *gin.Context) {
	b, ids, ok := openRequest(s, c, s.detokenize)
	if !ok {
		return
	}
	writeJSON(c.Writer, http.StatusOK, gin.H{"prompt": b.Tokenizer.Decode(ids, false)})
}

// detokenize validates a /detokenize request: its token ids.
func (s *Server) detokenize(w *detokenizeRequest, b *Backend) ([]int32, error) {
	c := &check{}
	s.checkModel(c, w.Model)
	ids := c.tokenIDList("tokens", w.Tokens)
	if !c.failed() && !w.Tokens.Set {
		c.fail(invalidParam("tokens", "tokens is required"))
	}
	if c.err == nil {
		c.fail(engine.Limits{VocabSize: b.vocab()}.CheckTokens("tokens", ids))
	}
	return ids, c.err
}
