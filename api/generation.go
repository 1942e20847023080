package api

import (
	"time"

	"github.com/gin-gonic/gin"

	"github.com/conveyor-llm/conveyor/api/openai"
)

// handleCompletions serves POST /v1/completions.
func (s *Server) handleCompletions(c *gin.Context) {
	b, req, ok := openRequest(s, c, openai.ParseCompletion)
	if !ok {
		return
	}
	prompts := make([][]int32, len(req.Prompts))
	for i, p := range req.Prompts {
		prompts[i] = p.Tokens
	}
	s.generate(c, b, &req.Generation, "cmpl-", prompts, func(id string, created int64) openai.Converter {
		return openai.NewCompletionOutput(req, b.Tokenizer, id, created, s.cfg.ModelName)
	})
}

// handleChat serves POST /v1/chat/completions.
func (s *Server) handleChat(c *gin.Context) {
	b, req, ok := openRequest(s, c, openai.ParseChat)
	if !ok {
		return
	}
	s.generate(c, b, &req.Generation, "chatcmpl-", [][]int32{req.Prompt}, func(id string, created int64) openai.Converter {
		return openai.NewChatOutput(req, b.Tokenizer, id, created, s.cfg.ModelName, s.metrics.rejectToolCalls)
	})
}

// generate runs a validated request of either endpoint: it checks the model, submits one
// engine request per prompt and writes the response through the endpoint's openai.Converter.
func (s *Server) generate(c *gin.Context, b *Backend, g *openai.Generation, idPrefix string, prompts [][]int32,
	newConverter func(id string, created int64) openai.Converter) {
	releaseBody(c) // parsed and tokenized: the body's room goes to the next one
	if g.Model != s.cfg.ModelName {
		writeError(c.Writer, openai.ModelNotFound(g.Model))
		return
	}
	s.active.Add(1)
	defer s.active.Done()
	ctx := c.Request.Context()
	id := openai.NewID(idPrefix)
	c.Set(completionIDKey, id)
	jobs, err := s.submitAll(ctx, b, id, prompts, g.Params, g.Names)
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	s.runGeneration(ctx, c.Writer, b, g, jobs, newConverter(id, time.Now().Unix()))
}
