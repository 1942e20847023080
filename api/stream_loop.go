package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
)

// errClientGone is readEvents' error when a write to the client failed: nothing more can
// be sent, and nothing is.
var errClientGone = errors.New("the client went away")

// readEvents is the generation loop of every endpoint (completions, chat, Responses): it
// merges the events of a request's jobs (n sequences) and hands each to add, in order,
// until every sequence ended (it returns nil). When keepAlive is not nil it is called in
// silences of Config.KeepAliveInterval. Anything else aborts the jobs and returns why:
// the request's context ended (ctx.Err(), or engine.ErrClosed when the server is
// shutting down), a keep-alive or add failed (errClientGone, or add's error), or the
// engine failed a sequence or sent an index outside [0, n) (engine.ErrModel).
func (s *Server) readEvents(ctx context.Context, b *Backend, jobs []*job, n int, keepAlive func() error,
	add func(pi int, ev *engine.Event) error) error {
	m := mergeEvents(ctx, jobs)
	defer m.stop()
	abort := func() {
		abortJobs(b, jobs)
		m.stop()
	}
	cancelled := func() error {
		abort()
		if s.Draining() {
			return fmt.Errorf("the server is shutting down: %w", engine.ErrClosed)
		}
		return ctx.Err()
	}
	var tick <-chan time.Time
	var ticker *time.Ticker
	if keepAlive != nil {
		ticker = time.NewTicker(s.cfg.KeepAliveInterval)
		defer ticker.Stop()
		tick = ticker.C
	}
	for {
		select {
		case <-ctx.Done():
			return cancelled()
		case <-tick:
			if keepAlive() != nil {
				abort()
				return errClientGone
			}
		case je, ok := <-m.events:
			if !ok {
				if ctx.Err() != nil { // the forwarders stopped early, not every sequence ended
					return cancelled()
				}
				return nil
			}
			if ticker != nil {
				ticker.Reset(s.cfg.KeepAliveInterval) // keep-alives only fill silences
			}
			ev := je.ev
			if isFailure(ev) || ev.Index < 0 || ev.Index >= n {
				abort()
				if !isFailure(ev) {
					ev.Err = fmt.Errorf("the engine sent sequence index %d of %d: %w", ev.Index, n, engine.ErrModel)
				}
				return eventError(ev)
			}
			if err := add(je.pi, &ev); err != nil {
				abort()
				return err
			}
		}
	}
}

// runGeneration reads the events of a request's jobs until every sequence ended and
// writes the response through conv: one JSON body, or Server-Sent Events with
// keep-alive comments filling silences. A failure before anything was sent is a plain
// error with its status, after that an in-band error event. A client that goes away (or
// a write that fails, or a server that aborts on shutdown) aborts the jobs.
func (s *Server) runGeneration(ctx context.Context, w http.ResponseWriter, b *Backend, g *openai.Generation, jobs []*job, conv openai.Converter) {
	sse := newSSEWriter(w)
	var keepAlive func() error
	if g.Stream {
		keepAlive = sse.keepAlive
	}
	err := s.readEvents(ctx, b, jobs, g.Params.N, keepAlive, func(pi int, ev *engine.Event) error {
		for _, chunk := range conv.Add(pi, ev) {
			if sse.data(chunk) != nil {
				return errClientGone
			}
		}
		return nil
	})
	switch {
	case err == nil:
		s.finishGeneration(w, sse, g, totalUsage(jobs), conv)
	case errors.Is(err, errClientGone) || (ctx.Err() != nil && !s.Draining()):
		// Nobody to tell.
	case g.Stream:
		sse.fail(err)
	default:
		writeError(w, err)
	}
}

// finishGeneration writes the end of a request whose sequences all ended: the whole
// body, or the usage chunk (when asked for) and [DONE].
func (s *Server) finishGeneration(w http.ResponseWriter, sse *sseWriter, g *openai.Generation, u openai.Usage, conv openai.Converter) {
	if !g.Stream {
		writeJSON(w, http.StatusOK, conv.Body(u))
		return
	}
	if g.IncludeUsage && sse.data(conv.UsageChunk(u)) != nil {
		return
	}
	_ = sse.done()
}
