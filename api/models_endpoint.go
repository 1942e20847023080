package api

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
)

// modelEntry is the served model as /v1/models lists it.
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

// modelNotFound is the 404 for a model this server does not serve.
func modelNotFound(name string) error {
	return &paramError{param: "model", kind: errModelNotFound, msg: fmt.Sprintf("the model %q does not exist", name)}
}
