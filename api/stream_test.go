package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/r3labs/sse/v2"

	apiopenai "github.com/conveyor-llm/conveyor/api/openai"
)

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	data     string
	comments []string
}

// readSSE reads a whole SSE body with r3labs' EventStreamReader, checking the framing:
// only `data:` and comment lines, never an `event:` name.
func readSSE(t *testing.T, body io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	rd := sse.NewEventStreamReader(body, 1<<20)
	for {
		raw, err := rd.ReadEvent()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("reading SSE: %v", err)
		}
		out = append(out, parseEvent(t, raw))
	}
}

func parseEvent(t *testing.T, raw []byte) sseEvent {
	t.Helper()
	var ev sseEvent
	for _, line := range strings.Split(strings.TrimRight(string(raw), "\n"), "\n") {
		switch {
		case strings.HasPrefix(line, ":"):
			ev.comments = append(ev.comments, line)
		case strings.HasPrefix(line, "data: "):
			if ev.data != "" {
				t.Fatalf("two data lines in one event: %q", raw)
			}
			ev.data = strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	return ev
}

// dataEvents drops comment-only events and checks the stream ends with exactly one [DONE].
func dataEvents(t *testing.T, evs []sseEvent) []map[string]json.RawMessage {
	t.Helper()
	var out []map[string]json.RawMessage
	for i, ev := range evs {
		if ev.data == "" {
			continue
		}
		if ev.data == "[DONE]" {
			if i != len(evs)-1 {
				t.Fatalf("[DONE] is not last")
			}
			return out
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(ev.data), &m); err != nil {
			t.Fatalf("chunk is not JSON: %q", ev.data)
		}
		out = append(out, m)
	}
	t.Fatalf("stream did not end with [DONE]")
	return nil
}

func postStream(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestCompletionStreamFraming(t *testing.T) {
	eng := newFakeEngine()
	srv := httptest.NewServer(newTestServer(t, eng, nil).Handler())
	defer srv.Close()
	resp := postStream(t, context.Background(), srv.URL+"/v1/completions",
		`{"model":"test-model","prompt":"x","max_tokens":3,"n":2,"stream":true,"stream_options":{"include_usage":true}}`)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("Cache-Control") != "no-cache" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	chunks := dataEvents(t, readSSE(t, resp.Body))
	texts := map[int]string{}
	finished := map[int]bool{}
	for i, ch := range chunks {
		if _, ok := ch["error"]; ok {
			t.Fatalf("chunk %d has an error key", i)
		}
		if string(ch["usage"]) == "" {
			t.Fatalf("chunk %d lacks the usage key", i)
		}
		var choices []apiopenai.CompletionChoice
		json.Unmarshal(ch["choices"], &choices)
		if i == len(chunks)-1 {
			if len(choices) != 0 || string(ch["usage"]) == "null" {
				t.Fatalf("last chunk should carry usage and no choices: %v", ch)
			}
			var u apiopenai.Usage
			json.Unmarshal(ch["usage"], &u)
			if u.PromptTokens != 2 || u.CompletionTokens != 6 || u.TotalTokens != 8 {
				t.Fatalf("usage %+v", u)
			}
			continue
		}
		if string(ch["usage"]) != "null" || len(choices) != 1 {
			t.Fatalf("chunk %d: usage %s, %d choices", i, ch["usage"], len(choices))
		}
		c := choices[0]
		if finished[c.Index] {
			t.Fatalf("chunk after finish_reason for choice %d", c.Index)
		}
		texts[c.Index] += c.Text
		if c.FinishReason != nil {
			if *c.FinishReason != "length" {
				t.Fatalf("finish_reason %q", *c.FinishReason)
			}
			finished[c.Index] = true
		}
		var obj string
		json.Unmarshal(ch["object"], &obj)
		if obj != "text_completion" {
			t.Fatalf("object %q", obj)
		}
	}
	if texts[0] != "abc" || texts[1] != "bcd" || !finished[0] || !finished[1] {
		t.Fatalf("texts %v finished %v", texts, finished)
	}
}

func TestStreamWithoutIncludeUsageHasNoUsageKey(t *testing.T) {
	eng := newFakeEngine()
	srv := httptest.NewServer(newTestServer(t, eng, nil).Handler())
	defer srv.Close()
	resp := postStream(t, context.Background(), srv.URL+"/v1/completions", `{"model":"test-model","prompt":"x","max_tokens":2,"stream":true}`)
	defer resp.Body.Close()
	for _, ch := range dataEvents(t, readSSE(t, resp.Body)) {
		if _, ok := ch["usage"]; ok {
			t.Fatalf("usage key without include_usage: %v", ch)
		}
	}
}

func TestChatStreamFraming(t *testing.T) {
	eng := newFakeEngine()
	srv := httptest.NewServer(newTestServer(t, eng, nil).Handler())
	defer srv.Close()
	resp := postStream(t, context.Background(), srv.URL+"/v1/chat/completions",
		`{"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true},"logprobs":true}`)
	defer resp.Body.Close()
	chunks := dataEvents(t, readSSE(t, resp.Body))
	type choice struct {
		Index        int             `json:"index"`
		Delta        map[string]any  `json:"delta"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
	}
	var all []choice
	for i, ch := range chunks {
		if _, ok := ch["error"]; ok {
			t.Fatalf("error key in chunk %d", i)
		}
		var obj string
		json.Unmarshal(ch["object"], &obj)
		if obj != "chat.completion.chunk" {
			t.Fatalf("object %q", obj)
		}
		var cs []choice
		json.Unmarshal(ch["choices"], &cs)
		if i == len(chunks)-1 {
			if len(cs) != 0 || string(ch["usage"]) == "null" {
				t.Fatalf("usage chunk %v", ch)
			}
			continue
		}
		all = append(all, cs...)
	}
	if len(all) < 3 {
		t.Fatalf("%d choice chunks", len(all))
	}
	first := all[0].Delta
	if len(first) != 2 || first["role"] != "assistant" || first["content"] != "" {
		t.Fatalf("first delta %v", first)
	}
	last := all[len(all)-1]
	if len(last.Delta) != 0 || last.FinishReason == nil || *last.FinishReason != "length" {
		t.Fatalf("last chunk %+v", last)
	}
	var text string
	for _, c := range all[1 : len(all)-1] {
		if c.FinishReason != nil {
			t.Fatalf("finish_reason before the last chunk")
		}
		text += c.Delta["content"].(string)
		if !bytes.Contains(c.Logprobs, []byte(`"content"`)) {
			t.Fatalf("logprobs missing: %s", c.Logprobs)
		}
	}
	if text != "abc" {
		t.Fatalf("text %q", text)
	}
}

func TestStreamErrorAfterFirstByteIsInBand(t *testing.T) {
	eng := newFakeEngine()
	eng.failAfter = 2
	srv := httptest.NewServer(newTestServer(t, eng, nil).Handler())
	defer srv.Close()
	for _, tc := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"test-model","prompt":"x","max_tokens":5,"stream":true}`},
		{"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"x"}],"max_tokens":5,"stream":true}`},
	} {
		resp := postStream(t, context.Background(), srv.URL+tc.path, tc.body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		chunks := dataEvents(t, readSSE(t, resp.Body))
		resp.Body.Close()
		last := chunks[len(chunks)-1]
		if _, ok := last["error"]; !ok || len(last) != 1 {
			t.Fatalf("%s: last chunk is not an error: %v", tc.path, last)
		}
		e := errorObject(t, mustJSON(last))
		if e["type"] != "server_error" || e["code"] != "model_error" {
			t.Fatalf("error %v", e)
		}
		for _, ch := range chunks[:len(chunks)-1] {
			if _, ok := ch["error"]; ok {
				t.Fatal("error key in a normal chunk")
			}
		}
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func TestStreamKeepAliveWhileWaiting(t *testing.T) {
	eng := newFakeEngine()
	eng.gate = make(chan struct{})
	s := newTestServer(t, eng, func(c *Config) { c.KeepAliveInterval = 10 * time.Millisecond })
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	resp := postStream(t, context.Background(), srv.URL+"/v1/completions", `{"model":"test-model","prompt":"x","max_tokens":1,"stream":true}`)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for _, want := range []string{": keep-alive\n", "\n"} {
		if line, err := br.ReadString('\n'); err != nil || line != want {
			t.Fatalf("line %q, %v; want %q", line, err, want)
		}
	}
	close(eng.gate)
	rest, _ := io.ReadAll(br)
	chunks := dataEvents(t, readSSE(t, bytes.NewReader(rest)))
	if len(chunks) != 1 {
		t.Fatalf("%d chunks", len(chunks))
	}
}

func TestClientDisconnectAbortsSequence(t *testing.T) {
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		eng := newFakeEngine()
		eng.gate = make(chan struct{})
		// headers go out with the first event or keep-alive, so keep-alives must be quick here
		srv := httptest.NewServer(newTestServer(t, eng, fastKeepAlive).Handler())
		ctx, cancel := context.WithCancel(context.Background())
		resp := postStream(t, ctx, srv.URL+path,
			`{"model":"test-model","prompt":"x","messages":[{"role":"user","content":"x"}],"max_tokens":50,"stream":true}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", path, resp.StatusCode)
		}
		eng.gate <- struct{}{}
		rd := sse.NewEventStreamReader(resp.Body, 1<<20)
		if _, err := rd.ReadEvent(); err != nil {
			t.Fatal(err)
		}
		id := eng.lastRequest().ID
		cancel()
		resp.Body.Close()
		eng.wg.Wait() // the fake's generator ends only when the request is aborted or its context is done

		if eng.numLive() != 0 {
			t.Fatalf("%s: sequence still live", path)
		}
		srv.Close() // waits for the handler to return
		if !eng.wasAborted(id) {
			t.Fatalf("%s: Abort(%q) was not called", path, id)
		}
	}
}

// TestClientDisconnectCountsAbort checks that a sequence the client gave up on still
// reaches the metrics as request_success_total{finished_reason="abort"}.
func TestClientDisconnectCountsAbort(t *testing.T) {
	eng := newFakeEngine()
	eng.gate = make(chan struct{})
	s := newTestServer(t, eng, fastKeepAlive)
	srv := httptest.NewServer(s.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	resp := postStream(t, ctx, srv.URL+"/v1/completions", `{"model":"test-model","prompt":"x","max_tokens":50,"stream":true}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	eng.gate <- struct{}{}
	if _, err := sse.NewEventStreamReader(resp.Body, 1<<20).ReadEvent(); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	eng.wg.Wait()
	srv.Close()
	aborted := func() float64 {
		for _, m := range scrape(t, s)["conveyor_request_success_total"].GetMetric() {
			if m.GetLabel()[0].GetValue() == "abort" {
				return m.GetCounter().GetValue()
			}
		}
		return 0
	}
	waitFor(t, `request_success_total{finished_reason="abort"}`, func() bool { return aborted() > 0 })
	if got := aborted(); got != 1 {
		t.Fatalf(`request_success_total{finished_reason="abort"} = %v, want 1`, got)
	}
}

func unmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// fastKeepAlive makes streams send their headers (with a keep-alive comment) soon even when
// no token is released yet.
func fastKeepAlive(c *Config) { c.KeepAliveInterval = 10 * time.Millisecond }

// TestSDKSeesInBandError checks that the official SDK surfaces an error sent after the
// 200 header, after delivering the chunks before it.
func TestSDKSeesInBandError(t *testing.T) {
	eng := newFakeEngine()
	eng.failAfter = 3
	srv := httptest.NewServer(newTestServer(t, eng, nil).Handler())
	defer srv.Close()
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	st := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: testModel,
		MaxTokens: openai.Int(10), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	var text strings.Builder
	for st.Next() {
		if c := st.Current(); len(c.Choices) > 0 {
			text.WriteString(c.Choices[0].Delta.Content)
		}
	}
	if st.Err() == nil || !strings.Contains(st.Err().Error(), "forward pass failed") {
		t.Fatalf("stream error %v", st.Err())
	}
	if text.String() != "abc" {
		t.Fatalf("text before the error %q", text.String())
	}
	st.Close()
}
