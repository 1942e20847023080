package api

import (
	"time"

	"github.com/gin-gonic/gin"
)

// handleCompletions serves POST /v1/completions.
func (s *Server) handleCompletions(c *gin.Context) {
	b, req, ok := openRequest(s, c, parseCompletion)
	if !ok {
		return
	}
	prompts := make([][]int32, len(req.prompts))
	for i, p := range req.prompts {
		prompts[i] = p.tokens
	}
	s.generate(c, b, &req.generation, "cmpl-", prompts, func(id string, created int64) converter {
		return newCompletionOutput(req, b.Tokenizer, id, created, s.cfg.ModelName)
	})
}

// handleChat serves POST /v1/chat/completions.
func (s *Server) handleChat(c *gin.Context) {
	b, req, ok := openRequest(s, c, parseChat)
	if !ok {
		return
	}
	s.generate(c, b, &req.generation, "chatcmpl-", [][]int32{req.prompt}, func(id string, created int64) converter {
		return newChatOutput(req, b.Tokenizer, id, created, s.cfg.ModelName, s.metrics.rejectToolCalls)
	})
}

// generate runs a validated request of either endpoint: it checks the model, submits one
// engine request per prompt and writes the response through the endpoint's converter.
func (s *Server) generate(c *gin.Context, b *Backend, g *generation, idPrefix string, prompts [][]int32,
	newConverter func(id string, created int64) converter) {
	releaseBody(c) // parsed and tokenized: the body's room goes to the next one
	if g.model != s.cfg.ModelName {
		writeError(c.Writer, modelNotFound(g.model))
		return
	}
	s.active.Add(1)
	defer s.active.Done()
	ctx := c.Request.Context()
	id := newID(idPrefix)
	c.Set(completionIDKey, id)
	jobs, err := s.submitAll(ctx, b, id, prompts, g.params, g.names)
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	s.runGeneration(ctx, c.Writer, b, g, jobs, newConverter(id, time.Now().Unix()))
}
