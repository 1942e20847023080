package api

import (
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
)

// handleHealth serves GET /health: 200 {"status":"ok"} when the model is loaded and the
// server is not draining, 503 otherwise.
func (s *Server) handleHealth(c *gin.Context) {
	switch {
	case s.draining.Load():
		writeJSON(c.Writer, http.StatusServiceUnavailable, gin.H{"status": "draining"})
	case s.backend.Load() == nil:
		writeJSON(c.Writer, http.StatusServiceUnavailable, gin.H{"status": "loading"})
	default:
		writeJSON(c.Writer, http.StatusOK, gin.H{"status": "ok"})
	}
}

func (s *Server) modelEntry() modelJSON {
	m := modelJSON{ID: s.cfg.ModelName, Object: "model", Created: s.created, OwnedBy: "conveyor"}
	if b := s.backend.Load(); b != nil {
		m.MaxModelLen = b.MaxModelLen
	}
	return m
}

// handleModels serves GET /v1/models.
func (s *Server) handleModels(c *gin.Context) {
	writeJSON(c.Writer, http.StatusOK, gin.H{"object": "list", "data": []modelJSON{s.modelEntry()}})
}

// handleModel serves GET /v1/models/{id}; ids may contain slashes ("org/name").
func (s *Server) handleModel(c *gin.Context) {
	id := strings.TrimPrefix(c.Param("id"), "/")
	if id != s.cfg.ModelName {
		writeError(c.Writer, modelNotFound(id))
		return
	}
	writeJSON(c.Writer, http.StatusOK, s.modelEntry())
}

// handleTokenize serves POST /tokenize: {"prompt": text} or {"messages": [...]}, with
// add_special_tokens (default true for a prompt, false for messages, whose template
// adds them) → {"tokens", "count", "max_model_len"}.
func (s *Server) handleTokenize(c *gin.Context) {
	b, err := s.ready()
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	f, err := readBody(c.Request)
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	if m, ok := f.string("model"); ok && m != s.cfg.ModelName {
		writeError(c.Writer, modelNotFound(m))
		return
	}
	var text string
	var addSpecial bool
	switch {
	case f.has("messages"):
		msgs := parseMessages(f)
		addGen := f.bool("add_generation_prompt", true)
		addSpecial = f.bool("add_special_tokens", false)
		if f.err != nil {
			writeError(c.Writer, f.err)
			return
		}
		text, err = b.Tokenizer.ApplyChatTemplate(msgs, addGen)
		if err != nil {
			writeError(c.Writer, invalidParam("messages", "the messages could not be rendered with the chat template: %v", err))
			return
		}
	default:
		p, ok := f.string("prompt")
		addSpecial = f.bool("add_special_tokens", true)
		if f.err == nil && !ok {
			f.fail(invalidParam("prompt", "prompt (a string) or messages is required"))
		}
		if f.err != nil {
			writeError(c.Writer, f.err)
			return
		}
		text = p
	}
	ids, err := b.Tokenizer.Encode(text, addSpecial)
	if err != nil {
		writeError(c.Writer, invalidParam("prompt", "could not tokenize: %v", err))
		return
	}
	if ids == nil {
		ids = []int32{}
	}
	writeJSON(c.Writer, http.StatusOK, gin.H{"tokens": ids, "count": len(ids), "max_model_len": b.MaxModelLen})
}

// handleDetokenize serves POST /detokenize: {"tokens": [ids]} → {"prompt": text}.
func (s *Server) handleDetokenize(c *gin.Context) {
	b, err := s.ready()
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	f, err := readBody(c.Request)
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	if m, ok := f.string("model"); ok && m != s.cfg.ModelName {
		writeError(c.Writer, modelNotFound(m))
		return
	}
	ids := parseTokenIDs(f, "tokens", b.vocab(), true)
	if f.err == nil && !f.has("tokens") {
		f.fail(invalidParam("tokens", "tokens is required"))
	}
	if f.err != nil {
		writeError(c.Writer, f.err)
		return
	}
	writeJSON(c.Writer, http.StatusOK, gin.H{"prompt": b.Tokenizer.Decode(ids, false)})
}
