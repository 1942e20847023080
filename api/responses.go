package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
)

// The /v1/responses endpoint (OpenAI's Responses API) runs on the chat endpoint's
// machinery: the request is decoded once (openai.ResponsesRequest), its input items become chat
// messages rendered through the chat template, its sampling members go through
// generationRequest.parse, text.format through response_format's constraint, and its
// function tools through the chat tool plan (parseTools, toolPlan.apply). The
// generation is read by the chat openai.Converter in streaming mode, whose deltas
// responseBuilder turns into output items and, streamed, into the Responses events.
//
// State lives in a respstore.Store (ResponsesConfig.Store): a stored response is written
// once it ends (before its last event or its body is sent, so that a client that got it
// can continue from it at once), a background one also when it is queued and when it
// starts. Without a store, store:true, background and previous_response_id are 400s that
// say why.

// responseRoutes registers the /v1/responses routes.
func (s *Server) responseRoutes(r gin.IRoutes) {
	r.POST("/v1/responses", s.handleResponsesCreate)
	get(r, "/v1/responses/:id", s.handleResponsesGet)
	r.DELETE("/v1/responses/:id", s.handleResponsesDelete)
	get(r, "/v1/responses/:id/input_items", s.handleResponsesInputItems)
	r.POST("/v1/responses/:id/cancel", s.handleResponsesCancel)
}

// handleResponsesCreate serves POST /v1/responses.
func (s *Server) handleResponsesCreate(c *gin.Context) {
	rt := s.resp
	b, req, ok := openRequest(s, c, func(w *openai.ResponsesRequest, m *openai.Model) (*openai.ParsedResponses, error) {
		return openai.ParseResponses(w, m, rt.lookup, !rt.cfg.NoStoreByDefault)
	})
	if !ok {
		return
	}
	releaseBody(c)
	if req.Store && rt.cfg.Store == nil {
		writeError(c.Writer, openai.UnsupportedValue("store", "store is not available on this server (%s): send \"store\": false", rt.cfg.Unavailable))
		return
	}
	if req.Model != s.cfg.ModelName {
		writeError(c.Writer, openai.ModelNotFound(req.Model))
		return
	}
	resp := req.Echo
	resp.ID, resp.Object, resp.CreatedAt, resp.Status, resp.Output = openai.NewID("resp_"), "response", time.Now().Unix(), openai.StatusInProgress, []openai.ResponseItem{}
	c.Set(completionIDKey, resp.ID)
	sr := &storedResponse{Response: resp, Input: req.Input, Context: req.Context}
	if err := rt.checkStorable(req, sr); err != nil {
		writeError(c.Writer, err)
		return
	}
	if req.Background {
		s.startBackground(c, b, req, sr)
		return
	}
	s.active.Add(1)
	defer s.active.Done()
	ctx := c.Request.Context()
	jobs, err := s.submitAll(ctx, b, resp.ID, [][]int32{req.Prompt}, req.Params, req.Names)
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	var st *responseStream
	if req.Stream {
		st = &responseStream{sse: newSSEWriter(c.Writer)}
		snap := sr.Response
		st.send(openai.ResponseEvent{Type: "response.created", Response: &snap})
		st.send(openai.ResponseEvent{Type: "response.in_progress", Response: &snap})
	}
	err = s.generateResponse(ctx, b, req, jobs, &sr.Response, st)
	if ctx.Err() != nil && !s.Draining() {
		return // the client went away: nothing is delivered, nothing is kept
	}
	if err == nil && req.Store {
		if perr := rt.put(sr); perr != nil {
			err = perr
			sr.Response.Status, sr.Response.Error = openai.StatusFailed, &openai.ResponseError{Code: "server_error", Message: perr.Error()}
		}
	}
	if st == nil {
		if err != nil {
			writeError(c.Writer, err)
			return
		}
		writeJSON(c.Writer, http.StatusOK, sr.Response)
		return
	}
	st.finish(&sr.Response, err)
}

