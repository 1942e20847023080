package api

import (
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
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

// limitBody enforces Config.MaxBodyBytes. A body whose Content-Length is over the limit
// is refused at once; one without a Content-Length (chunked) fails its read at the limit
// and the handler refuses it. Either way the answer is a 413 with "Connection: close"
// (see writeError), sent first, and then the rest of the body is read and discarded up
// to discardExtraBytes. A client that sent "Expect: 100-continue" gets the 413 instead
// of the 100 and sends no body, so there is nothing to discard.
func (s *Server) limitBody(c *gin.Context) {
	r := c.Request
	if r.ContentLength > s.cfg.MaxBodyBytes {
		writeError(c.Writer, errorf(errBodyTooLarge, "request body is larger than %d bytes", s.cfg.MaxBodyBytes))
		c.Abort()
		if !expectsContinue(r) {
			s.discardBody(c, r.Body)
		}
		return
	}
	body := &limitedBody{rc: r.Body, left: s.cfg.MaxBodyBytes, limit: s.cfg.MaxBodyBytes}
	r.Body = body
	c.Next()
	if body.over {
		s.discardBody(c, body.rc)
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
