package responses

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"syscall"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/api/respstore"
	"github.com/conveyor-llm/conveyor/engine"
)

// Config configures the state of /v1/responses.
type Config struct {
	// Store keeps stored responses (a *respstore.Store); nil refuses store:true (OpenAI's
	// default), background and previous_response_id with a 400 that gives Unavailable as
	// the reason.
	Store Store
	// Unavailable says why there is no store ("no --data-dir was given", an open error).
	Unavailable string
	// NoStoreByDefault makes an omitted store mean false (run-batch, whose results are its
	// output file); OpenAI's default is true.
	NoStoreByDefault bool
}

// Store is what a Runtime needs of the response store: respstore.Store's methods.
type Store interface {
	Put(respstore.Record) error
	Get(id string) (respstore.Record, error)
	Delete(id string) error
	// Unfinished returns the records whose status is one of statuses.
	Unfinished(statuses ...string) ([]respstore.Record, error)
	MaxRecordBytes() int
}

// Stored is what the store keeps per response (respstore.Record.Data).
type Stored struct {
	Response openai.Response       `json:"response"`
	Input    []openai.ResponseItem `json:"input"`
	// Context is the conversation before Input (from previous_response_id).
	Context []openai.ResponseItem `json:"context,omitempty"`
}

// Runtime is the server's /v1/responses state: the store and the background responses
// running in this process.
type Runtime struct {
	cfg Config
	log *slog.Logger
	wg  sync.WaitGroup // background responses running

	mu      sync.Mutex
	running map[string]*run // REQUIRES mu
	closing bool            // Shutdown began: no background response starts; REQUIRES mu
}

// run is one background response running in this process.
type run struct {
	cancel    context.CancelFunc
	done      chan struct{}
	cancelled bool // by Cancel or Delete, not by Shutdown; REQUIRES Runtime.mu
}

// unfinishedStatuses are the statuses of a response that has not ended.
var unfinishedStatuses = []string{openai.StatusQueued, openai.StatusInProgress}

// RestartFailure is the error message New leaves on the responses a previous process
// did not finish.
const RestartFailure = "the server stopped before this response finished"

// New returns the runtime over cfg.Store. Responses the store holds as queued or in
// progress were left so by the previous process, which ended before they finished: they
// are stored as failed.
func New(cfg Config, log *slog.Logger) *Runtime {
	rt := &Runtime{cfg: cfg, log: log, running: map[string]*run{}}
	if cfg.Store == nil {
		return rt
	}
	recs, err := cfg.Store.Unfinished(unfinishedStatuses...)
	if err != nil {
		log.Error("responses: reading unfinished responses", "err", err)
	}
	for _, rec := range recs {
		var sr Stored
		if err := json.Unmarshal(rec.Data, &sr); err != nil {
			continue
		}
		sr.Response.Status = openai.StatusFailed
		sr.Response.Error = &openai.ResponseError{Code: "server_error", Message: RestartFailure}
		if err := rt.Put(&sr); err != nil {
			log.Error("responses: marking an unfinished response failed", "id", rec.ID, "err", err)
		}
	}
	if len(recs) > 0 {
		log.Warn("responses: marked responses left unfinished by the previous run as failed", "count", len(recs))
	}
	return rt
}

// DefaultStore is what a request's omitted store means.
func (rt *Runtime) DefaultStore() bool { return !rt.cfg.NoStoreByDefault }

// CheckStore refuses a request to store (store true) when there is no store.
func (rt *Runtime) CheckStore(store bool) error {
	if store && rt.cfg.Store == nil {
		return openai.UnsupportedValue("store", "store is not available on this server (%s): send \"store\": false", rt.cfg.Unavailable)
	}
	return nil
}

// CheckStorable refuses, before anything is generated, a response to store whose
// conversation alone, with room for maxTokens of output, is over the store's record limit.
func (rt *Runtime) CheckStorable(sr *Stored, maxTokens int) error {
	if rt.cfg.Store == nil {
		return nil
	}
	data, err := json.Marshal(sr)
	if err != nil {
		return err
	}
	// A token's text in JSON is rarely over 16 bytes.
	need, limit := len(data)+16*maxTokens, rt.cfg.Store.MaxRecordBytes()
	if need > limit {
		return openai.InvalidParam("input", "the conversation is too large to store (about %d bytes with its output; the limit is %d): send \"store\": false or a shorter input", need, limit)
	}
	return nil
}

// Put stores sr (a no-op without a store). A failed write is logged whole; the error
// returned gives the client its cause, not the server's paths.
func (rt *Runtime) Put(sr *Stored) error {
	if rt.cfg.Store == nil {
		return nil
	}
	data, err := json.Marshal(sr)
	if err != nil {
		return err
	}
	rec := respstore.Record{ID: sr.Response.ID, Status: sr.Response.Status, Data: data}
	err = rt.cfg.Store.Put(rec)
	if errors.Is(err, respstore.ErrTooLarge) {
		return fmt.Errorf("the response is too large to store (%v): %w", err, engine.ErrInvalidRequest)
	}
	if err != nil {
		rt.log.Error("responses: storing a response failed", "id", rec.ID, "status", rec.Status, "err", err)
		cause := "a storage error"
		if errno, ok := errors.AsType[syscall.Errno](err); ok {
			cause = errno.Error()
		}
		return fmt.Errorf("the response could not be stored (%s): send \"store\": false, or retry later", cause)
	}
	return nil
}

