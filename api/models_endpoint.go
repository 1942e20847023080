package api

import (
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/conveyor-llm/conveyor/api/openai"
)

// modelEntry is the served model as /v1/models lists it.
func (s *Server) modelEntry() openai.ModelCard {
	m := openai.ModelCard{ID: s.cfg.ModelName, Object: "model", Created: s.created, OwnedBy: "conveyor"}
	if b := s.backend.Load(); b != nil {
		m.MaxModelLen = b.MaxModelLen
		m.Quantization, m.KVCacheDType = b.Quantization, b.KVCacheDType
	}
	return m
}

// handleModels serves GET /v1/models.
func (s *Server) handleModels(c *gin.Context) {
	writeJSON(c.Writer, http.StatusOK, openai.ModelList{Object: "list", Data: []openai.ModelCard{s.modelEntry()}})
}

// handleModel serves GET /v1/models/{id}; ids may contain slashes ("org/name").
func (s *Server) handleModel(c *gin.Context) {
	id := strings.TrimPrefix(c.Param("id"), "/")
	if id != s.cfg.ModelName {
		writeError(c.Writer, openai.ModelNotFound(id))
		return
	}
	writeJSON(c.Writer, http.StatusOK, s.modelEntry())
}
