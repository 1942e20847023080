package api

import (
	"encoding/json"
	"net/http"

	"github.com/conveyor-llm/conveyor/api/openai"
)

// sseWriter writes Server-Sent Events the way OpenAI clients expect: `data: <json>` and a
// blank line per event, flushed at once, no `event:` names, `data: [DONE]` at the end.
// Headers (200, text/event-stream) go out lazily with the first write, so an error found
// before that can still be a plain JSON response with its own status.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	failed  bool // a write failed: the client is gone
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// start sends the 200 and the SSE headers once.
func (s *sseWriter) start() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
}

// write sends raw bytes and flushes them.
func (s *sseWriter) write(b []byte) error {
	if s.failed {
		return http.ErrHandlerTimeout
	}
	s.start()
	if _, err := s.w.Write(b); err != nil {
		s.failed = true
		return err
	}
	if err := s.rc.Flush(); err != nil {
		s.failed = true
		return err
	}
	return nil
}

// data sends v as one `data:` event.
func (s *sseWriter) data(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(b)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	return s.write(buf)
}

// keepAlive sends an SSE comment line, which clients ignore, so that proxies and clients
// do not time out while a long prompt is prefilled or the request waits in the queue.
func (s *sseWriter) keepAlive() error { return s.write([]byte(": keep-alive\n\n")) }

// done ends the stream.
func (s *sseWriter) done() error { return s.write([]byte("data: [DONE]\n\n")) }

// fail reports err: as a JSON response with its status when nothing was sent yet,
// otherwise in-band as `data: {"error": {...}}` followed by [DONE].
func (s *sseWriter) fail(err error) {
	if !s.started {
		writeError(s.w, err)
		s.started = true
		return
	}
	_, body := classify(err)
	_ = s.data(body)
	_ = s.done()
}

// responseStream writes a streamed response's events as OpenAI does: `event: <type>`
// and `data: <json>` per event, each with the next sequence_number, and no [DONE].
type responseStream struct {
	sse *sseWriter
	seq int
}

func (st *responseStream) send(ev openai.ResponseEvent) {
	ev.SequenceNumber = st.seq
	st.seq++
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	buf := make([]byte, 0, len(b)+len(ev.Type)+16)
	buf = append(buf, "event: "...)
	buf = append(buf, ev.Type...)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	_ = st.sse.write(buf)
}

// finish sends the terminal event: response.completed or response.incomplete, or on
// failure an error event and response.failed.
func (st *responseStream) finish(resp *openai.Response, err error) {
	if err != nil {
		_, body := classify(err)
		st.send(openai.ResponseEvent{Type: "error", Code: body.Error.Code, Message: body.Error.Message, Param: body.Error.Param})
		resp.Status, resp.Error = openai.StatusFailed, &openai.ResponseError{Code: errorCode(err), Message: body.Error.Message}
		st.send(openai.ResponseEvent{Type: "response.failed", Response: resp})
		return
	}
	typ := "response.completed"
	if resp.Status == openai.StatusIncomplete {
		typ = "response.incomplete"
	}
	st.send(openai.ResponseEvent{Type: typ, Response: resp})
}
