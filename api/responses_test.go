package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	apiopenai "github.com/conveyor-llm/conveyor/api/openai"
	apiresponses "github.com/conveyor-llm/conveyor/api/responses"
	"github.com/conveyor-llm/conveyor/api/respstore"
)

// respServer is a server on the fake engine behind a real listener, with the official
// client pointed at it.
type respServer struct {
	srv    *Server
	eng    *fakeEngine
	st     *faultStore
	base   string
	client openai.Client
}

// faultStore is a response store whose writes fail with the error fault returns, while
// one is set.
type faultStore struct {
	*respstore.Store
	fault atomic.Pointer[func(respstore.Record) error]
}

func (f *faultStore) Put(rec respstore.Record) error {
	if fault := f.fault.Load(); fault != nil {
		if err := (*fault)(rec); err != nil {
			return err
		}
	}
	return f.Store.Put(rec)
}

// newRespServer starts one; dir, when set, holds a response store.
func newRespServer(t *testing.T, dir string) *respServer {
	t.Helper()
	r := &respServer{eng: newFakeEngine()}
	if dir != "" {
		st, err := respstore.Open(respstore.DefaultConfig(dir))
		if err != nil {
			t.Fatal(err)
		}
		r.st = &faultStore{Store: st}
	}
	r.srv = newTestServer(t, r.eng, func(c *Config) {
		c.Responses = apiresponses.Config{Unavailable: "no --data-dir was given"}
		if r.st != nil {
			c.Responses.Store = r.st
		}
	})
	hs := httptest.NewServer(r.srv.Handler())
	r.base = hs.URL
	r.client = openai.NewClient(option.WithBaseURL(hs.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	t.Cleanup(func() {
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r.srv.resp.Shutdown(ctx)
		r.eng.wg.Wait()
		if r.st != nil {
			r.st.Close()
		}
	})
	return r
}

// promptText is the text of the engine's last prompt (the fake tokenizer's rendering:
// "<role>content\n" per message).
func (r *respServer) promptText() string {
	return fakeTokenizer{}.Decode(r.eng.lastRequest().Prompt, true)
}

func apiError(t *testing.T, err error) *openai.Error {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) {
		t.Fatalf("want an API error, got %v", err)
	}
	return e
}

func TestResponsesPlain(t *testing.T) {
	r := newRespServer(t, "")
	ctx := context.Background()
	resp, err := r.client.Responses.New(ctx, responses.ResponseNewParams{
		Model: testModel, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
		Instructions: openai.String("be brief"), MaxOutputTokens: openai.Int(5), Store: openai.Bool(false),
		Temperature: openai.Float(0.5), User: openai.String("u1"), Metadata: map[string]string{"k": "v"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.promptText(), "<system>be brief\n<user>hi\n<assistant>"; got != want {
		t.Fatalf("prompt %q, want %q", got, want)
	}
	if p := r.eng.lastRequest().Params; p.MaxTokens != 5 || p.Temperature != 0.5 {
		t.Fatalf("params %+v", p)
	}
	if !strings.HasPrefix(resp.ID, "resp_") || resp.Object != "response" || resp.Model != testModel {
		t.Fatalf("response %+v", resp)
	}
	// The fake engine stops at max_output_tokens: the response is incomplete.
	if resp.Status != "incomplete" || resp.IncompleteDetails.Reason != "max_output_tokens" {
		t.Fatalf("status %q, incomplete_details %+v", resp.Status, resp.IncompleteDetails)
	}
	if resp.OutputText() != "abcde" || len(resp.Output) != 1 || resp.Output[0].Type != "message" ||
		!strings.HasPrefix(resp.Output[0].ID, "msg_") || resp.Output[0].Role != "assistant" {
		t.Fatalf("output %q %+v", resp.OutputText(), resp.Output)
	}
	prompt := len(r.eng.lastRequest().Prompt)
	if u := resp.Usage; u.InputTokens != int64(prompt) || u.OutputTokens != 5 || u.TotalTokens != int64(prompt+5) {
		t.Fatalf("usage %+v, prompt %d tokens", u, prompt)
	}
	if resp.Instructions.OfString != "be brief" || resp.MaxOutputTokens != 5 || resp.Metadata["k"] != "v" || !strings.Contains(resp.RawJSON(), `"store":false`) {
		t.Fatalf("echo: %s", resp.RawJSON())
	}
}

func TestResponsesInputItems(t *testing.T) {
	r := newRespServer(t, "")
	body := `{"model":"test-model","store":false,"max_output_tokens":2,"input":[
		{"role":"developer","content":"d"},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"t"}]},
		{"type":"function_call","call_id":"call_1","name":"weather","arguments":"{\"city\":\"Paris\"}"},
		{"type":"function_call_output","call_id":"call_1","output":"sunny"}]}`
	rec := do(t, r.srv.Handler(), "POST", "/v1/responses", body)
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	// No tools in the request: the template renders the call's turn as it is (the fake's
	// knows no tool calls).
	want := "<developer>d\n<user>ab\n<assistant>t\n<tool>sunny\n<assistant>"
	if got := r.promptText(); got != want {
		t.Fatalf("prompt %q, want %q", got, want)
	}
}

func TestResponsesErrors(t *testing.T) {
	r := newRespServer(t, "")
	h := r.srv.Handler()
	cases := []struct{ body, param, code string }{
		{`{"model":"test-model","store":false}`, "input", "invalid_value"},
		{`{"model":"test-model","store":false,"input":7}`, "input", "invalid_value"},
		{`{"model":"test-model","input":"x"}`, "store", "unsupported_value"},
		{`{"model":"test-model","store":false,"input":"x","previous_response_id":"resp_1"}`, "previous_response_id", "unsupported_value"},
		{`{"model":"test-model","store":false,"input":"x","tools":[{"type":"web_search"}]}`, "tools", "unsupported_value"},
		{`{"model":"test-model","store":false,"input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"file_search"}}`, "tool_choice", "unsupported_value"},
		{`{"model":"test-model","store":false,"input":[{"type":"item_reference","id":"x"}]}`, "input[0].type", "unsupported_value"},
		{`{"model":"test-model","store":false,"input":[{"type":"bogus"}]}`, "input[0].type", "invalid_value"},
		{`{"model":"test-model","store":false,"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]}`, "input[0].content[0].type", "unsupported_value"},
		{`{"model":"test-model","store":false,"input":[{"role":"robot","content":"x"}]}`, "input[0].role", "invalid_value"},
		{`{"model":"test-model","store":false,"input":[{"type":"function_call_output","call_id":"c9","output":"x"}]}`, "input[0].call_id", "invalid_value"},
		{`{"model":"test-model","store":false,"input":"x","max_output_tokens":"ten"}`, "max_output_tokens", "invalid_value"},
		{`{"model":"test-model","store":false,"input":"x","temperature":5}`, "temperature", "invalid_value"},
		{`{"model":"test-model","store":false,"input":"x","text":{"format":{"type":"json_object"}}}`, "text.format", "unsupported_value"},
		{`{"model":"test-model","store":false,"input":"x","text":{"format":{"type":"json_schema","name":"x"}}}`, "text.format.schema", "invalid_value"},
		{`{"model":"test-model","store":false,"input":"x","reasoning":{"effort":"high"}}`, "reasoning.effort", "unsupported_value"},
		{`{"model":"test-model","store":false,"input":"x","include":["message.output_text.logprobs"]}`, "include", "unsupported_value"},
		{`{"model":"test-model","store":false,"input":"x","top_logprobs":-1}`, "top_logprobs", "invalid_value"},
		{`{"model":"test-model","store":false,"input":"x","top_logprobs":21}`, "top_logprobs", "invalid_value"},
		{`{"model":"test-model","store":false,"input":"x","top_logprobs":3}`, "top_logprobs", "unsupported_value"},
		{`{"model":"test-model","store":false,"input":"x","truncation":"auto"}`, "truncation", "unsupported_value"},
		{`{"model":"test-model","store":false,"input":"x","conversation":"conv_1"}`, "conversation", "unsupported_parameter"},
		{`{"model":"test-model","store":false,"input":"x","prompt_cache_retention":"forever"}`, "prompt_cache_retention", "invalid_value"},
		{`{"model":"test-model","store":false,"input":"x","background":true}`, "background", "invalid_value"},
		{`{"model":"test-model","store":false,"input":"x","stream_options":{}}`, "stream_options", "invalid_value"},
	}
	for _, tc := range cases {
		rec := do(t, h, "POST", "/v1/responses", tc.body)
		if rec.Code != 400 {
			t.Fatalf("%s: status %d: %s", tc.body, rec.Code, rec.Body)
		}
		e := errorObject(t, rec.Body.Bytes())
		if e["param"] != tc.param || e["code"] != tc.code {
			t.Fatalf("%s: param %v code %v, want %s %s: %s", tc.body, e["param"], e["code"], tc.param, tc.code, e["message"])
		}
	}
	if rec := do(t, h, "POST", "/v1/responses", `{"model":"other","store":false,"input":"x"}`); rec.Code != 404 {
		t.Fatalf("unknown model: %d", rec.Code)
	}
	for _, path := range []string{"/v1/responses/resp_x", "/v1/responses/resp_x/input_items"} {
		if rec := do(t, h, "GET", path, ""); rec.Code != 404 {
			t.Fatalf("GET %s without a store: %d", path, rec.Code)
		}
	}
}

// streamEvents reads a raw streamed response: each event's name (which must match its
// type) and data.
func streamEvents(t *testing.T, body io.Reader) []map[string]any {
	t.Helper()
	raw, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, block := range strings.Split(strings.TrimSpace(string(raw)), "\n\n") {
		if strings.HasPrefix(block, ":") {
			continue
		}
		lines := strings.Split(block, "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "event: ") || !strings.HasPrefix(lines[1], "data: ") {
			t.Fatalf("bad event block %q", block)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[1], "data: ")), &m); err != nil {
			t.Fatal(err)
		}
		if m["type"] != strings.TrimPrefix(lines[0], "event: ") {
			t.Fatalf("event name %q, type %v", lines[0], m["type"])
		}
		out = append(out, m)
	}
	return out
}

func TestResponsesStreamEvents(t *testing.T) {
	r := newRespServer(t, "")
	res, err := http.Post(r.base+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"test-model","store":false,"stream":true,"max_output_tokens":3,"input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); res.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("%d %s", res.StatusCode, ct)
	}
	evs := streamEvents(t, res.Body)
	var types []string
	var text strings.Builder
	for i, ev := range evs {
		types = append(types, ev["type"].(string))
		if ev["sequence_number"] != float64(i) {
			t.Fatalf("event %d has sequence_number %v", i, ev["sequence_number"])
		}
		if ev["type"] == "response.output_text.delta" {
			text.WriteString(ev["delta"].(string))
		}
	}
	if item := evs[2]["item"].(map[string]any); item["type"] != "message" || item["status"] != "in_progress" || item["content"] == nil {
		t.Fatalf("output_item.added: %v", item)
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
		"response.content_part.done", "response.output_item.done", "response.incomplete"}
	if !slices.Equal(types, want) {
		t.Fatalf("events %v\nwant %v", types, want)
	}
	last := evs[len(evs)-1]["response"].(map[string]any)
	if text.String() != "abc" || last["output_text"] != "abc" || last["status"] != "incomplete" {
		t.Fatalf("text %q, last %v", text.String(), last)
	}

	// The official client reads the same stream.
	st := r.client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{Model: testModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}, MaxOutputTokens: openai.Int(4), Store: openai.Bool(false)})
	var final responses.Response
	n := 0
	for st.Next() {
		ev := st.Current()
		if ev.SequenceNumber != int64(n) {
			t.Fatalf("sequence %d at %d", ev.SequenceNumber, n)
		}
		n++
		if ev.Type == "response.incomplete" {
			final = ev.Response
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if final.OutputText() != "abcd" || final.Usage.OutputTokens != 4 {
		t.Fatalf("final %s", final.RawJSON())
	}
}

func TestResponsesStreamFailure(t *testing.T) {
	r := newRespServer(t, "")
	r.eng.failAfter = 2
	res, err := http.Post(r.base+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"test-model","store":false,"stream":true,"max_output_tokens":5,"input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	evs := streamEvents(t, res.Body)
	n := len(evs)
	if n < 2 || evs[n-2]["type"] != "error" || evs[n-1]["type"] != "response.failed" {
		t.Fatalf("events end with %v", evs[max(0, n-3):])
	}
	if resp := evs[n-1]["response"].(map[string]any); resp["status"] != "failed" || resp["error"] == nil {
		t.Fatalf("failed response %v", resp)
	}
}

func TestResponsesStoreChain(t *testing.T) {
	r := newRespServer(t, t.TempDir())
	ctx := context.Background()
	var prev string
	var ids []string
	for turn, text := range []string{"1", "2", "3"} {
		p := responses.ResponseNewParams{Model: testModel, MaxOutputTokens: openai.Int(1),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(text)}}
		if prev != "" {
			p.PreviousResponseID = openai.String(prev)
		}
		resp, err := r.client.Responses.New(ctx, p)
		if err != nil {
			t.Fatalf("turn %d: %v %s", turn, err, apiError(t, err).RawJSON())
		}
		prev = resp.ID
		ids = append(ids, resp.ID)
	}
	// The third prompt holds the whole conversation.
	if got, want := r.promptText(), "<user>1\n<assistant>a\n<user>2\n<assistant>a\n<user>3\n<assistant>"; got != want {
		t.Fatalf("third prompt %q, want %q", got, want)
	}
	got, err := r.client.Responses.Get(ctx, ids[1], responses.ResponseGetParams{})
	if err != nil || got.OutputText() != "a" || got.PreviousResponseID != ids[0] || !strings.Contains(got.RawJSON(), `"store":true`) {
		t.Fatalf("GET: %v %s", err, got.RawJSON())
	}
	items, err := r.client.Responses.InputItems.List(ctx, ids[2], responses.InputItemListParams{})
	if err != nil || len(items.Data) != 1 || items.Data[0].Type != "message" || items.HasMore {
		t.Fatalf("input_items: %v %+v", err, items)
	}
	if err := r.client.Responses.Delete(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.Responses.Get(ctx, ids[0], responses.ResponseGetParams{}); apiError(t, err).StatusCode != 404 {
		t.Fatalf("GET after DELETE: %v", err)
	}
	if err := r.client.Responses.Delete(ctx, ids[0]); apiError(t, err).StatusCode != 404 {
		t.Fatalf("second DELETE: %v", err)
	}
	// store:false keeps nothing.
	resp, err := r.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, Store: openai.Bool(false),
		MaxOutputTokens: openai.Int(1), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.Responses.Get(ctx, resp.ID, responses.ResponseGetParams{}); apiError(t, err).StatusCode != 404 {
		t.Fatalf("GET of a store:false response: %v", err)
	}
	if r.st.Len() != 2 {
		t.Fatalf("store holds %d responses, want 2", r.st.Len())
	}
	// An unknown previous_response_id is named.
	_, err = r.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, PreviousResponseID: openai.String("resp_nope"),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	if e := apiError(t, err); e.StatusCode != 400 || e.Param != "previous_response_id" {
		t.Fatalf("unknown previous_response_id: %v", err)
	}
}

func TestResponsesInputItemsPages(t *testing.T) {
	r := newRespServer(t, t.TempDir())
	input := `[{"role":"user","content":"1"},{"role":"assistant","content":"2"},{"role":"user","content":"3"},{"role":"user","content":"4"},{"role":"user","content":"5"}]`
	rec := do(t, r.srv.Handler(), "POST", "/v1/responses", `{"model":"test-model","max_output_tokens":1,"input":`+input+`}`)
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	id := decode(t, rec)["id"].(string)
	var texts []string
	after := ""
	for page := 0; ; page++ {
		q := "?limit=2&order=asc"
		if after != "" {
			q += "&after=" + after
		}
		rec := do(t, r.srv.Handler(), "GET", "/v1/responses/"+id+"/input_items"+q, "")
		var l apiopenai.ItemList
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &l) != nil || l.Object != "list" {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		for _, it := range l.Data {
			texts = append(texts, it.Content[0].Text)
		}
		if *l.FirstID != l.Data[0].ID || *l.LastID != l.Data[len(l.Data)-1].ID {
			t.Fatalf("first/last ids: %s", rec.Body)
		}
		if !l.HasMore {
			break
		}
		after = *l.LastID
	}
	if strings.Join(texts, "") != "12345" {
		t.Fatalf("paged items %v", texts)
	}
	rec = do(t, r.srv.Handler(), "GET", "/v1/responses/"+id+"/input_items", "")
	var l apiopenai.ItemList
	_ = json.Unmarshal(rec.Body.Bytes(), &l)
	if len(l.Data) != 5 || l.Data[0].Content[0].Text != "5" || l.Data[0].Role != "user" || l.Data[1].Content[0].Type != "input_text" {
		t.Fatalf("default order is desc: %s", rec.Body)
	}
	if rec := do(t, r.srv.Handler(), "GET", "/v1/responses/"+id+"/input_items?limit=0", ""); rec.Code != 400 {
		t.Fatalf("limit=0: %d", rec.Code)
	}
	if rec := do(t, r.srv.Handler(), "GET", "/v1/responses/"+id+"/input_items?after=", ""); rec.Code != 400 || !strings.Contains(rec.Body.String(), `"param":"after"`) {
		t.Fatalf("an empty after: %d %s", rec.Code, rec.Body)
	}
}

func TestResponsesBackgroundCancel(t *testing.T) {
	r := newRespServer(t, t.TempDir())
	r.eng.gate = make(chan struct{})
	ctx := context.Background()
	resp, err := r.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, Background: openai.Bool(true),
		MaxOutputTokens: openai.Int(50), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != "queued" || !resp.Background {
		t.Fatalf("background response %s", resp.RawJSON())
	}
	waitFor(t, "in_progress", func() bool {
		got, err := r.client.Responses.Get(ctx, resp.ID, responses.ResponseGetParams{})
		return err == nil && got.Status == "in_progress"
	})
	r.eng.gate <- struct{}{} // one token
	got, err := r.client.Responses.Cancel(ctx, resp.ID)
	if err != nil || got.Status != "cancelled" {
		t.Fatalf("cancel: %v %s", err, got.RawJSON())
	}
	if !r.eng.wasAborted(resp.ID) {
		t.Fatal("the engine request was not aborted")
	}
	got, err = r.client.Responses.Get(ctx, resp.ID, responses.ResponseGetParams{})
	if err != nil || got.Status != "cancelled" {
		t.Fatalf("GET after cancel: %v %s", err, got.RawJSON())
	}

	// A background response that finishes is polled to its end.
	close(r.eng.gate)
	resp, err = r.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, Background: openai.Bool(true),
		MaxOutputTokens: openai.Int(3), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the background response to end", func() bool {
		got, err = r.client.Responses.Get(ctx, resp.ID, responses.ResponseGetParams{})
		return err == nil && got.Status == "incomplete"
	})
	if got.OutputText() != "abc" {
		t.Fatalf("polled %s", got.RawJSON())
	}
	// Cancelling a finished response returns it; a response that is not background is refused.
	if again, err := r.client.Responses.Cancel(ctx, resp.ID); err != nil || again.Status != "incomplete" {
		t.Fatalf("cancel after the end: %v", err)
	}
	fg, err := r.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, MaxOutputTokens: openai.Int(1),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.Responses.Cancel(ctx, fg.ID); apiError(t, err).StatusCode != 400 {
		t.Fatalf("cancel of a foreground response: %v", err)
	}
}

// TestResponsesRestart stores responses, drops the server and its store without a
// clean shutdown while a background response runs, then opens the store again in a
// new server: the finished response is read and continued, the unfinished one is
// failed with a reason.
func TestResponsesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	r1 := newRespServer(t, dir)
	done, err := r1.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, MaxOutputTokens: openai.Int(2),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("first")}})
	if err != nil {
		t.Fatal(err)
	}
	r1.eng.gate = make(chan struct{})
	bg, err := r1.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, Background: openai.Bool(true),
		MaxOutputTokens: openai.Int(5), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "in_progress", func() bool {
		rec, err := r1.st.Get(bg.ID)
		return err == nil && rec.Status == "in_progress"
	})
	// The "crash": the database is closed under the running response, which can no
	// longer record its end.
	r1.st.Close()
	close(r1.eng.gate)

	r2 := newRespServer(t, dir)
	got, err := r2.client.Responses.Get(ctx, bg.ID, responses.ResponseGetParams{})
	if err != nil || got.Status != "failed" || got.Error.Message != apiresponses.RestartFailure {
		t.Fatalf("unfinished response after restart: %v %s", err, got.RawJSON())
	}
	got, err = r2.client.Responses.Get(ctx, done.ID, responses.ResponseGetParams{})
	if err != nil || got.OutputText() != "ab" {
		t.Fatalf("stored response after restart: %v %s", err, got.RawJSON())
	}
	_, err = r2.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, MaxOutputTokens: openai.Int(1),
		PreviousResponseID: openai.String(done.ID), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("again")}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r2.promptText(), "<user>first\n<assistant>ab\n<user>again\n<assistant>"; got != want {
		t.Fatalf("continued prompt %q, want %q", got, want)
	}
}

