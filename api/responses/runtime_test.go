package responses

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"go.uber.org/goleak"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/api/respstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newRuntime(t *testing.T, dir string) (*Runtime, *respstore.Store) {
	t.Helper()
	st, err := respstore.Open(respstore.DefaultConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(Config{Store: st}, slog.New(slog.NewTextHandler(io.Discard, nil))), st
}

func stored(id string) *Stored {
	return &Stored{Response: openai.Response{ID: id, Object: "response", Background: true, Output: []openai.ResponseItem{}}}
}

// status is the status the store holds for id.
func status(t *testing.T, rt *Runtime, id string) string {
	t.Helper()
	sr, err := rt.Get(id)
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	return sr.Response.Status
}

// TestBackgroundLifecycle: a background response is stored as queued, then in progress
// while it runs; Cancel ends it as cancelled (without the error its generation saw), and
// Shutdown past its deadline cancels the rest, which end as their generation leaves them;
// after Shutdown nothing starts and nothing of the refused response stays stored.
func TestBackgroundLifecycle(t *testing.T) {
	rt, _ := newRuntime(t, t.TempDir())
	start := func(id string) (started chan struct{}) {
		started = make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		sr := stored(id)
		queued, err := rt.Start(sr, cancel, func() {
			close(started)
			<-ctx.Done()
			sr.Response.Status, sr.Response.Error = openai.StatusFailed, &openai.ResponseError{Code: "x", Message: ctx.Err().Error()}
		})
		if err != nil || queued.Status != openai.StatusQueued {
			t.Fatalf("start %s: %v, answered %q", id, err, queued.Status)
		}
		return started
	}
	<-start("resp_a")
	if got := status(t, rt, "resp_a"); got != openai.StatusInProgress {
		t.Fatalf("running: %q", got)
	}
	sr, err := rt.Cancel("resp_a")
	if err != nil || sr.Response.Status != openai.StatusCancelled || sr.Response.Error != nil {
		t.Fatalf("cancelled: %v %+v", err, sr)
	}

	<-start("resp_b")
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the drain deadline has passed
	rt.Shutdown(ctx)
	if got := status(t, rt, "resp_b"); got != openai.StatusFailed {
		t.Fatalf("after shutdown: %q", got)
	}
	_, cancelC := context.WithCancel(context.Background())
	defer cancelC()
	if _, err := rt.Start(stored("resp_c"), cancelC, func() { t.Error("ran after Shutdown") }); !errors.Is(err, openai.ErrNotReady) {
		t.Fatalf("start after shutdown: %v", err)
	}
	if _, err := rt.Get("resp_c"); !errors.Is(err, openai.ErrNotFound) {
		t.Fatalf("a refused response stays stored: %v", err)
	}
}

// TestRestartFailsUnfinished: what a previous process left queued or in progress is
// failed when the next one opens the store; a finished response is kept as it is.
func TestRestartFailsUnfinished(t *testing.T) {
	dir := t.TempDir()
	st, err := respstore.Open(respstore.DefaultConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	before := New(Config{Store: st}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for id, s := range map[string]string{"resp_q": openai.StatusQueued, "resp_p": openai.StatusInProgress, "resp_d": openai.StatusCompleted} {
		sr := stored(id)
		sr.Response.Status = s
		if err := before.Put(sr); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	rt, _ := newRuntime(t, dir)
	for _, id := range []string{"resp_q", "resp_p"} {
		sr, err := rt.Get(id)
		if err != nil || sr.Response.Status != openai.StatusFailed || sr.Response.Error.Message != RestartFailure {
			t.Errorf("%s after a restart: %v %+v", id, err, sr)
		}
	}
	if got := status(t, rt, "resp_d"); got != openai.StatusCompleted {
		t.Errorf("a finished response after a restart: %q", got)
	}
}

// TestInputPage pages a response's input items as GET .../input_items does.
func TestInputPage(t *testing.T) {
	sr := &Stored{}
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		sr.Input = append(sr.Input, openai.ResponseItem{Type: "message", ID: id})
	}
	ptr := func(s string) *string { return &s }
	for _, tc := range []struct {
		limit       int
		order       string
		after       *string
		want        string
		more, fails bool
	}{
		{20, "desc", nil, "edcba", false, false},
		{2, "asc", nil, "ab", true, false},
		{2, "asc", ptr("b"), "cd", true, false},
		{2, "asc", ptr("d"), "e", false, false},
		{3, "desc", ptr("a"), "", false, false},
		{3, "asc", ptr("z"), "", false, true},
	} {
		page, err := sr.InputPage(tc.limit, tc.order, tc.after)
		if (err != nil) != tc.fails {
			t.Errorf("%+v: error %v", tc, err)
			continue
		}
		got := ""
		for _, it := range page.Data {
			got += it.ID
		}
		if !tc.fails && (got != tc.want || page.HasMore != tc.more || (got != "" && (*page.FirstID != got[:1] || *page.LastID != got[len(got)-1:]))) {
			t.Errorf("%+v: page %q (more %v)", tc, got, page.HasMore)
		}
	}
}
