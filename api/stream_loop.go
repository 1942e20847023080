package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/conveyor-llm/conveyor/engine"
)

// converter is one endpoint's wire format: what an engine event becomes in a stream,
// and what the accumulated sequences become as a whole response. The loop in
// runGeneration owns everything else (waiting, keep-alives, errors, aborts, usage).
type converter interface {
	// add takes one event of sequence ev.Index of prompt pi (the index is checked).
	// Streaming, it returns the chunks to send for it; otherwise it accumulates and
	// returns nil.
	add(pi int, ev *engine.Event) []any
	// body is the response of a request that is not streamed, once every sequence ended.
	body(u usageJSON) any
	// usageChunk is a stream's last chunk with stream_options.include_usage.
	usageChunk(u usageJSON) any
}

// runGeneration reads the events of a request's jobs until every sequence ended and
// writes the response through conv: one JSON body, or Server-Sent Events with
// keep-alive comments filling silences. A failure before anything was sent is a plain
// error with its status, after that an in-band error event. A client that goes away (or
// a write that fails, or a server that aborts on shutdown) aborts the jobs.
func (s *Server) runGeneration(ctx context.Context, w http.ResponseWriter, b *Backend, g *generation, jobs []*job, conv converter) {
	m := mergeEvents(ctx, jobs)
	defer m.stop()
	sse := newSSEWriter(w)
	fail := func(err error) {
		if g.stream {
			sse.fail(err)
		} else {
			writeError(w, err)
		}
	}
	abort := func() {
		abortJobs(b, jobs)
		m.stop()
	}
	var tick <-chan time.Time
	var ticker *time.Ticker
	if g.stream {
		ticker = time.NewTicker(s.cfg.KeepAliveInterval)
		defer ticker.Stop()
		tick = ticker.C
	}
	cancelled := func() {
		abort()
		if s.Draining() {
			fail(fmt.Errorf("the server is shutting down: %w", engine.ErrClosed))
		}
	}
	n := g.params.N
	for {
		select {
		case <-ctx.Done():
			cancelled()
			return
		case <-tick:
			if sse.keepAlive() != nil {
				abort()
				return
			}
			continue
		case je, ok := <-m.events:
			if !ok {
				if ctx.Err() != nil { // the forwarders stopped early, not every sequence ended
					cancelled()
					return
				}
				s.finishGeneration(w, sse, g, totalUsage(jobs), conv)
				return
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
				fail(eventError(ev))
				return
			}
			for _, chunk := range conv.add(je.pi, &ev) {
				if sse.data(chunk) != nil {
					abort()
					return
				}
			}
		}
	}
}

// finishGeneration writes the end of a request whose sequences all ended: the whole
// body, or the usage chunk (when asked for) and [DONE].
func (s *Server) finishGeneration(w http.ResponseWriter, sse *sseWriter, g *generation, u usageJSON, conv converter) {
	if !g.stream {
		writeJSON(w, http.StatusOK, conv.body(u))
		return
	}
	if g.includeUsage && sse.data(conv.usageChunk(u)) != nil {
		return
	}
	_ = sse.done()
}
