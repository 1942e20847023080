package api

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/r3labs/sse/v2"

	"github.com/conveyor-llm/conveyor/engine"
)

// The end-to-end tests of the server's life around a request: auth, a client that goes
// away, a full queue, and shutdown draining or aborting what is in flight.

func TestE2EWrongKey(t *testing.T) {
	e := startE2E(t, func(c *Config) { c.APIKey = "right" }, nil)
	bad := openai.NewClient(option.WithBaseURL(e.base+"/v1/"), option.WithAPIKey("wrong"), option.WithMaxRetries(0))
	_, err := bad.Completions.New(context.Background(), openai.CompletionNewParams{Model: e2eModel, Prompt: promptString("x"), MaxTokens: openai.Int(1)})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Fatalf("want a 401, got %v", err)
	}
	if _, err := e.client.Completions.New(context.Background(), openai.CompletionNewParams{Model: e2eModel, Prompt: promptString("x"), MaxTokens: openai.Int(1)}); err != nil {
		t.Fatalf("right key: %v", err)
	}
}

// rawStream posts a streaming request and returns the response and an SSE reader.
func rawStream(t *testing.T, ctx context.Context, url, body string) (*http.Response, *sse.EventStreamReader) {
	t.Helper()
	resp := postStream(t, ctx, url, body)
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return resp, sse.NewEventStreamReader(resp.Body, 1<<20)
}

func kvIdle(s engine.Stats) bool {
	// freed blocks that keep a cached prefix count as free (they are reusable at once)
	return s.Running == 0 && s.Waiting == 0 && s.KVFreeBlocks == s.KVTotalBlocks && s.KVUsage == 0
}

func TestE2EDisconnectFreesBlocks(t *testing.T) {
	e := startE2E(t, fastKeepAlive, nil)
	total := e.eng.Stats().KVTotalBlocks
	ctx, cancel := context.WithCancel(context.Background())
	resp, rd := rawStream(t, ctx, e.base+"/v1/completions",
		`{"model":"tiny","prompt":"Once upon a time","max_tokens":480,"ignore_eos":true,"stream":true}`)
	for {
		raw, err := rd.ReadEvent()
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(string(raw), "data: ") {
			break
		}
	}
	waitFor(t, "the sequence to hold KV blocks", func() bool { return e.eng.Stats().KVFreeBlocks < total })
	cancel()
	resp.Body.Close()
	waitFor(t, "every KV block to be free again", func() bool { return kvIdle(e.eng.Stats()) })
	if n := e.eng.Stats().GenerationTokens; n >= 480 {
		t.Fatalf("the sequence ran to its end (%d tokens) instead of being aborted", n)
	}
}

func TestE2EOverloadIs429(t *testing.T) {
	// Static batches of 8 that wait an hour to fill: two requests sit in a queue of two.
	e := startE2E(t, fastKeepAlive, func(c *engine.Config) {
		c.Policy = engine.PolicyStatic
		c.MaxBatchSize = 8
		c.MaxBatchDelay = time.Hour
		c.MaxQueue = 2
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "POST", e.base+"/v1/completions",
				strings.NewReader(`{"model":"tiny","prompt":"x","max_tokens":2,"stream":true}`))
			resp, err := http.DefaultClient.Do(req)
			if err == nil { // the request ends when ctx is cancelled
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	waitFor(t, "two queued requests", func() bool { return e.eng.Stats().Waiting == 2 })
	_, err := e.client.Completions.New(context.Background(), openai.CompletionNewParams{Model: e2eModel, Prompt: promptString("x"), MaxTokens: openai.Int(1)})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 {
		t.Fatalf("want a 429, got %v", err)
	}
	if ra := apiErr.Response.Header.Get("Retry-After"); ra == "" {
		t.Fatal("429 without Retry-After")
	}
	cancel()
	wg.Wait()
	waitFor(t, "the queue to empty", func() bool { return kvIdle(e.eng.Stats()) })
}

func TestE2EShutdownDrainsInFlight(t *testing.T) {
	e := startE2E(t, nil, nil)
	resp, rd := rawStream(t, context.Background(), e.base+"/v1/completions",
		`{"model":"tiny","prompt":"Once upon a time","max_tokens":200,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`)
	defer resp.Body.Close()
	if _, err := rd.ReadEvent(); err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		shut <- e.srv.Shutdown(ctx)
	}()
	waitFor(t, "draining", e.srv.Draining)
	if rec := do(t, e.srv.Handler(), "GET", "/health", ""); rec.Code != 503 {
		t.Fatalf("/health while draining: %d", rec.Code)
	}
	// the in-flight stream still runs to its end
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), `"completion_tokens":200`) || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("stream was cut: ...%s", tail(string(body), 300))
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	<-e.served
	e.closed = true
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(e.base, "http://"), time.Second); err == nil {
		t.Fatal("still accepting connections after Shutdown")
	}
}

func TestE2EShutdownAbortsAtDeadline(t *testing.T) {
	// The request can never run (a static batch that waits an hour), so the drain deadline passes.
	e := startE2E(t, fastKeepAlive, func(c *engine.Config) {
		c.Policy = engine.PolicyStatic
		c.MaxBatchSize = 8
		c.MaxBatchDelay = time.Hour
	})
	resp, rd := rawStream(t, context.Background(), e.base+"/v1/completions", `{"model":"tiny","prompt":"x","max_tokens":2,"stream":true}`)
	defer resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := e.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v", err)
	}
	<-e.served
	e.closed = true
	var last string
	for {
		raw, err := rd.ReadEvent()
		if err != nil {
			break
		}
		if s := string(raw); strings.HasPrefix(s, "data: ") {
			last = s
			if strings.Contains(s, `"error"`) {
				if !strings.Contains(s, `"unavailable"`) {
					t.Fatalf("error event %s", s)
				}
				return
			}
		}
	}
	t.Fatalf("no in-band error after the forced shutdown (last event %q)", last)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
