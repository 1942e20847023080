package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// faultyRunner is the real runner with faults injected from the test: every pass fails
// while failing is set, the pass numbered failAt fails, and a prefill row holding
// exactly the tokens in victim gets no logits, so sampling that request's first token
// panics (an index out of range in the sampler).
type faultyRunner struct {
	models.Model
	calls   atomic.Int64
	failing atomic.Bool
	failAt  atomic.Int64
	victim  atomic.Pointer[[]int32]
}

var errInjected = errors.New("injected: the runner failed")

func (f *faultyRunner) Forward(b *models.Batch) (*models.Output, error) {
	c := f.calls.Add(1)
	if f.failing.Load() || c == f.failAt.Load() {
		return nil, errInjected
	}
	out, err := f.Model.Forward(b)
	if err != nil || f.victim.Load() == nil {
		return out, err
	}
	victim := *f.victim.Load()
	for i, s := range b.Seqs {
		if slices.Equal(s.Tokens, victim) {
			o := *out
			o.Logits = slices.Clone(out.Logits)
			o.Logits[i] = nil
			return &o, nil
		}
	}
	return out, nil
}

// startFaultyE2E is startE2E over a faultyRunner; modEngine may set the engine's restart.
func startFaultyE2E(t *testing.T, modEngine func(*engine.Config)) (*e2e, *faultyRunner, *tokenizer.Tokenizer) {
	t.Helper()
	dir := tinyModel(t)
	var runner *faultyRunner
	e := startE2ERunner(t, dir, func(m models.Model) models.Model {
		runner = &faultyRunner{Model: m}
		return runner
	}, nil, modEngine)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return e, runner, tok
}

