package api

import (
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/conveyor-llm/conveyor/api/openai"
)

// What the server reads of a body it refused for its size, so that the client gets to
// read the 413. A server that answers and closes while the client is still sending
// resets the connection (the unread bytes turn the close into a TCP RST), and a client
// that writes its whole body before reading the answer (curl, Python's http.client and
// requests) then sees "connection reset" instead of the error. Reading and discarding
// the rest lets it finish; the cap and the deadline bound what a client can make the
// server read for nothing.
const (
	discardExtraBytes = 64 << 20 // read at most this much past Config.MaxBodyBytes
	discardTimeout    = 10 * time.Second
)

// limitBody enforces Config.MaxBodyBytes and Config.MaxBodyBytesInFlight. A body whose
// Content-Length is over the limit is refused at once; one without a Content-Length
// (chunked) fails its read at the limit and the handler refuses it. Either way the answer
// is a 413 with "Connection: close" (see writeError), sent first, and then the rest of the
// body is read and discarded up to discardExtraBytes. A client that sent "Expect:
// 100-continue" gets the 413 instead of the 100 and sends no body, so there is nothing
// to discard.
//
// A body that may be read waits for its size in s.bodies first (a client that goes away
// while waiting costs nothing more), then has Config.BodyReadTimeout to arrive. A
// handler that goes on after parsing (generation) gives the room back with releaseBody,
// which also lifts the deadline; otherwise the room is returned when the handler ends.
func (s *Server) limitBody(c *gin.Context) {
	r := c.Request
	if r.ContentLength > s.cfg.MaxBodyBytes {
		writeError(c.Writer, openai.Errorf(openai.ErrBodyTooLarge, "request body is larger than %d bytes", s.cfg.MaxBodyBytes))
		c.Abort()
		if !expectsContinue(r) {
			s.discardBody(c, r.Body)
		}
		return
	}
	if weight := bodyWeight(r, s.cfg.MaxBodyBytes); weight > 0 {
		if err := s.bodies.Acquire(r.Context(), weight); err != nil {
			c.Abort() // the client went away while waiting
			return
		}
		rc := http.NewResponseController(c.Writer)
		_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyReadTimeout))
		held := true
		c.Set(bodyReleaseKey, func() {
			// The body is read: the connection's own reads (is the client still
			// there?) must not time out while the response streams.
			_ = rc.SetReadDeadline(time.Time{})
			if held {
				held = false
				s.bodies.Release(weight)
			}
		})
		defer func() {
			// The deadline stays: net/http may still read what the handler left of the
			// body, and a client that stopped sending it must not hold the response.
			if held {
				held = false
				s.bodies.Release(weight)
			}
		}()
	}
	body := &limitedBody{rc: r.Body, left: s.cfg.MaxBodyBytes, limit: s.cfg.MaxBodyBytes}
	r.Body = body
	c.Next()
	if body.over {
		s.discardBody(c, body.rc)
	}
}

const bodyReleaseKey = "conveyor.bodyRelease"

// bodyWeight is what a request's body takes of Config.MaxBodyBytesInFlight: its
// Content-Length, or the limit when the length is not known in advance.
func bodyWeight(r *http.Request, limit int64) int64 {
	switch {
	case r.Body == nil || r.Body == http.NoBody:
		return 0
	case r.ContentLength >= 0:
		return r.ContentLength
	default:
		return limit
	}
}

// releaseBody gives back the room the request's body took in Config.MaxBodyBytesInFlight
// and lifts the body's read deadline; a handler calls it once it has parsed the body and
// goes on to generate. It may be called more than once.
func releaseBody(c *gin.Context) {
	if f, ok := c.Get(bodyReleaseKey); ok {
		f.(func())()
	}
}

// discardBody sends the response written so far and reads up to discardExtraBytes of
// what is left of the body, within discardTimeout.
func (s *Server) discardBody(c *gin.Context, body io.Reader) {
	c.Writer.Flush()
	rc := http.NewResponseController(c.Writer)
	_ = rc.SetReadDeadline(time.Now().Add(discardTimeout)) // not every writer has one (httptest)
	_, _ = io.CopyN(io.Discard, body, discardExtraBytes)
}

func expectsContinue(r *http.Request) bool {
	return strings.EqualFold(strings.TrimSpace(r.Header.Get("Expect")), "100-continue")
}

// limitedBody is http.MaxBytesReader without its side effects: past the limit a read
// fails with *http.MaxBytesError (readBody turns it into the 413), and the underlying
// body stays readable so that limitBody can discard the rest.
type limitedBody struct {
	rc    io.ReadCloser
	left  int64 // bytes still allowed
	limit int64
	over  bool // a read went past the limit
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.over {
		return 0, &http.MaxBytesError{Limit: b.limit}
	}
	if room := b.left + 1; room > 0 && int64(len(p)) > room {
		p = p[:room] // one byte more tells a body at the limit from one over it
	}
	n, err := b.rc.Read(p)
	if int64(n) <= b.left {
		b.left -= int64(n)
		return n, err
	}
	n, b.left, b.over = int(b.left), 0, true
	return n, &http.MaxBytesError{Limit: b.limit}
}

func (b *limitedBody) Close() error { return b.rc.Close() }
