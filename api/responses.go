package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/api/responses"
	"github.com/conveyor-llm/conveyor/engine"
)

// The /v1/responses endpoint (OpenAI's Responses API) runs on the chat endpoint's
// machinery: the request is decoded once and validated by openai.ParseResponses, whose
// input items become chat messages rendered through the chat template and whose
// sampling members, text.format and function tools go through the chat endpoint's
// rules and tool plan. The generation is read by openai.ResponseBuilder, which turns
// the chat converter's deltas into output items and, streamed, into the Responses
// events (responseStream, sse.go).
//
// State lives in package api/responses over a respstore.Store (responses.Config.Store):
// a stored response is written once it ends (before its last event or its body is sent,
// so that a client that got it can continue from it at once), a background one also when
// it is queued and when it starts. Without a store, store:true, background and
// previous_response_id are 400s that say why.

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
		return openai.ParseResponses(w, m, rt.Lookup, rt.DefaultStore())
	})
	if !ok {
		return
	}
	releaseBody(c)
	if err := rt.CheckStore(req.Store); err != nil {
		writeError(c.Writer, err)
		return
	}
	if req.Model != s.cfg.ModelName {
		writeError(c.Writer, openai.ModelNotFound(req.Model))
		return
	}
	resp := req.Echo
	resp.ID, resp.Object, resp.CreatedAt, resp.Status, resp.Output = openai.NewID("resp_"), "response", time.Now().Unix(), openai.StatusInProgress, []openai.ResponseItem{}
	c.Set(completionIDKey, resp.ID)
	sr := &responses.Stored{Response: resp, Input: req.Input, Context: req.Context}
	if req.Store {
		if err := rt.CheckStorable(sr, req.Params.MaxTokens); err != nil {
			writeError(c.Writer, err)
			return
		}
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
		// The client went away: nothing more is delivered. A stream already told it the
		// response's id, so a stored response is kept, as cancelled (as a cancelled
		// background response is: status cancelled, no output).
		if st != nil && req.Store {
			sr.Response.Status, sr.Response.Error, sr.Response.Output = openai.StatusCancelled, nil, nil
			if perr := rt.Put(sr); perr != nil {
				s.log.Warn("responses: storing a response whose client went away", "id", resp.ID, "err", perr)
			}
		}
		return
	}
	if err == nil && req.Store {
		if perr := rt.Put(sr); perr != nil {
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

// startBackground submits a background response and hands it to the runtime, which
// stores it as queued and runs it on its own goroutine; the answer is the queued
// response. The response outlives the request that starts it: its context keeps none of
// the request's cancellation.
func (s *Server) startBackground(c *gin.Context, b *Backend, req *openai.ParsedResponses, sr *responses.Stored) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(c.Request.Context()))
	jobs, err := s.submitAll(ctx, b, sr.Response.ID, [][]int32{req.Prompt}, req.Params, req.Names)
	if err != nil {
		cancel()
		writeError(c.Writer, err)
		return
	}
	queued, err := s.resp.Start(sr, cancel, func() {
		if err := s.generateResponse(ctx, b, req, jobs, &sr.Response, nil); err != nil {
			sr.Response.Status, sr.Response.Error = openai.StatusFailed, &openai.ResponseError{Code: errorCode(err), Message: err.Error()}
		}
	})
	if err != nil {
		abortJobs(b, jobs)
		for _, j := range jobs {
			go j.drain()
		}
		cancel()
		writeError(c.Writer, err)
		return
	}
	writeJSON(c.Writer, http.StatusOK, queued)
}

// generateResponse reads the events of a response's job until it ends and fills in
// resp: its output, usage and status (completed or incomplete). It returns the error
// that failed the response; ctx's end aborts it (and returns ctx's error). st, when not
// nil, receives the item events, and keep-alive comments in silences; a write to it that
// fails (the client is gone) aborts the response.
func (s *Server) generateResponse(ctx context.Context, b *Backend, req *openai.ParsedResponses, jobs []*job, resp *openai.Response,
	st *responseStream) error {
	var emit func(openai.ResponseEvent)
	var keepAlive func() error
	if st != nil {
		emit, keepAlive = st.send, st.sse.keepAlive
	}
	rb := openai.NewResponseBuilder(req, b.Tokenizer, s.metrics.rejectToolCalls, emit)
	err := s.readEvents(ctx, b, jobs, 1, keepAlive, func(_ int, ev *engine.Event) error {
		rb.Add(ev)
		if st != nil && st.sse.failed {
			return errClientGone
		}
		return nil
	})
	if err == nil {
		rb.Finish(resp, totalUsage(jobs), time.Now().Unix())
	}
	return err
}

// handleResponsesGet serves GET /v1/responses/{id}.
func (s *Server) handleResponsesGet(c *gin.Context) {
	if v := c.Query("stream"); v != "" && v != "false" {
		writeError(c.Writer, openai.UnsupportedValue("stream", "streaming a stored response again is not supported"))
		return
	}
	sr, err := s.resp.Get(c.Param("id"))
	writeStored(c.Writer, sr, err)
}

// writeStored writes the stored response sr, or err.
func writeStored(w http.ResponseWriter, sr *responses.Stored, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, sr.Response)
}

// handleResponsesDelete serves DELETE /v1/responses/{id}; a running background response
// is cancelled first.
func (s *Server) handleResponsesDelete(c *gin.Context) {
	id := c.Param("id")
	if err := s.resp.Delete(id); err != nil {
		writeError(c.Writer, err)
		return
	}
	writeJSON(c.Writer, http.StatusOK, openai.ResponseDeleted{ID: id, Object: "response.deleted", Deleted: true})
}

// handleResponsesCancel serves POST /v1/responses/{id}/cancel: a background response
// that has not finished ends as cancelled; a finished one is returned as it is.
func (s *Server) handleResponsesCancel(c *gin.Context) {
	sr, err := s.resp.Cancel(c.Param("id"))
	writeStored(c.Writer, sr, err)
}

// handleResponsesInputItems serves GET /v1/responses/{id}/input_items: the input items
// of that request, paginated as OpenAI's lists: limit 1..100 (20), order asc or desc
// (desc), after an item id.
func (s *Server) handleResponsesInputItems(c *gin.Context) {
	limit := 20
	if v, ok := c.GetQuery("limit"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeError(c.Writer, openai.InvalidParam("limit", "limit must be an integer between 1 and 100, got %q", v))
			return
		}
		limit = n
	}
	order := c.DefaultQuery("order", "desc")
	if order != "asc" && order != "desc" {
		writeError(c.Writer, openai.InvalidParam("order", "order must be asc or desc, got %q", order))
		return
	}
	sr, err := s.resp.Get(c.Param("id"))
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	var after *string
	if v, ok := c.GetQuery("after"); ok {
		after = &v
	}
	page, err := sr.InputPage(limit, order, after)
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	writeJSON(c.Writer, http.StatusOK, page)
}
