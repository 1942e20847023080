package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// batchResult is one output line of run-batch.
type batchResult struct {
	ID       string         `json:"id"`
	CustomID *string        `json:"custom_id"`
	Response *batchResponse `json:"response"`
	Error    *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

type batchResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

// readBatchOutput parses every line of path, failing on a partial or malformed line.
func readBatchOutput(t *testing.T, path string) []batchResult {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		t.Fatalf("output does not end with a whole line: %q", data[max(0, len(data)-80):])
	}
	var out []batchResult
	for i, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "" {
			continue
		}
		var r batchResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("output line %d is not JSON: %v: %q", i+1, err, line)
		}
		if !strings.HasPrefix(r.ID, "batch_req_") {
			t.Errorf("output line %d: id %q", i+1, r.ID)
		}
		out = append(out, r)
	}
	return out
}

// byCustomID groups results by custom_id ("" for lines without one).
func byCustomID(rs []batchResult) map[string][]batchResult {
	m := map[string][]batchResult{}
	for _, r := range rs {
		id := ""
		if r.CustomID != nil {
			id = *r.CustomID
		}
		m[id] = append(m[id], r)
	}
	return m
}

// batchFlags are the model and engine flags the tests run the tiny model with.
func batchFlags(t *testing.T, dir string) []string {
	return []string{"--model", dir, "--ort-lib", testORTLib(t), "--threads", "1", "--kv-cache-memory", "8MiB",
		"--served-model-name", "tiny", "--max-num-seqs", "8", "--max-num-batched-tokens", "128"}
}

