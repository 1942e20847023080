package api

import (
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/conveyor-llm/conveyor/api/openai"
)

// Gin context keys: the request id, and the completion id a generation handler assigns
// (cmpl-…, chatcmpl-…; it is the engine request id), so log lines join both.
const (
	requestIDKey    = "request_id"
	completionIDKey = "completion_id"
)

// validRequestID accepts a client's X-Request-Id if it is short and printable ASCII.
func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// requestLog assigns a request id (the client's X-Request-Id when sane, else a new one),
// echoes it in the response, and logs one line per request when it ends.
func (s *Server) requestLog(c *gin.Context) {
	start := time.Now()
	id := c.GetHeader("X-Request-Id")
	if !validRequestID(id) {
		id = openai.NewID("req-")
	}
	c.Set(requestIDKey, id)
	c.Header("X-Request-Id", id)
	c.Next()
	status := c.Writer.Status()
	level := slog.LevelInfo
	switch {
	case status == http.StatusServiceUnavailable && c.Request.URL.Path == "/health":
		// /health's own answer while loading or draining: not a failure.
	case status == http.StatusServiceUnavailable:
		level = slog.LevelWarn // not ready (loading, draining): the client may retry
	case status >= 500:
		level = slog.LevelError
	}
	attrs := []slog.Attr{slog.String("request_id", id)}
	if cid := c.GetString(completionIDKey); cid != "" {
		attrs = append(attrs, slog.String("completion_id", cid))
	}
	s.log.LogAttrs(c.Request.Context(), level, "request", append(attrs,
		slog.String("method", c.Request.Method),
		slog.String("path", c.Request.URL.Path),
		slog.Int("status", status),
		slog.Int("bytes", c.Writer.Size()),
		slog.Duration("duration", time.Since(start)),
		slog.String("remote", c.ClientIP()),
	)...)
}

// recoverPanic turns a handler panic into a 500 with the OpenAI error object (when no
// header went out yet) and a logged stack; the server keeps serving.
func (s *Server) recoverPanic(c *gin.Context) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("handler panic", "request_id", c.GetString(requestIDKey), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if !c.Writer.Written() {
				writeError(c.Writer, fmt.Errorf("internal error"))
			}
			c.Abort()
		}
	}()
	c.Next()
}

// requireKey checks "Authorization: Bearer <key>" when an API key is configured.
func (s *Server) requireKey(c *gin.Context) {
	if s.cfg.APIKey == "" {
		c.Next()
		return
	}
	auth := c.GetHeader("Authorization")
	// The scheme name is case-insensitive (RFC 9110 section 11.1): "bearer KEY" is fine.
	scheme, token, ok := strings.Cut(strings.TrimSpace(auth), " ")
	ok = ok && strings.EqualFold(scheme, "Bearer")
	if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), []byte(s.cfg.APIKey)) != 1 {
		c.Header("WWW-Authenticate", `Bearer realm="conveyor"`)
		msg := "missing API key: send Authorization: Bearer <key>"
		if auth != "" {
			msg = "incorrect API key provided"
		}
		writeError(c.Writer, openai.Errorf(openai.ErrUnauthorized, "%s", msg))
		c.Abort()
		return
	}
	c.Next()
}
