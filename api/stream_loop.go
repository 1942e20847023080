package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
)

// runGeneration reads the events of a request's jobs until every sequence ended and
// writes the response through conv: one JSON body, or Server-Sent Events with
// keep-alive comments filling silences. A failure before anything was sent is a plain
// error with its status, after that an in-band error event. A client that goes away (or
// a write that fails, or a server that aborts on shutdown) aborts the jobs.
func (s *Server) runGeneration(ctx context.Context, w http.ResponseWriter, b *Backend, g *openai.Generation, jobs []*job, conv openai.Converter) {
	m := mergeEvents(ctx, jobs)
	defer m.stop()
	sse := newSSEWriter(w)
	fail := func(err error) {
		if g.Stream {
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
	if g.Stream {
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
	n := g.Params.N
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
			for _, chunk := range conv.Add(je.pi, &ev) {
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