// post sends body to path and returns the status and the whole response body.
func (e *e2e) post(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	res, err := http.Post(e.base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, b
}

// health returns /health's status and body.
func (e *e2e) health(t *testing.T) (int, map[string]string) {
	t.Helper()
	res, err := http.Get(e.base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var m map[string]string
	_ = json.NewDecoder(res.Body).Decode(&m)
	return res.StatusCode, m
}

// wantErrorObject checks an OpenAI error body with the given code whose message holds msg.
func wantErrorObject(t *testing.T, what string, status int, body []byte, code, msg string) {
	t.Helper()
	var eb struct {
		Error struct {
			Message, Type string
			Code          *string
		}
	}
	if status != http.StatusInternalServerError || json.Unmarshal(body, &eb) != nil || eb.Error.Type != "server_error" ||
		eb.Error.Code == nil || *eb.Error.Code != code || !strings.Contains(eb.Error.Message, msg) {
		t.Fatalf("%s: %d %s; want a 500 %s error object saying %q", what, status, body, code, msg)
	}
}

// TestFailingStepsOverHTTP fails forward passes of the real engine behind the real
// server: a request in a failed pass gets a 500 error object, or in a stream that had
// started an SSE error event followed by [DONE]; /health stays 200 after one failure;
// after MaxStepFailures in a row it is 503 with the reason while the runner reopens, and
// 200 again once it has, the server answering as before.
func TestFailingStepsOverHTTP(t *testing.T) {
	reopening, release := make(chan struct{}), make(chan struct{})
	var reopened atomic.Int32
	e, runner, _ := startFaultyE2E(t, func(c *engine.Config) {
		c.MaxStepFailures = 2
		c.ReopenModel = func() (engine.Model, error) {
			reopened.Add(1)
			close(reopening)
			<-release
			r, err := models.Open(tinyModel(t), models.RunnerOptions{ORTLib: ortLib(t), IntraOpThreads: 1})
			if err != nil {
				return nil, err
			}
			return &faultyRunner{Model: r}, nil
		}
	})
	const cmpl = `{"model":"tiny","prompt":"Once upon a time","max_tokens":8,"temperature":0}`
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the engine's shutdown, should the test fail first

	// One failed pass: the request's 500; the server stays healthy.
	runner.failing.Store(true)
	status, body := e.post(t, "/v1/completions", cmpl)
	wantErrorObject(t, "a request in a failed pass", status, body, "model_error", "injected: the runner failed")
	if code, h := e.health(t); code != 200 {
		t.Fatalf("/health after one failed pass: %d %v", code, h)
	}

	// A stream whose third pass fails (prefill and one decode pass succeed first): the
	// chunks already sent, then an error event and [DONE].
	runner.failing.Store(false)
	runner.failAt.Store(runner.calls.Load() + 3)
	status, body = e.post(t, "/v1/completions", `{"model":"tiny","prompt":"Once upon a time","max_tokens":50,"temperature":0,"stream":true}`)
	events := strings.Split(strings.TrimSpace(string(body)), "\n\n")
	if status != 200 || len(events) < 4 || events[len(events)-1] != "data: [DONE]" ||
		!strings.HasPrefix(events[len(events)-2], `data: {"error":{`) || !strings.Contains(events[len(events)-2], "injected: the runner failed") ||
		!strings.Contains(events[0], `"choices"`) {
		t.Fatalf("stream with a failed pass: %d\n%s", status, body)
	}
	if code, _ := e.health(t); code != 200 {
		t.Fatalf("/health after a failed pass between good ones: %d", code)
	}
	if status, body = e.post(t, "/v1/completions", cmpl); status != 200 { // ends the run of failures
		t.Fatalf("a good pass: %d %s", status, body)
	}

	// Two failed passes in a row: 503 with the reason while the runner reopens.
	runner.failing.Store(true)
	for range 2 {
		status, body = e.post(t, "/v1/completions", cmpl)
		wantErrorObject(t, "a request in a failed pass", status, body, "model_error", "injected")
	}
	select {
	case <-reopening:
	case <-time.After(time.Minute):
		t.Fatal("the runner was not reopened")
	}
	waitFor(t, "an unhealthy /health", func() bool { code, _ := e.health(t); return code == 503 })
	if _, h := e.health(t); h["status"] != "unhealthy" || !strings.Contains(h["reason"], "2 forward passes in a row failed") ||
		!strings.Contains(h["reason"], "injected: the runner failed") {
		t.Fatalf("/health while the runner reopens: %v", h)
	}
	unblock()
	waitFor(t, "a healthy /health", func() bool { code, _ := e.health(t); return code == 200 })
	status, body = e.post(t, "/v1/completions", cmpl)
	if status != 200 || !bytes.Contains(body, []byte(`"completion_tokens":8`)) {
		t.Fatalf("after the restart: %d %s", status, body)
	}
	waitFor(t, "free KV blocks", func() bool { st := e.eng.Stats(); return st.KVFreeBlocks == st.KVTotalBlocks })
	if st := e.eng.Stats(); st.RunnerRestarts != 1 || reopened.Load() != 1 {
		t.Fatalf("after the restart: %+v, %d reopens", st, reopened.Load())
	}
}

// TestPanickingRequestOverHTTP makes one request's sampling panic (its runner row is
// empty, and it asks for logprobs) while others run: it gets a 500 internal_error
// object, the others their normal answers, and the server keeps serving. TestMain's
// goleak check covers goroutines.
func TestPanickingRequestOverHTTP(t *testing.T) {
	e, runner, tok := startFaultyE2E(t, nil)
	victim, err := tok.Encode("a prompt that breaks the sampler", true)
	if err != nil {
		t.Fatal(err)
	}
	runner.victim.Store(&victim)
	const good = `{"model":"tiny","prompt":"Once upon a time","max_tokens":12,"temperature":0,"logprobs":1}`
	wantStatus, wantBody := e.post(t, "/v1/completions", good)
	if wantStatus != 200 {
		t.Fatalf("a good request: %d %s", wantStatus, wantBody)
	}
	var wg sync.WaitGroup
	goodBodies := make([][]byte, 4)
	for i := range goodBodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body := e.post(t, "/v1/completions", good)
			if status != 200 {
				t.Errorf("a request next to the panic: %d %s", status, body)
			}
			goodBodies[i] = body
		}()
	}
	status, body := e.post(t, "/v1/completions", `{"model":"tiny","prompt":"a prompt that breaks the sampler","max_tokens":12,"temperature":0,"logprobs":1}`)
	wg.Wait()
	wantErrorObject(t, "the panicking request", status, body, "internal_error", "panic")
	choices := func(b []byte) string {
		var r struct{ Choices json.RawMessage }
		_ = json.Unmarshal(b, &r)
		return string(r.Choices)
	}
	for _, b := range goodBodies {
		if choices(b) != choices(wantBody) {
			t.Errorf("a request next to the panic answered\n%s\nalone it answers\n%s", b, wantBody)
		}
	}
	if code, _ := e.health(t); code != 200 {
		t.Fatalf("/health after a panic: %d", code)
	}
	if status, _ := e.post(t, "/v1/completions", good); status != 200 {
		t.Fatalf("after the panic: %d", status)
	}
	waitFor(t, "free KV blocks", func() bool { st := e.eng.Stats(); return st.KVFreeBlocks == st.KVTotalBlocks })
	if st := e.eng.Stats(); st.RecoveredPanics != 1 {
		t.Fatalf("%d recovered panics, want 1", st.RecoveredPanics)
	}
}
