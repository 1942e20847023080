package api

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/conveyor-llm/conveyor/engine"
)

// job is one engine request: one prompt of an HTTP request, with n (or best_of) sequences.
type job struct {
	id       string
	prompt   []int32
	nSeqs    int
	events   <-chan engine.Event
	closed   bool
	finished int           // sequences that reported a finish reason
	usage    *engine.Usage // from the request's last event
	lastTok  []time.Time   // per sequence: when its previous tokens arrived (inter-token latency)
	metrics  *Metrics      // records the request-level metrics of every event, aborted ones too
}

// submitAll submits one engine request per prompt, all with params. If one is refused, the
// ones already accepted are aborted and the refusal is returned (nothing was written yet);
// a prompt the engine finds too long is reported against promptParam.
func (s *Server) submitAll(ctx context.Context, b *Backend, baseID string, prompts [][]int32, params engine.SamplingParams, promptParam string) ([]*job, error) {
	jobs := make([]*job, 0, len(prompts))
	for i, p := range prompts {
		id := baseID
		if len(prompts) > 1 {
			id = fmt.Sprintf("%s-%d", baseID, i)
		}
		req := &engine.Request{ID: id, Prompt: p, Params: params}
		ch, err := b.Engine.Submit(ctx, req)
		if err != nil {
			abortJobs(b, jobs)
			var pe *paramError
			if errors.Is(err, engine.ErrPromptTooLong) && !errors.As(err, &pe) {
				err = &paramError{param: promptParam, kind: err, msg: err.Error()}
			}
			return nil, err
		}
		jobs = append(jobs, &job{id: id, prompt: p, nSeqs: params.N, events: ch, lastTok: make([]time.Time, params.N), metrics: s.metrics})
	}
	return jobs, nil
}

// abortJobs aborts every job whose channel is still open and drains it in the background
// so that the engine never blocks on a request nobody reads any more. The drained events
// still go to the metrics, so that a sequence the client gave up on is counted with its
// finish reason ("abort") and its latencies.
func abortJobs(b *Backend, jobs []*job) {
	for _, j := range jobs {
		if j.closed {
			continue
		}
		b.Engine.Abort(j.id)
		j.closed = true
		go func(j *job) {
			for ev := range j.events {
				if j.metrics != nil {
					j.metrics.observeEvent(j, &ev, time.Now())
				}
			}
		}(j)
	}
}

// waitKind says what fan.next returned.
type waitKind int

const (
	gotEvent  waitKind = iota // an event of jobs[prompt]
	gotTick                   // the keep-alive ticker fired
	gotCancel                 // ctx is done: the client went away or the server is aborting
	gotEnd                    // every job's channel is closed
)

// fan multiplexes the event channels of a request's jobs.
type fan struct {
	s    *Server
	jobs []*job
}

// next waits for the next event of any job, a tick (tick may be nil) or ctx's end.
// A channel that closes before all its sequences finished yields a synthetic error event.
// Request-level metrics are recorded here, once per event, for both endpoints.
func (f *fan) next(ctx context.Context, tick <-chan time.Time) (waitKind, int, engine.Event) {
	for {
		cases := make([]reflect.SelectCase, 0, len(f.jobs)+2)
		owner := make([]int, 0, len(f.jobs))
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
		if tick != nil {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(tick)})
		}
		fixed := len(cases)
		for i, j := range f.jobs {
			if !j.closed {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(j.events)})
				owner = append(owner, i)
			}
		}
		if len(owner) == 0 {
			return gotEnd, 0, engine.Event{}
		}
		chosen, v, ok := reflect.Select(cases)
		switch {
		case chosen == 0:
			return gotCancel, 0, engine.Event{}
		case chosen < fixed:
			return gotTick, 0, engine.Event{}
		}
		i := owner[chosen-fixed]
		j := f.jobs[i]
		if !ok {
			j.closed = true
			if j.finished < j.nSeqs {
				return gotEvent, i, engine.Event{Index: -1, FinishReason: engine.FinishError,
					Err: fmt.Errorf("the engine ended the request before it finished: %w", engine.ErrClosed)}
			}
			continue
		}
		ev := v.Interface().(engine.Event)
		if ev.Usage != nil {
			j.usage = ev.Usage
		}
		f.s.metrics.observeEvent(j, &ev, time.Now())
		if ev.FinishReason != "" {
			j.finished++
		}
		return gotEvent, i, ev
	}
}

// usage sums the jobs' usage.
func (f *fan) usage() usageJSON {
	var u usageJSON
	for _, j := range f.jobs {
		if j.usage != nil {
			u.PromptTokens += j.usage.PromptTokens
			u.CompletionTokens += j.usage.CompletionTokens
			u.cached += j.usage.CachedTokens
		} else {
			u.PromptTokens += len(j.prompt)
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if u.cached > 0 {
		u.Details = &promptDetails{CachedTokens: u.cached}
	}
	return u
}

// usageJSON is the OpenAI usage object.
type usageJSON struct {
	PromptTokens     int            `json:"prompt_tokens"`
	CompletionTokens int            `json:"completion_tokens"`
	TotalTokens      int            `json:"total_tokens"`
	Details          *promptDetails `json:"prompt_tokens_details,omitempty"`
	cached           int
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// eventError turns an error event (or an abort the client did not cause) into the error
// to report.
func eventError(ev engine.Event) error {
	if ev.Err != nil {
		return ev.Err
	}
	if ev.FinishReason == engine.FinishAbort {
		return fmt.Errorf("the request was aborted by the server: %w", engine.ErrClosed)
	}
	return fmt.Errorf("generation failed: %w", engine.ErrModel)
}

// isFailure reports whether an event ends its sequence abnormally.
func isFailure(ev engine.Event) bool {
	return ev.FinishReason == engine.FinishError || ev.FinishReason == engine.FinishAbort
}