func TestResponsesTooLargeToStore(t *testing.T) {
	cfg := respstore.DefaultConfig(t.TempDir())
	cfg.MaxRecordBytes = 2500
	st, err := respstore.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := newTestServer(t, newFakeEngine(), func(c *Config) { c.Responses = apiresponses.Config{Store: st} })
	big := strings.Repeat("x", 3000)
	rec := do(t, s.Handler(), "POST", "/v1/responses", `{"model":"test-model","max_output_tokens":4,"input":"`+big+`"}`)
	if e := errorObject(t, rec.Body.Bytes()); rec.Code != 400 || e["param"] != "input" || !strings.Contains(e["message"].(string), "too large to store") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	rec = do(t, s.Handler(), "POST", "/v1/responses", `{"model":"test-model","max_output_tokens":4,"input":"small"}`)
	if rec.Code != 200 || st.Len() != 1 {
		t.Fatalf("a small response: %d %s (%d stored)", rec.Code, rec.Body, st.Len())
	}
}

// TestResponsesStoreDiskFull: while the store's writes fail with ENOSPC, a stored
// response fails with a 500 that names the cause (streamed: an error event, then
// response.failed), a background one is refused, store:false ones are served, and
// nothing of the failed ones is kept; once writes succeed again so does storing, and
// what was stored before is intact.
func TestResponsesStoreDiskFull(t *testing.T) {
	r := newRespServer(t, t.TempDir())
	ctx := context.Background()
	input := responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}
	before, err := r.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, Input: input, MaxOutputTokens: openai.Int(3)})
	if err != nil {
		t.Fatal(err)
	}

	var failed atomic.Int32
	full := func(respstore.Record) error {
		failed.Add(1)
		return fmt.Errorf("write responses.db: %w", syscall.ENOSPC)
	}
	r.st.fault.Store(&full)
	_, err = r.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, Input: input, MaxOutputTokens: openai.Int(3)})
	e := apiError(t, err)
	if e.StatusCode != 500 || !strings.Contains(e.Message, "no space left on device") || strings.Contains(e.Message, "responses.db") {
		t.Fatalf("stored response on a full disk: %d %q", e.StatusCode, e.Message)
	}
	res, err := http.Post(r.base+"/v1/responses", "application/json",
		strings.NewReader(`{"model":"test-model","stream":true,"max_output_tokens":3,"input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	evs := streamEvents(t, res.Body)
	res.Body.Close()
	n := len(evs)
	if n < 2 || evs[n-2]["type"] != "error" || evs[n-1]["type"] != "response.failed" ||
		!strings.Contains(fmt.Sprint(evs[n-2]["message"]), "no space left on device") {
		t.Fatalf("streamed response on a full disk: events end with %v", evs[max(0, n-3):])
	}
	_, err = r.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, Input: input,
		MaxOutputTokens: openai.Int(3), Background: openai.Bool(true)})
	if e := apiError(t, err); e.StatusCode != 500 {
		t.Fatalf("background response on a full disk: %d %q", e.StatusCode, e.Message)
	}
	if _, err := r.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, Input: input,
		MaxOutputTokens: openai.Int(3), Store: openai.Bool(false)}); err != nil {
		t.Fatalf("store:false on a full disk: %v", err)
	}
	if failed.Load() != 3 || r.st.Len() != 1 {
		t.Fatalf("%d failed writes, %d stored; want 3 and only the first response", failed.Load(), r.st.Len())
	}
	waitFor(t, "the engine idle", func() bool {
		r.eng.mu.Lock()
		defer r.eng.mu.Unlock()
		return len(r.eng.live) == 0
	})

	r.st.fault.Store(nil)
	after, err := r.client.Responses.New(ctx, responses.ResponseNewParams{Model: testModel, Input: input,
		MaxOutputTokens: openai.Int(3), PreviousResponseID: openai.String(before.ID)})
	if err != nil {
		t.Fatalf("after the disk has room again: %v", err)
	}
	got, err := r.client.Responses.Get(ctx, before.ID, responses.ResponseGetParams{})
	if err != nil || got.OutputText() != before.OutputText() || r.st.Len() != 2 || after.Status == "failed" {
		t.Fatalf("stored before the fault: %v %q (was %q), %d stored", err, got.OutputText(), before.OutputText(), r.st.Len())
	}
}

// TestResponsesSamplingExtensions: vLLM's sampling members reach the engine through
// /v1/responses as through the chat endpoint.
func TestResponsesSamplingExtensions(t *testing.T) {
	r := newRespServer(t, "")
	rec := do(t, r.srv.Handler(), "POST", "/v1/responses", `{"model":"test-model","input":"hi","store":false,"max_output_tokens":6,
		"top_k":7,"min_p":0.05,"repetition_penalty":1.1,"min_tokens":2,"ignore_eos":true,"stop_token_ids":[9],"seed":3,"presence_penalty":0.5}`)
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	p := r.eng.lastRequest().Params
	if p.TopK != 7 || p.MinP != 0.05 || p.RepetitionPenalty != 1.1 || p.MinTokens != 2 || !p.IgnoreEOS ||
		!slices.Equal(p.StopTokenIDs, []int32{9}) || p.Seed == nil || *p.Seed != 3 || p.PresencePenalty != 0.5 {
		t.Fatalf("params %+v", p)
	}
}

// TestResponsesStreamClientGone: a streamed, stored response whose client leaves mid-way
// was announced by id (response.created), so it stays stored, as cancelled; one with
// store false leaves nothing.
func TestResponsesStreamClientGone(t *testing.T) {
	r := newRespServer(t, t.TempDir())
	r.eng.gate = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	stream := r.client.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: testModel, MaxOutputTokens: openai.Int(50),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	if !stream.Next() {
		t.Fatalf("no first event: %v", stream.Err())
	}
	created := stream.Current()
	if created.Type != "response.created" || created.Response.ID == "" {
		t.Fatalf("first event %s", created.RawJSON())
	}
	id := created.Response.ID
	r.eng.gate <- struct{}{} // one token, then the client leaves
	cancel()
	stream.Close()
	var got *responses.Response
	waitFor(t, "the response stored as cancelled", func() bool {
		var err error
		got, err = r.client.Responses.Get(context.Background(), id, responses.ResponseGetParams{})
		return err == nil && got.Status == "cancelled"
	})
	if !r.eng.wasAborted(id) {
		t.Fatal("the engine request was not aborted")
	}
	// It can be continued: its input is the conversation so far.
	close(r.eng.gate)
	next, err := r.client.Responses.New(context.Background(), responses.ResponseNewParams{Model: testModel, MaxOutputTokens: openai.Int(1),
		PreviousResponseID: openai.String(id), Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("again")}})
	if err != nil || next.Status != "incomplete" {
		t.Fatalf("continuing the cancelled response: %v", err)
	}
}
