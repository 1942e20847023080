package api

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/engine"
	"go.uber.org/goleak"
)

// testJobs makes n jobs of one sequence each, fed through unbuffered channels the test
// writes to, as a slow engine would.
func testJobs(n int) ([]*job, []chan engine.Event) {
	jobs := make([]*job, n)
	chans := make([]chan engine.Event, n)
	for i := range jobs {
		chans[i] = make(chan engine.Event)
		jobs[i] = &job{id: string(rune('a' + i)), prompt: []int32{1, 2}, nSeqs: 1, events: chans[i], lastTok: make([]time.Time, 1)}
	}
	return jobs, chans
}

func recv(t *testing.T, m *merged) (jobEvent, bool) {
	t.Helper()
	select {
	case je, ok := <-m.events:
		return je, ok
	case <-time.After(10 * time.Second):
		t.Fatal("no event from the merge")
	}
	return jobEvent{}, false
}

func TestMergeForwardsInOrderAndEnds(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	jobs, chans := testJobs(3)
	m := mergeEvents(context.Background(), jobs)
	for k := 0; k < 3; k++ { // job i's events keep their order
		for i, ch := range chans {
			ev := engine.Event{Text: string(rune('0' + k))}
			if k == 2 {
				ev.FinishReason = engine.FinishLength
				ev.Usage = &engine.Usage{PromptTokens: 2, CompletionTokens: 3}
			}
			go func() { ch <- ev }()
			je, ok := recv(t, m)
			if !ok || je.pi != i || je.ev.Text != ev.Text {
				t.Fatalf("got %+v (%v), want job %d's event %q", je, ok, i, ev.Text)
			}
		}
	}
	for _, ch := range chans {
		close(ch)
	}
	if je, ok := recv(t, m); ok {
		t.Fatalf("event %+v after every job ended", je)
	}
	if u := totalUsage(jobs); u.PromptTokens != 6 || u.CompletionTokens != 9 {
		t.Fatalf("usage %+v", u)
	}
}

func TestMergeReportsAJobEndedEarly(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	jobs, chans := testJobs(1)
	m := mergeEvents(context.Background(), jobs)
	close(chans[0]) // no finish reason came
	je, ok := recv(t, m)
	if !ok || je.ev.Index != -1 || !isFailure(je.ev) || !errors.Is(je.ev.Err, engine.ErrClosed) {
		t.Fatalf("got %+v, want a synthetic error event", je)
	}
	if _, ok := recv(t, m); ok {
		t.Fatal("the merge did not end")
	}
}

// TestMergeStopDrains checks that once the merge stops (or the request's context ends)
// the engine's sends still complete, every event still reaches the metrics, and every
// goroutine ends when the engine closes its channels.
func TestMergeStopDrains(t *testing.T) {
	for _, how := range []string{"stop", "context"} {
		t.Run(how, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			metrics := NewMetrics()
			jobs, chans := testJobs(2)
			for _, j := range jobs {
				j.metrics = metrics
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			m := mergeEvents(ctx, jobs)
			chans[0] <- engine.Event{Text: "x"}
			recv(t, m)
			if how == "stop" {
				m.stop()
			} else {
				cancel()
			}
			for _, ch := range chans { // nobody reads the merge any more: the engine must not block
				ch <- engine.Event{Text: "y"}
				ch <- engine.Event{FinishReason: engine.FinishAbort}
				close(ch)
			}
			waitFor(t, "the merge to end", func() bool {
				select {
				case _, ok := <-m.events:
					return !ok
				default:
					return false
				}
			})
			if jobs[0].finished != 1 || jobs[1].finished != 1 {
				t.Fatalf("finished %d and %d, want the aborts observed", jobs[0].finished, jobs[1].finished)
			}
		})
	}
}