func newBatchOptions(t *testing.T, dir, input, output string, extra ...string) *batchOptions {
	t.Helper()
	args := append(batchFlags(t, dir), "--input", input, "--output", output)
	o, err := parseBatchFlags(append(args, extra...), env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func writeLines(t *testing.T, path string, lines ...string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func completionLine(id string, body string) string {
	return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":"/v1/completions","body":%s}`, id, body)
}

// completionLines returns n completion lines for the tiny model: custom_id
// fmt.Sprintf(idFormat, i), prompt "<word> i", max_tokens maxTokens (and ignore_eos
// when ignoreEOS), for i in 0..n-1.
func completionLines(n int, idFormat, word string, maxTokens int, ignoreEOS bool) []string {
	extra := ""
	if ignoreEOS {
		extra = `,"ignore_eos":true`
	}
	lines := make([]string, n)
	for i := range lines {
		lines[i] = completionLine(fmt.Sprintf(idFormat, i), fmt.Sprintf(`{"model":"tiny","prompt":"%s %d","max_tokens":%d%s}`, word, i, maxTokens, extra))
	}
	return lines
}

// TestRunBatchMixedMatchesHTTP runs a file mixing good and bad lines: every input line
// gets one output line, and each response is the one the HTTP server gives the same body.
func TestRunBatchMixedMatchesHTTP(t *testing.T) {
	dir := tinyModelDir(t)
	tmp := t.TempDir()
	input, output := filepath.Join(tmp, "in.jsonl"), filepath.Join(tmp, "out.jsonl")
	bodies := map[string]string{
		"cmpl":    `{"model":"tiny","prompt":"Once upon a time","max_tokens":12,"temperature":0}`,
		"chat":    `{"model":"tiny","messages":[{"role":"user","content":"Hello there"}],"max_tokens":10,"temperature":0}`,
		"n2":      `{"model":"tiny","prompt":"The jury said","max_tokens":6,"temperature":0,"n":2,"logprobs":2}`,
		"echo":    `{"model":"tiny","prompt":["one","two words"],"max_tokens":5,"temperature":0,"echo":true}`,
		"invalid": `{"model":"tiny","prompt":"x","max_tokens":-1}`,
		"nomodel": `{"model":"other","prompt":"x"}`,
		"badtype": `{"model":"tiny","prompt":"x","stream":"yes"}`,
		// Broken engine rules, with the parameter named as each endpoint names it.
		"rule":     `{"model":"tiny","prompt":"x","temperature":3}`,
		"chatrule": `{"model":"tiny","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":25}`,
	}
	lines := []string{
		completionLine("cmpl", bodies["cmpl"]),
		`{"custom_id":"chat","method":"POST","url":"/v1/chat/completions","body":` + bodies["chat"] + `}`,
		`{"custom_id": "broken", "method": "POST", "url": `, // malformed JSON
		completionLine("n2", bodies["n2"]),
		`{"custom_id":"badurl","method":"POST","url":"/v1/embeddings","body":{"model":"tiny","input":"x"}}`,
		`{"custom_id":"badmethod","method":"GET","url":"/v1/completions","body":{}}`,
		completionLine("invalid", bodies["invalid"]),
		completionLine("cmpl", `{"model":"tiny","prompt":"a duplicate"}`),
		"",
		completionLine("echo", bodies["echo"]),
		completionLine("nomodel", bodies["nomodel"]),
		completionLine("badtype", bodies["badtype"]),
		completionLine("rule", bodies["rule"]),
		`{"custom_id":"chatrule","method":"POST","url":"/v1/chat/completions","body":` + bodies["chatrule"] + `}`,
		completionLine("stream", `{"model":"tiny","prompt":"x","stream":true}`),
		`{"method":"POST","url":"/v1/completions","body":{"model":"tiny","prompt":"x"}}`, // no custom_id
		`{"custom_id":"nobody","method":"POST","url":"/v1/completions"}`,
	}
	writeLines(t, input, lines...)
	o := newBatchOptions(t, dir, input, output, "--max-in-flight", "4")
	var stderr bytes.Buffer
	if err := runBatch(context.Background(), o, &stderr, false); err != nil {
		t.Fatalf("run-batch: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "16 lines answered") {
		t.Errorf("summary: %s", stderr.String())
	}
	res := readBatchOutput(t, output)
	if len(res) != 16 {
		t.Fatalf("%d output lines for 16 input lines", len(res))
	}
	got := byCustomID(res)
	errCode := func(id string, i int) string {
		rs := got[id]
		if i >= len(rs) || rs[i].Error == nil || rs[i].Response != nil {
			t.Fatalf("%s: want an error line, got %+v", id, rs)
		}
		return rs[i].Error.Code
	}
	if len(got[""]) != 2 || errCode("", 0) != "invalid_json" || errCode("", 1) != "missing_custom_id" {
		t.Errorf("lines without a custom_id: %+v", got[""])
	}
	if c := errCode("badurl", 0); c != "invalid_url" {
		t.Errorf("bad url: %s", c)
	}
	if c := errCode("badmethod", 0); c != "invalid_method" {
		t.Errorf("bad method: %s", c)
	}
	if rs := got["cmpl"]; len(rs) != 2 {
		t.Fatalf("duplicate custom_id: %d lines", len(rs))
	}
	ok, dup := got["cmpl"][0], got["cmpl"][1]
	if ok.Response == nil {
		ok, dup = dup, ok
	}
	if dup.Error == nil || dup.Error.Code != "duplicate_custom_id" || ok.Response == nil || ok.Response.StatusCode != 200 {
		t.Errorf("duplicate custom_id: %+v / %+v", ok, dup)
	}
	if r := got["stream"][0].Response; r == nil || r.StatusCode != 400 || !strings.Contains(string(r.Body), `"param":"stream"`) {
		t.Errorf("stream: %+v", got["stream"])
	}

	// The same bodies over HTTP.
	so, err := parseServeFlags(append(batchFlags(t, dir), "--port", "0"), env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	served := make(chan error, 1)
	go func() { served <- serve(ctx, so, io.Discard, io.Discard, ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-served:
		t.Fatalf("serve: %v", err)
	}
	defer func() {
		cancel()
		<-served
		http.DefaultClient.CloseIdleConnections()
	}()
	post := func(url, body string) (int, []byte) {
		resp, err := http.Post("http://"+addr+url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, bytes.TrimSpace(b)
	}
	type completion struct {
		Object  string            `json:"object"`
		Model   string            `json:"model"`
		Choices []json.RawMessage `json:"choices"`
		Usage   json.RawMessage   `json:"usage"`
	}
	for id, body := range bodies {
		url := "/v1/completions"
		if strings.HasPrefix(id, "chat") {
			url = "/v1/chat/completions"
		}
		wantStatus, wantBody := post(url, body)
		var r *batchResponse
		for _, x := range got[id] { // "cmpl" also has its duplicate's error line
			if x.Response != nil {
				r = x.Response
			}
		}
		if r == nil {
			t.Errorf("%s: no response: %+v", id, got[id])
			continue
		}
		if r.StatusCode != wantStatus || !strings.HasPrefix(r.RequestID, "req-") {
			t.Errorf("%s: status %d request_id %q; HTTP gives %d", id, r.StatusCode, r.RequestID, wantStatus)
			continue
		}
		if wantStatus != 200 {
			if want := map[string]string{"rule": `"param":"temperature"`, "chatrule": `"param":"top_logprobs"`}[id]; !bytes.Contains(r.Body, []byte(want)) {
				t.Errorf("%s: body %s does not name %s", id, r.Body, want)
			}
			if !bytes.Equal(r.Body, wantBody) {
				t.Errorf("%s: body\n%s\nHTTP gives\n%s", id, r.Body, wantBody)
			}
			continue
		}
		var g, w completion
		if err := json.Unmarshal(r.Body, &g); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(wantBody, &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s: batch body\n%s\nHTTP body\n%s", id, r.Body, wantBody)
		}
		if id == "n2" && len(g.Choices) != 2 {
			t.Errorf("n=2: %d choices", len(g.Choices))
		}
	}
	// A missing body is the API's own 400, as an empty HTTP body is.
	wantStatus, wantBody := post("/v1/completions", "")
	if r := got["nobody"][0].Response; r == nil || r.StatusCode != wantStatus || !bytes.Equal(r.Body, wantBody) {
		t.Errorf("no body: %+v; HTTP gives %d %s", got["nobody"], wantStatus, wantBody)
	}
}

// TestRunBatchResume appends to an output a killed run left (a truncated last line):
// lines already answered are kept as they are, the rest run once.
func TestRunBatchResume(t *testing.T) {
	dir := tinyModelDir(t)
	tmp := t.TempDir()
	input, output := filepath.Join(tmp, "in.jsonl"), filepath.Join(tmp, "out.jsonl")
	lines := completionLines(8, "c%d", "line", 4, false)
	lines = append(lines, "{oops", completionLine("c1", `{"model":"tiny","prompt":"again"}`), "[1]")
	writeLines(t, input, lines...)
	kept := []string{
		`{"id":"batch_req_kept0","custom_id":"c0","response":{"status_code":200,"request_id":"req-x","body":{"kept":true}},"error":null}`,
		`{"id":"batch_req_kept1","custom_id":null,"response":null,"error":{"code":"invalid_json","message":"line 9: earlier run"}}`,
		`{"id":"batch_req_kept2","custom_id":"c3","response":{"status_code":200,"request_id":"req-y","body":{"kept":true}},"error":null}`,
	}
	partial := strings.Join(kept, "\n") + "\n" + `{"id":"batch_req_0123456789abcdef01234567","custom_id":"c5","response":{"status_co`
	if err := os.WriteFile(output, []byte(partial), 0o644); err != nil {
		t.Fatal(err)
	}
	o := newBatchOptions(t, dir, input, output)
	var stderr bytes.Buffer
	if err := runBatch(context.Background(), o, &stderr, false); err != nil {
		t.Fatalf("run-batch: %v\n%s", err, stderr.String())
	}
	data, _ := os.ReadFile(output)
	if !strings.HasPrefix(string(data), strings.Join(kept, "\n")+"\n") || strings.Contains(string(data), "batch_req_0123456789abcdef01234567") {
		t.Fatalf("the answered lines were not kept as they were, or the partial line stayed:\n%s", data)
	}
	check := func() {
		t.Helper()
		res := readBatchOutput(t, output)
		if len(res) != len(lines) {
			t.Fatalf("%d output lines for %d input lines", len(res), len(lines))
		}
		got := byCustomID(res)
		for i := range 8 {
			id := fmt.Sprintf("c%d", i)
			want := 1
			if id == "c1" {
				want = 2 // its duplicate's error line
			}
			if len(got[id]) != want {
				t.Errorf("%s answered %d times, want %d", id, len(got[id]), want)
			}
		}
		if len(got[""]) != 2 {
			t.Errorf("%d lines without custom_id, want 2", len(got[""]))
		}
	}
	check()
	stderr.Reset()
	if err := runBatch(context.Background(), o, &stderr, false); err != nil {
		t.Fatalf("second run: %v", err)
	}
	if !strings.Contains(stderr.String(), "already answered") || strings.Contains(stderr.String(), "loading model") {
		t.Errorf("a finished batch loaded the model again: %s", stderr.String())
	}
	check()
}

// TestRunBatchCancelThenResume cancels a run mid-way (what SIGINT does): the output holds
// only whole lines, the error says how to resume, and the next run completes the batch.
func TestRunBatchCancelThenResume(t *testing.T) {
	dir := tinyModelDir(t)
	tmp := t.TempDir()
	input, output := filepath.Join(tmp, "in.jsonl"), filepath.Join(tmp, "out.jsonl")
	const n = 24
	writeLines(t, input, completionLines(n, "r%d", "request", 24, true)...)
	o := newBatchOptions(t, dir, input, output, "--max-in-flight", "3", "--shutdown-timeout", "0s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o.onWrite = func(written int) {
		if written == 4 {
			cancel()
		}
	}
	var stderr bytes.Buffer
	err := runBatch(ctx, o, &stderr, false)
	if err == nil || !strings.Contains(err.Error(), "interrupted") || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("cancelled run: err %v", err)
	}
	res := readBatchOutput(t, output)
	if len(res) < 4 || len(res) >= n {
		t.Fatalf("%d lines written before the cancel took effect", len(res))
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("%d of %d lines", len(res), n)) {
		t.Errorf("error %q does not count the %d lines written", err, len(res))
	}
	for _, r := range res {
		if r.Response == nil || r.Response.StatusCode != 200 {
			t.Errorf("an aborted line was written: %+v", r)
		}
	}

	o.onWrite = nil
	stderr.Reset()
	if err := runBatch(context.Background(), o, &stderr, false); err != nil {
		t.Fatalf("resumed run: %v\n%s", err, stderr.String())
	}
	res = readBatchOutput(t, output)
	got := byCustomID(res)
	if len(res) != n || len(got) != n {
		t.Fatalf("%d lines, %d custom_ids after resuming; want %d", len(res), len(got), n)
	}
	for id, rs := range got {
		if len(rs) != 1 || rs[0].Response == nil || rs[0].Response.StatusCode != 200 || !strings.Contains(string(rs[0].Response.Body), `"completion_tokens":24`) {
			t.Errorf("%s: %+v", id, rs)
		}
	}
}

func TestRunBatchFlags(t *testing.T) {
	o, err := parseBatchFlags([]string{"--output", "out.jsonl", "--max-num-seqs", "32"},
		env(map[string]string{"CONVEYOR_INPUT": "in.jsonl", "CONVEYOR_NO_PROGRESS": "true", "CONVEYOR_MAX_NUM_SEQS": "64"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.input != "in.jsonl" || !o.noProgress || o.maxInFlight != 32 || o.model.shutdownTimeout != 5*time.Second || o.model.modelName() != "default" {
		t.Fatalf("options %+v", o)
	}
	if o, err = parseBatchFlags([]string{"--input", "a", "--output", "b", "--max-in-flight", "7"}, env(nil), io.Discard); err != nil || o.maxInFlight != 7 {
		t.Fatalf("--max-in-flight: %+v %v", o, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--input", "a", "--output", "b", "--port", "80"}, "run-batch: flag provided but not defined: -port"},
		{[]string{"--input", "a", "--output", "b", "--attention", "flash"}, "run-batch: --attention"},
		{[]string{"--input", "a", "--output", "b", "--max-num-seqs", "0"}, "run-batch: "},
	} {
		if _, err := parseBatchFlags(tc.args, env(nil), io.Discard); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	var help bytes.Buffer
	parseBatchFlags([]string{"-h"}, env(nil), &help)
	for _, want := range []string{"--input", "max-in-flight", "kv-cache-memory", "CONVEYOR_"} {
		if !strings.Contains(help.String(), strings.TrimPrefix(want, "--")) {
			t.Errorf("help lacks %q", want)
		}
	}
}

// TestRunBatchErrorsAreOneLine covers the command's own failures that need files.
func TestRunBatchErrorsAreOneLine(t *testing.T) {
	tmp := t.TempDir()
	input := filepath.Join(tmp, "in.jsonl")
	writeLines(t, input, completionLine("a", `{"model":"x","prompt":"y"}`))
	notBatch := filepath.Join(tmp, "notes.txt")
	writeLines(t, notBatch, "shopping list", "eggs")
	// A pipe (as /dev/stdout is under `| wc -l`) would block the open or never be read back.
	fifo := filepath.Join(tmp, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(tmp, "model.onnx")
	if err := os.WriteFile(binary, []byte("\x08\x07\x12\x00\x1a\nonnx\n{\"a\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", tmp, "--input", input, "--output", filepath.Join(tmp, "out.jsonl")}, "conveyor: run-batch: " /* no model files */},
		{[]string{"--input", input, "--output", input}, "conveyor: run-batch: --input and --output are the same file"},
		{[]string{"--input", input, "--output", tmp}, "conveyor: run-batch: --output " + tmp + " is a directory"},
		{[]string{"--input", input, "--output", os.DevNull}, "conveyor: run-batch: --output /dev/null is not a regular file"},
		{[]string{"--input", fifo, "--output", filepath.Join(tmp, "o.jsonl")}, "conveyor: run-batch: --input " + fifo + " is not a regular file"},
		{[]string{"--input", input, "--output", fifo}, "conveyor: run-batch: --output " + fifo + " is not a regular file"},
		{[]string{"--input", binary, "--output", filepath.Join(tmp, "o.jsonl")}, "conveyor: run-batch: --input " + binary + " line 1 holds a NUL byte: it is not a JSONL file"},
		{[]string{"--input", input, "--output", notBatch}, "conveyor: run-batch: --output " + notBatch + " line 1 is not a run-batch result"},
		{[]string{"--input", tmp, "--output", filepath.Join(tmp, "o.jsonl")}, "conveyor: run-batch: --input " + tmp + " is a directory"},
	} {
		var stderr bytes.Buffer
		if code := runMain(append([]string{"run-batch", "--no-progress"}, tc.args...), io.Discard, &stderr); code != 1 {
			t.Errorf("%v: exit %d", tc.args, code)
		}
		// The model-load case logs "loading model" first; the error is still one line, the last.
		out := strings.TrimSuffix(stderr.String(), "\n")
		last := out[strings.LastIndex(out, "\n")+1:]
		if !strings.HasPrefix(last, tc.want) || strings.Count(stderr.String(), "conveyor:") != 1 || !strings.HasSuffix(stderr.String(), "\n") {
			t.Errorf("%v: stderr %q, want a last line starting %q", tc.args, stderr.String(), tc.want)
		}
	}
}

func TestFormatProgress(t *testing.T) {
	s := formatProgress(60, 100, 50, 6400, 2, 8, 10*time.Second, 10)
	want := "[======>   ] 60/100 lines  5.0 lines/s  640 tok/s  ETA 0:08  (8 running, 2 not 200)"
	if s != want {
		t.Errorf("got  %q\nwant %q", s, want)
	}
	if s := formatProgress(0, 10, 0, 0, 0, 0, 0, 4); s != "[>   ] 0/10 lines  0.0 lines/s  0 tok/s  ETA --:--  (0 running)" {
		t.Errorf("start: %q", s)
	}
	if s := formatProgress(10, 10, 10, 10, 0, 0, time.Second, 4); !strings.HasPrefix(s, "[====] 10/10") {
		t.Errorf("end: %q", s)
	}
	if formatClock(3725*time.Second) != "1:02:05" {
		t.Error(formatClock(3725 * time.Second))
	}
}

// TestScanLinesSkipsByteOrderMark: a UTF-8 byte order mark before the first line (as some
// editors save files) is not part of the line.
func TestScanLinesSkipsByteOrderMark(t *testing.T) {
	var lines []string
	if err := scanLines(strings.NewReader("\ufeff{\"a\":1}\n\ufeff{\"b\":2}\n"), func(_ int, l []byte) bool {
		lines = append(lines, string(l))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || lines[0] != `{"a":1}` || lines[1] != "\ufeff{\"b\":2}" {
		t.Fatalf("lines %q", lines)
	}
}
