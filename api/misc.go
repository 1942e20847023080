package api

import (
	"net/http"
	"strings"

	"github.com/conveyor-llm/conveyor/api/webui"
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
		m.Quantization, m.KVCacheDType = b.Quantization, b.KVCacheDType
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

// handleTokenize serves POST /tokenize: {"prompt": text, "add_special_tokens": bool (default
// true)} or {"messages": [...], "add_generation_prompt": bool (default true)}, tokenized
// exactly as the completion and chat endpoints would → {"tokens", "count", "max_model_len"}.
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
	var ids []int32
	if f.has("messages") {
		msgs := parseMessages(f)
		addGen := f.bool("add_generation_prompt", true)
		if f.err != nil {
			writeError(c.Writer, f.err)
			return
		}
		if ids, err = b.Tokenizer.EncodeChat(msgs, addGen); err != nil {
			writeError(c.Writer, invalidParam("messages", "the messages could not be rendered with the chat template: %v", err))
			return
		}
	} else {
		p, ok := f.string("prompt")
		addSpecial := f.bool("add_special_tokens", true)
		if f.err == nil && !ok {
			f.fail(invalidParam("prompt", "prompt (a string) or messages is required"))
		}
		if f.err != nil {
			writeError(c.Writer, f.err)
			return
		}
		if ids, err = b.Tokenizer.Encode(p, addSpecial); err != nil {
			writeError(c.Writer, invalidParam("prompt", "could not tokenize: %v", err))
			return
		}
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

// handleEngineStats serves GET /v1/engine/stats, the chat page's live view of the engine.
func (s *Server) handleEngineStats(c *gin.Context) {
	b, err := s.ready()
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	writeJSON(c.Writer, http.StatusOK, webui.StatsFrom(b.Engine.Stats()))
}