// startBackground submits a background response, stores it as queued, answers with it
// and runs it on its own goroutine under the runtime's context.
func (s *Server) startBackground(c *gin.Context, b *Backend, req *openai.ParsedResponses, sr *storedResponse) {
	rt := s.resp
	ctx, cancel := context.WithCancel(rt.ctx)
	jobs, err := s.submitAll(ctx, b, sr.Response.ID, [][]int32{req.Prompt}, req.Params, req.Names)
	if err != nil {
		cancel()
		writeError(c.Writer, err)
		return
	}
	refuse := func(err error) {
		abortJobs(b, jobs)
		for _, j := range jobs {
			go j.drain()
		}
		cancel()
		writeError(c.Writer, err)
	}
	sr.Response.Status = openai.StatusQueued
	if err := rt.put(sr); err != nil {
		refuse(err)
		return
	}
	run := &backgroundRun{cancel: cancel, done: make(chan struct{})}
	rt.mu.Lock()
	if rt.closing {
		rt.mu.Unlock()
		_ = rt.cfg.Store.Delete(sr.Response.ID)
		refuse(fmt.Errorf("the server is shutting down: %w", errNotReady))
		return
	}
	rt.running[sr.Response.ID] = run
	rt.wg.Add(1) // under mu, so that shutdown's Wait never races an Add
	rt.mu.Unlock()
	queued := sr.Response
	go func() {
		defer rt.wg.Done()
		defer close(run.done)
		defer cancel()
		started := *sr
		started.Response.Status = openai.StatusInProgress
		if err := rt.put(&started); err != nil {
			rt.log.Error("responses: storing a background response", "id", sr.Response.ID, "err", err)
		}
		sr.Response.Status = openai.StatusInProgress
		err := s.generateResponse(ctx, b, req, jobs, &sr.Response, nil)
		rt.mu.Lock()
		cancelled := run.cancelled
		delete(rt.running, sr.Response.ID)
		rt.mu.Unlock()
		switch {
		case cancelled:
			sr.Response.Status = openai.StatusCancelled
		case err != nil:
			_, body := classify(err)
			code := "server_error"
			if body.Error.Code != nil {
				code = *body.Error.Code
			}
			sr.Response.Status, sr.Response.Error = openai.StatusFailed, &openai.ResponseError{Code: code, Message: err.Error()}
		}
		if err := rt.put(sr); err != nil {
			rt.log.Error("responses: storing a background response", "id", sr.Response.ID, "err", err)
		}
	}()
	writeJSON(c.Writer, http.StatusOK, queued)
}

// generateResponse reads the events of a response's job until it ends and fills in
// resp: its output, usage and status (completed or incomplete). It returns the error
// that failed the response; ctx's end aborts it (and returns ctx's error). st, when not
// nil, receives the item events, and keep-alive comments in silences; a write to it that
// fails (the client is gone) aborts the response.
func (s *Server) generateResponse(ctx context.Context, b *Backend, req *openai.ParsedResponses, jobs []*job, resp *openai.Response,
	st *responseStream) error {
	m := mergeEvents(ctx, jobs)
	defer m.stop()
	abort := func() {
		abortJobs(b, jobs)
		m.stop()
	}
	var emit func(openai.ResponseEvent)
	if st != nil {
		emit = st.send
	}
	rb := openai.NewResponseBuilder(req, b.Tokenizer, s.metrics.rejectToolCalls, emit)
	ticker := time.NewTicker(s.cfg.KeepAliveInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			abort()
			if s.Draining() {
				return fmt.Errorf("the server is shutting down: %w", engine.ErrClosed)
			}
			return ctx.Err()
		case <-ticker.C:
			if st != nil && st.sse.keepAlive() != nil {
				abort()
				return errors.New("the client went away")
			}
		case je, ok := <-m.events:
			if !ok {
				if ctx.Err() != nil {
					abort()
					return ctx.Err()
				}
				rb.Finish(resp, totalUsage(jobs), time.Now().Unix())
				return nil
			}
			ticker.Reset(s.cfg.KeepAliveInterval)
			ev := je.ev
			if isFailure(ev) || ev.Index != 0 {
				abort()
				if !isFailure(ev) {
					ev.Err = fmt.Errorf("the engine sent sequence index %d of 1: %w", ev.Index, engine.ErrModel)
				}
				return eventError(ev)
			}
			rb.Add(&ev)
			if st != nil && st.sse.failed {
				abort()
				return errors.New("the client went away")
			}
		}
	}
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
		code := "server_error"
		if body.Error.Code != nil {
			code = *body.Error.Code
		}
		resp.Status, resp.Error = openai.StatusFailed, &openai.ResponseError{Code: code, Message: body.Error.Message}
		st.send(openai.ResponseEvent{Type: "response.failed", Response: resp})
		return
	}
	typ := "response.completed"
	if resp.Status == openai.StatusIncomplete {
		typ = "response.incomplete"
	}
	st.send(openai.ResponseEvent{Type: typ, Response: resp})
}
