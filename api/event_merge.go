package api

import (
	"context"
	"fmt"
	"sync"

	"github.com/conveyor-llm/conveyor/engine"
)

// jobEvent is one event of a request's jobs[pi].
type jobEvent struct {
	pi int
	ev engine.Event
}

// merged fans the event channels of a request's jobs into one channel. One goroutine
// per job reads the job's events, records them (job.observe) and forwards them; when the
// job's channel closes before all its sequences finished, it forwards a synthetic error
// event. Once stop is called or ctx ends, the goroutines forward nothing more and only
// drain their jobs until the engine closes each channel (the caller aborts the jobs), so
// none of them outlives the engine requests it reads.
type merged struct {
	events <-chan jobEvent // closed once every job's channel is closed
	stopCh chan struct{}
	once   sync.Once
}

// mergeEvents starts forwarding the events of jobs.
func mergeEvents(ctx context.Context, jobs []*job) *merged {
	out := make(chan jobEvent)
	m := &merged{events: out, stopCh: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(len(jobs))
	for pi, j := range jobs {
		go func() {
			defer wg.Done()
			m.forward(ctx, pi, j, out)
		}()
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	return m
}

// stop ends the forwarding; the goroutines keep draining their jobs.
func (m *merged) stop() { m.once.Do(func() { close(m.stopCh) }) }

// forward moves job j's events to out until j's channel closes, or until the merge stops.
func (m *merged) forward(ctx context.Context, pi int, j *job, out chan<- jobEvent) {
	send := func(ev engine.Event) bool {
		select {
		case out <- jobEvent{pi: pi, ev: ev}:
			return true
		case <-m.stopCh:
		case <-ctx.Done():
		}
		return false
	}
	for ev := range j.events {
		j.observe(&ev)
		if !send(ev) {
			j.drain()
			return
		}
	}
	if j.finished < j.nSeqs {
		send(engine.Event{Index: -1, FinishReason: engine.FinishError,
			Err: fmt.Errorf("the engine ended the request before it finished: %w", engine.ErrClosed)})
	}
}
