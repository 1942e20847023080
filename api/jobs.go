package api

import (
	"context"
	"fmt"
	"time"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
)

// job is one engine request: one prompt of an HTTP request, with n (or best_of) sequences.
type job struct {
	id      string
	prompt  []int32
	nSeqs   int
	events  <-chan engine.Event
	metrics *Metrics // records the request-level metrics of every event, aborted ones too

	// Owned by the one goroutine that reads events (see mergeEvents); the handler reads
	// usage only after that goroutine is done.
	finished int           // sequences that reported a finish reason
	usage    *engine.Usage // from the request's last event
	lastTok  []time.Time   // per sequence: when its previous tokens arrived (inter-token latency)
}

// observe records one event: usage, finished sequences and the request-level metrics.
func (j *job) observe(ev *engine.Event) {
	if ev.Usage != nil {
		j.usage = ev.Usage
	}
	if j.metrics != nil {
		j.metrics.observeEvent(j, ev, time.Now())
	}
	if ev.FinishReason != "" {
		j.finished++
	}
}

// drain reads the job's remaining events into the metrics until the engine closes the
// channel, so that the engine never blocks on a request nobody reads any more and a
// sequence the client gave up on is still counted with its finish reason ("abort").
func (j *job) drain() {
	for ev := range j.events {
		j.observe(&ev)
	}
}

// submitAll submits one engine request per prompt, all with params. If one is refused, the
// ones already accepted are aborted and the refusal is returned (nothing was written yet),
// its parameter renamed to the endpoint's by names.
func (s *Server) submitAll(ctx context.Context, b *Backend, baseID string, prompts [][]int32, params engine.SamplingParams, names map[string]string) ([]*job, error) {
	if seqs := max(params.N, params.BestOf); len(prompts) > 1 && b.MaxPrompts != nil {
		if most := b.MaxPrompts(seqs); len(prompts) > most {
			each := "1 sequence each"
			if seqs > 1 {
				each = fmt.Sprintf("%d sequences each", seqs)
			}
			return nil, openai.InvalidParam("prompt", "%d prompts are more than this server accepts in one request: %d at most with %s (--max-num-seqs and --max-queue set the limit); send them in several requests",
				len(prompts), most, each)
		}
	}
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
			for _, j := range jobs {
				go j.drain()
			}
			return nil, openai.WireError(err, names, i, len(prompts) > 1)
		}
		jobs = append(jobs, &job{id: id, prompt: p, nSeqs: params.N, events: ch, lastTok: make([]time.Time, params.N), metrics: s.metrics})
	}
	return jobs, nil
}

// abortJobs asks the engine to end the jobs (Abort is a no-op for a request that already
// ended); the engine closes their channels soon after. Whoever reads a job's channel
// drains it.
func abortJobs(b *Backend, jobs []*job) {
	for _, j := range jobs {
		b.Engine.Abort(j.id)
	}
}

// totalUsage sums the jobs' usage. It may be called only once every job's events were read.
func totalUsage(jobs []*job) openai.Usage {
	var prompt, completion, cached int
	for _, j := range jobs {
		if j.usage != nil {
			prompt += j.usage.PromptTokens
			completion += j.usage.CompletionTokens
			cached += j.usage.CachedTokens
		} else {
			prompt += len(j.prompt)
		}
	}
	return openai.NewUsage(prompt, completion, cached)
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
