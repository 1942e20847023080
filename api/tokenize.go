package api

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/conveyor-llm/conveyor/api/openai"
)

// handleTokenize serves POST /tokenize: a prompt or chat messages, tokenized exactly as
// the completion and chat endpoints would (openai.ParseTokenize) → {"tokens", "count",
// "max_model_len"}.
func (s *Server) handleTokenize(c *gin.Context) {
	b, ids, ok := openRequest(s, c, func(w *openai.TokenizeRequest, m *openai.Model) ([]int32, error) {
		return openai.ParseTokenize(w, m, s.cfg.ModelName)
	})
	if !ok {
		return
	}
	if ids == nil {
		ids = []int32{}
	}
	writeJSON(c.Writer, http.StatusOK, openai.TokenizeResponse{Tokens: ids, Count: len(ids), MaxModelLen: b.MaxModelLen})
}

// handleDetokenize serves POST /detokenize: {"tokens": [ids]} → {"prompt": text}.
func (s *Server) handleDetokenize(c *gin.Context) {
	b, ids, ok := openRequest(s, c, func(w *openai.DetokenizeRequest, m *openai.Model) ([]int32, error) {
		return openai.ParseDetokenize(w, m, s.cfg.ModelName)
	})
	if !ok {
		return
	}
	writeJSON(c.Writer, http.StatusOK, openai.DetokenizeResponse{Prompt: b.Tokenizer.Decode(ids, false)})
}
