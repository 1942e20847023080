package api

import (
	"net/http"

	"github.com/conveyor-llm/conveyor/api/webui"
	"github.com/gin-gonic/gin"
)

// handleHealth serves GET /health: 200 {"status":"ok"} when the model is loaded, the
// engine can serve and the server is not draining (nor made Unready), 503 otherwise; an engine that cannot
// serve (engine.Stats.Unhealthy: its forward passes keep failing) answers
// {"status":"unhealthy","reason":...}.
func (s *Server) handleHealth(c *gin.Context) {
	b := s.backend.Load()
	switch {
	case s.draining.Load() || s.unready.Load():
		writeJSON(c.Writer, http.StatusServiceUnavailable, gin.H{"status": "draining"})
	case b == nil:
		writeJSON(c.Writer, http.StatusServiceUnavailable, gin.H{"status": "loading"})
	default:
		if why := b.Engine.Stats().Unhealthy; why != "" {
			writeJSON(c.Writer, http.StatusServiceUnavailable, gin.H{"status": "unhealthy", "reason": why})
			return
		}
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
