package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/gin-gonic/gin"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/api/respstore"
	"github.com/conveyor-llm/conveyor/engine"
)

// ResponsesConfig configures the state of /v1/responses.
type ResponsesConfig struct {
	// Store keeps stored responses; nil refuses store:true (OpenAI's default),
	// background and previous_response_id with a 400 that gives Unavailable as the reason.
	Store *respstore.Store
	// Unavailable says why there is no store ("no --data-dir was given", an open error).
	Unavailable string
	// NoStoreByDefault makes an omitted store mean false (run-batch, whose results are its
	// output file); OpenAI's default is true.
	NoStoreByDefault bool
}

// storedResponse is what the store keeps per response (respstore.Record.Data).
type storedResponse struct {
	Response openai.Response       `json:"response"`
	Input    []openai.ResponseItem `json:"input"`
	// Context is the conversation before Input (from previous_response_id).
	Context []openai.ResponseItem `json:"context,omitempty"`
}

// responsesRuntime is the server's /v1/responses state: the store and the background
// responses running in this process.
type responsesRuntime struct {
	cfg ResponsesConfig
	log *slog.Logger

	ctx    context.Context // background responses run under it; shutdown cancels it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[string]*backgroundRun
	closing bool // shutdown began: no background response starts

	// putFault, set only by tests, fails a store write (a full disk) before it reaches
	// the store.
	putFault atomic.Pointer[func(respstore.Record) error]
}

// backgroundRun is one background response running in this process.
type backgroundRun struct {
	cancel    context.CancelFunc
	done      chan struct{}
	cancelled bool // by POST /cancel, not by shutdown; REQUIRES responsesRuntime.mu
}

// Statuses of a response that has not ended, and the error a restart leaves on them.
var unfinishedStatuses = []string{openai.StatusQueued, openai.StatusInProgress}

const restartFailure = "the server stopped before this response finished"

func newResponsesRuntime(cfg ResponsesConfig, log *slog.Logger) *responsesRuntime {
	ctx, cancel := context.WithCancel(context.Background())
	rt := &responsesRuntime{cfg: cfg, log: log, ctx: ctx, cancel: cancel, running: map[string]*backgroundRun{}}
	if cfg.Store == nil {
		return rt
	}
	// Responses that were queued or running when the previous process ended never finish.
	recs, err := cfg.Store.Unfinished(unfinishedStatuses...)
	if err != nil {
		log.Error("responses: reading unfinished responses", "err", err)
	}
	for _, rec := range recs {
		var sr storedResponse
		if err := json.Unmarshal(rec.Data, &sr); err != nil {
			continue
		}
		sr.Response.Status = openai.StatusFailed
		sr.Response.Error = &openai.ResponseError{Code: "server_error", Message: restartFailure}
		if err := rt.put(&sr); err != nil {
			log.Error("responses: marking an unfinished response failed", "id", rec.ID, "err", err)
		}
	}
	if len(recs) > 0 {
		log.Warn("responses: marked responses left unfinished by the previous run as failed", "count", len(recs))
	}
	return rt
}

// put stores sr (a no-op without a store).
func (rt *responsesRuntime) put(sr *storedResponse) error {
	if rt.cfg.Store == nil {
		return nil
	}
	data, err := json.Marshal(sr)
	if err != nil {
		return err
	}
	rec := respstore.Record{ID: sr.Response.ID, Status: sr.Response.Status, Data: data}
	if f := rt.putFault.Load(); f != nil {
		err = (*f)(rec)
	}
	if err == nil {
		err = rt.cfg.Store.Put(rec)
	}
	if errors.Is(err, respstore.ErrTooLarge) {
		return fmt.Errorf("the response is too large to store (%v): %w", err, engine.ErrInvalidRequest)
	}
	if err != nil {
		// The log has the whole error; the client gets its cause, not the server's paths.
		rt.log.Error("responses: storing a response failed", "id", rec.ID, "status", rec.Status, "err", err)
		cause := "a storage error"
		if errno, ok := errors.AsType[syscall.Errno](err); ok {
			cause = errno.Error()
		}
		return fmt.Errorf("the response could not be stored (%s): send \"store\": false, or retry later", cause)
	}
	return nil
}

// checkStorable refuses, before anything is generated, a response to store whose
// conversation alone, with room for its output, is over the store's record limit.
func (rt *responsesRuntime) checkStorable(req *openai.ParsedResponses, sr *storedResponse) error {
	if !req.Store || rt.cfg.Store == nil {
		return nil
	}
	data, err := json.Marshal(sr)
	if err != nil {
		return err
	}
	// A token's text in JSON is rarely over 16 bytes.
	need, limit := len(data)+16*req.Params.MaxTokens, rt.cfg.Store.MaxRecordBytes()
	if need > limit {
		return openai.InvalidParam("input", "the conversation is too large to store (about %d bytes with its output; the limit is %d): send \"store\": false or a shorter input", need, limit)
	}
	return nil
}

