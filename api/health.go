package api

import (
	"net/http"

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

// handleEngineStats serves GET /v1/engine/stats, the chat page's live view of the engine.
func (s *Server) handleEngineStats(c *gin.Context) {
	b, err := s.ready()
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	writeJSON(c.Writer, http.StatusOK, webui.StatsFrom(b.Engine.Stats()))
}