// Get reads a stored response; an unknown id is openai.ErrNotFound.
func (rt *Runtime) Get(id string) (*Stored, error) {
	if rt.cfg.Store == nil {
		return nil, rt.notStored(id)
	}
	rec, err := rt.cfg.Store.Get(id)
	if errors.Is(err, respstore.ErrNotFound) {
		return nil, openai.Errorf(openai.ErrNotFound, "no response with id %q", id)
	}
	if err != nil {
		return nil, err
	}
	var sr Stored
	if err := json.Unmarshal(rec.Data, &sr); err != nil {
		return nil, fmt.Errorf("stored response %q is unreadable: %w", id, err)
	}
	return &sr, nil
}

func (rt *Runtime) notStored(id string) error {
	return openai.Errorf(openai.ErrNotFound, "no response with id %q: responses are not stored (%s)", id, rt.cfg.Unavailable)
}

// Lookup returns the conversation previous_response_id continues: the stored response's
// context, input and output (an openai.ConversationLookup).
func (rt *Runtime) Lookup(id string) ([]openai.ResponseItem, error) {
	if rt.cfg.Store == nil {
		return nil, openai.UnsupportedValue("previous_response_id", "previous_response_id needs the response store, which is not available: %s", rt.cfg.Unavailable)
	}
	sr, err := rt.Get(id)
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

// Delete deletes a stored response; a background one running here is cancelled first.
func (rt *Runtime) Delete(id string) error {
	rt.cancelRun(id)
	if rt.cfg.Store == nil {
		return rt.notStored(id)
	}
	err := rt.cfg.Store.Delete(id)
	if errors.Is(err, respstore.ErrNotFound) {
		return openai.Errorf(openai.ErrNotFound, "no response with id %q", id)
	}
	return err
}

// Cancel ends a background response that has not finished as cancelled and returns it
// as stored; a finished one is returned as it is.
func (rt *Runtime) Cancel(id string) (*Stored, error) {
	rt.cancelRun(id)
	sr, err := rt.Get(id)
	if err != nil {
		return nil, err
	}
	if !sr.Response.Background {
		return nil, openai.InvalidParam("response_id", "only background responses can be cancelled")
	}
	return sr, nil
}

// cancelRun cancels a background response running here and waits until it has stored
// its end; false when none runs with id.
func (rt *Runtime) cancelRun(id string) bool {
	rt.mu.Lock()
	r, ok := rt.running[id]
	if ok {
		r.cancelled = true
	}
	rt.mu.Unlock()
	if !ok {
		return false
	}
	r.cancel()
	<-r.done
	return true
}

// Start runs a background response: sr is stored as queued, and generate runs on its own
// goroutine under the context cancel ends (Cancel, Delete, or Shutdown past its
// deadline), filling sr.Response in — its output, status and, on failure, error. The
// response is stored as in progress when it starts and again when it ends, as generate
// left it or as cancelled. Start returns the queued response to answer with, or what
// kept it from starting: the store's error, or openai.ErrNotReady once Shutdown has begun (then
// nothing stays stored). The caller owns cancel until Start succeeds.
func (rt *Runtime) Start(sr *Stored, cancel context.CancelFunc, generate func()) (openai.Response, error) {
	sr.Response.Status = openai.StatusQueued
	if err := rt.Put(sr); err != nil {
		return openai.Response{}, err
	}
	r := &run{cancel: cancel, done: make(chan struct{})}
	rt.mu.Lock()
	if rt.closing {
		rt.mu.Unlock()
		_ = rt.cfg.Store.Delete(sr.Response.ID)
		return openai.Response{}, fmt.Errorf("the server is shutting down: %w", openai.ErrNotReady)
	}
	rt.running[sr.Response.ID] = r
	rt.wg.Add(1) // under mu, so that Shutdown's Wait never races an Add
	rt.mu.Unlock()
	queued := sr.Response
	go func() {
		defer rt.wg.Done()
		defer close(r.done)
		defer cancel()
		started := *sr
		started.Response.Status = openai.StatusInProgress
		if err := rt.Put(&started); err != nil {
			rt.log.Error("responses: storing a background response", "id", sr.Response.ID, "err", err)
		}
		sr.Response.Status = openai.StatusInProgress
		generate()
		rt.mu.Lock()
		cancelled := r.cancelled
		delete(rt.running, sr.Response.ID)
		rt.mu.Unlock()
		if cancelled {
			sr.Response.Status, sr.Response.Error = openai.StatusCancelled, nil
		}
		if err := rt.Put(sr); err != nil {
			rt.log.Error("responses: storing a background response", "id", sr.Response.ID, "err", err)
		}
	}()
	return queued, nil
}

// Shutdown lets background responses finish until ctx ends, then cancels them (they are
// stored as generate leaves them: failed) and waits for them. No background response
// starts once it has begun.
func (rt *Runtime) Shutdown(ctx context.Context) {
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
		rt.mu.Lock()
		for _, r := range rt.running {
			r.cancel()
		}
		rt.mu.Unlock()
		<-done
	}
}

// InputPage is one page of sr's input items (not those of the responses it continues),
// as GET /v1/responses/{id}/input_items lists them: up to limit items, in order asc or
// desc, after the item with the id after points to (from the start when nil).
func (sr *Stored) InputPage(limit int, order string, after *string) (openai.ItemList, error) {
	items := append([]openai.ResponseItem(nil), sr.Input...)
	if order == "desc" {
		slices.Reverse(items)
	}
	if after != nil {
		at := -1
		for i, it := range items {
			if it.ID == *after {
				at = i
			}
		}
		if at < 0 {
			return openai.ItemList{}, openai.InvalidParam("after", "no input item with id %q in this response", *after)
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
	return page, nil
}