// get reads a stored response; an unknown id is a 404.
func (rt *responsesRuntime) get(id string) (*storedResponse, error) {
	if rt.cfg.Store == nil {
		return nil, openai.Errorf(openai.ErrNotFound, "no response with id %q: responses are not stored (%s)", id, rt.cfg.Unavailable)
	}
	rec, err := rt.cfg.Store.Get(id)
	if errors.Is(err, respstore.ErrNotFound) {
		return nil, openai.Errorf(openai.ErrNotFound, "no response with id %q", id)
	}
	if err != nil {
		return nil, err
	}
	var sr storedResponse
	if err := json.Unmarshal(rec.Data, &sr); err != nil {
		return nil, fmt.Errorf("stored response %q is unreadable: %w", id, err)
	}
	return &sr, nil
}

// lookup returns the conversation previous_response_id continues.
func (rt *responsesRuntime) lookup(id string) ([]openai.ResponseItem, error) {
	if rt.cfg.Store == nil {
		return nil, openai.UnsupportedValue("previous_response_id", "previous_response_id needs the response store, which is not available: %s", rt.cfg.Unavailable)
	}
	sr, err := rt.get(id)
	if errors.Is(err, openai.ErrNotFound) {
		return nil, openai.InvalidParam("previous_response_id", "previous response with id %q not found", id)
	}
	if err != nil {
		return nil, err
	}
	switch sr.Response.Status {
	case openai.StatusQueued, openai.StatusInProgress:
		return nil, openai.InvalidParam("previous_response_id", "previous response %q has not finished (status %s)", id, sr.Response.Status)
	}
	items := append(append(append([]openai.ResponseItem(nil), sr.Context...), sr.Input...), sr.Response.Output...)
	return items, nil
}

// shutdown lets background responses finish until ctx ends, then cancels them (they are
// stored as failed) and waits for them.
func (rt *responsesRuntime) shutdown(ctx context.Context) {
	rt.mu.Lock()
	rt.closing = true
	rt.mu.Unlock()
	done := make(chan struct{})
	go func() {
		rt.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		rt.cancel()
		<-done
	}
	rt.cancel()
}

// handleResponsesGet serves GET /v1/responses/{id}.
func (s *Server) handleResponsesGet(c *gin.Context) {
	if v := c.Query("stream"); v != "" && v != "false" {
		writeError(c.Writer, openai.UnsupportedValue("stream", "streaming a stored response again is not supported"))
		return
	}
	sr, err := s.resp.get(c.Param("id"))
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	writeJSON(c.Writer, http.StatusOK, sr.Response)
}

// handleResponsesDelete serves DELETE /v1/responses/{id}; a running background response
// is cancelled first.
func (s *Server) handleResponsesDelete(c *gin.Context) {
	id := c.Param("id")
	s.resp.cancelRun(id)
	if s.resp.cfg.Store == nil {
		writeError(c.Writer, openai.Errorf(openai.ErrNotFound, "no response with id %q: responses are not stored (%s)", id, s.resp.cfg.Unavailable))
		return
	}
	if err := s.resp.cfg.Store.Delete(id); err != nil {
		if errors.Is(err, respstore.ErrNotFound) {
			err = openai.Errorf(openai.ErrNotFound, "no response with id %q", id)
		}
		writeError(c.Writer, err)
		return
	}
	writeJSON(c.Writer, http.StatusOK, map[string]any{"id": id, "object": "response.deleted", "deleted": true})
}

// cancelRun cancels a background response running here and waits until it has stored
// its end; false when none runs with id.
func (rt *responsesRuntime) cancelRun(id string) bool {
	rt.mu.Lock()
	run, ok := rt.running[id]
	if ok {
		run.cancelled = true
	}
	rt.mu.Unlock()
	if !ok {
		return false
	}
	run.cancel()
	<-run.done
	return true
}

// handleResponsesCancel serves POST /v1/responses/{id}/cancel: a background response
// that has not finished ends as cancelled; a finished one is returned as it is.
func (s *Server) handleResponsesCancel(c *gin.Context) {
	id := c.Param("id")
	s.resp.cancelRun(id)
	sr, err := s.resp.get(id)
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	if !sr.Response.Background {
		writeError(c.Writer, openai.InvalidParam("response_id", "only background responses can be cancelled"))
		return
	}
	writeJSON(c.Writer, http.StatusOK, sr.Response)
}

// handleResponsesInputItems serves GET /v1/responses/{id}/input_items: the input items
// of that request (not those of the responses it continues), paginated as OpenAI's
// lists: limit 1..100 (20), order asc or desc (desc), after an item id.
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
	sr, err := s.resp.get(c.Param("id"))
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	items := append([]openai.ResponseItem(nil), sr.Input...)
	if order == "desc" {
		for i, j := 0, len(items)-1; i < j; i, j = i+1, j-1 {
			items[i], items[j] = items[j], items[i]
		}
	}
	if after, ok := c.GetQuery("after"); ok {
		at := -1
		for i, it := range items {
			if it.ID == after {
				at = i
			}
		}
		if at < 0 {
			writeError(c.Writer, openai.InvalidParam("after", "no input item with id %q in this response", after))
			return
		}
		items = items[at+1:]
	}
	page := openai.ItemList{Object: "list", Data: items}
	if len(items) > limit {
		page.Data, page.HasMore = items[:limit], true
	}
	if n := len(page.Data); n > 0 {
		page.FirstID, page.LastID = &page.Data[0].ID, &page.Data[n-1].ID
	}
	writeJSON(c.Writer, http.StatusOK, page)
}
