package api

import (
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/conveyor-llm/conveyor/api/openai"
)

// openRequest opens every handler that takes a body: the model must be loaded and the
// server not draining, the body is read and decoded once into the endpoint's wire struct
// W, and parse validates it into the endpoint's request R. On any failure the OpenAI
// error object is written with its status and ok is false; the handler then returns.
func openRequest[W, R any](s *Server, c *gin.Context, parse func(w *W, m *openai.Model) (R, error)) (b *Backend, req R, ok bool) {
	b, err := s.ready()
	if err == nil {
		var w W
		if err = readBody(c.Request, &w); err == nil {
			req, err = parse(&w, b.model)
		}
	}
	if err != nil {
		writeError(c.Writer, err)
		return nil, req, false
	}
	return b, req, true
}

// readBody reads a request body (bounded by limitBody) and decodes it into dst, a
// pointer to one endpoint's wire struct (openai.DecodeBody). It fails with a 415 for a
// compressed body and a 413 when the body is over the limit.
func readBody(r *http.Request, dst any) error {
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		// RFC 9110 section 8.4.1: a server refuses an encoding it does not decode with 415.
		return openai.Errorf(openai.ErrContentEncoding, "Content-Encoding %q is not supported; send the JSON body uncompressed", enc)
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return openai.Errorf(openai.ErrBodyTooLarge, "request body is larger than %d bytes", mbe.Limit)
		}
		return openai.InvalidParam("", "could not read the request body: %v", err)
	}
	return openai.DecodeBody(data, dst)
}
