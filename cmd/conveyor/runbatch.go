package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/conveyor-llm/conveyor/api"
	"golang.org/x/term"
)

func init() {
	register(command{
		name:    "run-batch",
		summary: "run an OpenAI Batch API JSONL file through a local model offline (resumable)",
		run:     runRunBatch,
	})
}

// batchOptions are the flags of `conveyor run-batch`: serve's model and engine flags
// plus the batch's own.
type batchOptions struct {
	model       serveOptions
	input       string
	output      string
	maxInFlight int
	noProgress  bool

	// onWrite, when set (tests), is called after each output line is written with the
	// number of lines this run has written.
	onWrite func(written int)
	// wrapOutput, when set (tests), wraps the output file's writes: a test makes the disk
	// full with it.
	wrapOutput func(io.Writer) io.Writer
}

// batchURLs are the endpoints a batch line may call.
var batchURLs = map[string]bool{"/v1/completions": true, "/v1/chat/completions": true, "/v1/responses": true}

// parseBatchFlags parses args over the environment (CONVEYOR_<FLAG>, as serve does).
func parseBatchFlags(args []string, getenv func(string) string, output io.Writer) (*batchOptions, error) {
	o := &batchOptions{}
	o.model.cmd = "run-batch"
	fs := flag.NewFlagSet("run-batch", flag.ContinueOnError)
	fs.SetOutput(output)
	modelFlags(fs, &o.model)
	fs.StringVar(&o.input, "input", "", "the batch: a JSONL file of {\"custom_id\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"/v1/chat/completions\" or \"/v1/responses\", \"body\"} lines")
	fs.StringVar(&o.output, "output", "", "the results, one JSON line per input line (any order); when it exists, the lines it already answers are skipped and the rest appended")
	fs.IntVar(&o.maxInFlight, "max-in-flight", 0, "lines running at once at most; 0 = --max-num-seqs")
	fs.BoolVar(&o.noProgress, "no-progress", false, "do not draw the progress bar on stderr (it is only drawn on a terminal)")
	fs.DurationVar(&o.model.shutdownTimeout, "shutdown-timeout", 5*time.Second, "on SIGINT/SIGTERM, how long running lines may finish before they are aborted (aborted lines run again on resume)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, "usage: conveyor run-batch --model DIR --input FILE --output FILE [flags]")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Runs each line of an OpenAI Batch API input file through the OpenAI-compatible API in process")
		fmt.Fprintln(w, "and writes one result line per input line. Re-running with the same --output resumes.")
		fmt.Fprintln(w, "Every flag can also be set through the environment as CONVEYOR_<FLAG> in upper snake case")
		fmt.Fprintln(w, "(--max-in-flight -> CONVEYOR_MAX_IN_FLIGHT); the command line wins.")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "flags:")
		fs.PrintDefaults()
	}
	if err := parseEnvFlags(fs, args, getenv, output); err != nil {
		return nil, err
	}
	// The HTTP server's own settings are not flags here: the handler runs in process.
	ac := api.DefaultConfig()
	o.model.maxConnections = ac.MaxConnections
	o.model.noWebUI = true
	switch {
	case o.input == "":
		return nil, errors.New("run-batch: --input is required")
	case o.output == "":
		return nil, errors.New("run-batch: --output is required")
	case o.maxInFlight < 0:
		return nil, fmt.Errorf("run-batch: --max-in-flight %d must be >= 0", o.maxInFlight)
	}
	if err := o.model.validate(); err != nil {
		return nil, err
	}
	if o.maxInFlight == 0 {
		o.maxInFlight = o.model.maxNumSeqs
	}
	return o, nil
}

func runRunBatch(args []string) error {
	o, err := parseBatchFlags(args, os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	ctx, stop := notifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	progress := !o.noProgress && term.IsTerminal(int(os.Stderr.Fd()))
	return runBatch(ctx, o, os.Stderr, progress)
}

// batchStats counts what a run did, for the progress bar and the summary.
type batchStats struct {
	total    int          // non-blank input lines
	skipped  int          // answered by an earlier run (set before the run starts)
	written  atomic.Int64 // result lines this run wrote
	failed   atomic.Int64 // of those, lines that are not a 200 response
	tokens   atomic.Int64 // completion tokens of this run's 200 responses
	started  time.Time
	inflight atomic.Int64
}

// runBatch runs o.input into o.output. ctx's end (SIGINT, SIGTERM) stops it: no new line
// starts, running lines get --shutdown-timeout to finish and are then aborted, and the
// output keeps only whole lines; the error says how to resume.
func runBatch(ctx context.Context, o *batchOptions, stderr io.Writer, progress bool) error {
	in, err := os.Open(o.input)
	if err != nil {
		return fmt.Errorf("run-batch: %w", err)
	}
	defer in.Close()
	if st, err := in.Stat(); err != nil {
		return fmt.Errorf("run-batch: %w", err)
	} else if st.IsDir() {
		return fmt.Errorf("run-batch: --input %s is a directory", o.input)
	} else if ost, err := os.Stat(o.output); err == nil && os.SameFile(st, ost) {
		return errors.New("run-batch: --input and --output are the same file")
	}
	out, prev, err := openBatchOutput(o.output)
	if err != nil {
		return err
	}
	defer out.Close()

	// A first pass counts the lines and what they need, so that the bar knows the
	// total and a batch with nothing left to run does not load the model.
	pl := newBatchPlanner(prev)
	var toRun int
	stats := &batchStats{}
	if err := scanLines(in, func(n int, line []byte) bool {
		stats.total++
		switch pl.classify(n, line).kind {
		case actSkip:
			stats.skipped++
		case actRun:
			toRun++
		}
		return true
	}); err != nil {
		return fmt.Errorf("run-batch: read %s: %w", o.input, err)
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("run-batch: %w", err)
	}

	log := newBatchLogger(o.model.logFormat, stderr, slog.LevelInfo)
	if stats.skipped > 0 {
		log.Info("resuming", "output", o.output, "answered", stats.skipped, "left", stats.total-stats.skipped)
	}
	var handler http.Handler
	if toRun > 0 {
		srvLog := newBatchLogger(o.model.logFormat, stderr, slog.LevelWarn) // no line per request
		acfg, err := o.model.apiConfig(srvLog, nil)
		if err != nil {
			return err
		}
		// A batch's results are its output file: /v1/responses lines keep nothing.
		acfg.Responses = api.ResponsesConfig{Unavailable: "run-batch keeps no responses", NoStoreByDefault: true}
		ecfg, err := o.model.engineConfig(nil)
		if err != nil {
			return err
		}
		srv, err := api.New(acfg)
		if err != nil {
			return fmt.Errorf("run-batch: %w", err)
		}
		m, err := o.model.loadModel(log, ecfg)
		if err != nil {
			return err
		}
		defer m.shutdown(log, 5*time.Second)
		srv.SetBackend(m.backend)
		m.logReady(log, &o.model, acfg.ModelName, "lines", toRun, "max_in_flight", o.maxInFlight)
		handler = srv.Handler()
	}

	w := &lineWriter{f: out, out: out, size: prev.bytes, onWrite: o.onWrite, stats: stats}
	if o.wrapOutput != nil {
		w.out = o.wrapOutput(out)
	}
	b := &batchRun{handler: handler, w: w, stats: stats}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	w.fail = stopRun // a failed write stops the run
	// Lines run under abortCtx, not ctx: an interrupt lets them finish for a grace period.
	abortCtx, abort := context.WithCancel(context.Background())
	defer abort()

	stats.started = time.Now()
	var bar *progressBar
	if progress {
		bar = startProgressBar(stderr, stats)
	}
	sem := make(chan struct{}, o.maxInFlight)
	var wg sync.WaitGroup
	pl = newBatchPlanner(prev)
	var changed error
	readErr := scanLines(in, func(n int, line []byte) bool {
		if runCtx.Err() != nil {
			return false
		}
		act := pl.classify(n, line)
		switch act.kind {
		case actSkip:
			return true
		case actError:
			w.write(errorResultLine(act.customID, act.code, act.msg), false, 0)
			return true
		}
		if handler == nil { // the first pass found nothing to run
			changed = fmt.Errorf("run-batch: %s changed during the run", o.input)
			return false
		}
		select {
		case sem <- struct{}{}:
		case <-runCtx.Done():
			return false
		}
		wg.Add(1)
		stats.inflight.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer stats.inflight.Add(-1)
			b.run(abortCtx, act)
		}()
		return true
	})

	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-runCtx.Done():
		if ctx.Err() != nil && bar != nil {
			bar.note("interrupted: finishing running lines (Ctrl-C again to quit at once)")
		}
		if ctx.Err() != nil && o.model.shutdownTimeout > 0 && w.error() == nil {
			t := time.NewTimer(o.model.shutdownTimeout)
			select {
			case <-finished:
			case <-t.C:
			}
			t.Stop()
		}
		abort()
		<-finished
	}
	bar.stop()
	syncErr := out.Sync()

	done := stats.skipped + int(stats.written.Load())
	switch {
	case w.error() != nil:
		return fmt.Errorf("run-batch: write %s: %w (%d of %d lines answered; run the same command again to resume)", o.output, w.error(), done, stats.total)
	case syncErr != nil:
		return fmt.Errorf("run-batch: sync %s: %w", o.output, syncErr)
	case changed != nil:
		return changed
	case ctx.Err() != nil:
		return fmt.Errorf("run-batch: interrupted: %d of %d lines answered in %s; run the same command again to resume", done, stats.total, o.output)
	case readErr != nil:
		return fmt.Errorf("run-batch: read %s: %w (%d of %d lines answered; run the same command again to resume)", o.input, readErr, done, stats.total)
	}
	el := time.Since(stats.started).Seconds()
	n := stats.written.Load()
	if n == 0 && stats.skipped == stats.total {
		fmt.Fprintf(stderr, "run-batch: all %d lines of %s are already answered in %s\n", stats.total, o.input, o.output)
		return nil
	}
	fmt.Fprintf(stderr, "run-batch: %d lines answered (%d this run, %d not 200) in %.1fs: %.1f lines/s, %.0f output tokens/s; results in %s\n",
		done, n, stats.failed.Load(), el, float64(n)/max(el, 1e-9), float64(stats.tokens.Load())/max(el, 1e-9), o.output)
	return nil
}

// newBatchLogger logs on stderr in --log-format at level and above.
func newBatchLogger(format string, stderr io.Writer, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(stderr, opts))
	}
	return slog.New(slog.NewTextHandler(stderr, opts))
}

// scanLines calls fn with each non-blank line of r (1-based line numbers count every
// line), without its line ending and surrounding white space, until fn returns false.
func scanLines(r io.Reader, fn func(n int, line []byte) bool) error {
	br := bufio.NewReaderSize(r, 1<<20)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if t := bytes.TrimSpace(line); len(t) > 0 && !fn(n, t) {
			return nil
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Kinds of action for an input line.
const (
	actSkip  = iota // answered by an earlier run
	actError        // written at once as an error line
	actRun          // run through the API
)

// batchAction is what to do with one input line.
type batchAction struct {
	kind     int
	customID *string // nil for a line without a usable custom_id
	code     string  // actError
	msg      string  // actError
	url      string  // actRun
	body     []byte  // actRun
}

// resumeState is what an existing output file already answers.
type resumeState struct {
	answered  map[string]bool // custom_ids with a result (an error line counts)
	dups      map[string]int  // duplicate_custom_id lines per custom_id
	anonymous int             // error lines without a custom_id (unparsable input lines)
	lines     int
	bytes     int64 // the size of the whole lines, where this run appends
}

// batchPlanner classifies input lines in order. It is deterministic, so the counting
// pass and the run agree, and a resumed run skips exactly the lines written before.
type batchPlanner struct {
	prev      *resumeState
	seen      map[string]int // custom_id -> line of its first occurrence
	dupsSeen  map[string]int
	anonymous int
}

func newBatchPlanner(prev *resumeState) *batchPlanner {
	return &batchPlanner{prev: prev, seen: map[string]int{}, dupsSeen: map[string]int{}}
}

// classify decides what line n needs. Lines that cannot be identified (not JSON, no
// custom_id) are matched to earlier runs by their order; every other line by custom_id.
func (p *batchPlanner) classify(n int, line []byte) batchAction {
	var l struct {
		CustomID json.RawMessage `json:"custom_id"`
		Method   json.RawMessage `json:"method"`
		URL      json.RawMessage `json:"url"`
		Body     json.RawMessage `json:"body"`
	}
	anon := func(code, msg string) batchAction {
		p.anonymous++
		if p.anonymous <= p.prev.anonymous {
			return batchAction{kind: actSkip}
		}
		return batchAction{kind: actError, code: code, msg: fmt.Sprintf("line %d: %s", n, msg)}
	}
	if line[0] != '{' {
		return anon("invalid_json", "the line is not a JSON object")
	}
	if err := json.Unmarshal(line, &l); err != nil {
		return anon("invalid_json", "the line is not valid JSON: "+err.Error())
	}
	var id string
	if l.CustomID == nil || isJSONNull(l.CustomID) {
		return anon("missing_custom_id", "custom_id is required")
	}
	if json.Unmarshal(l.CustomID, &id) != nil || id == "" {
		return anon("invalid_custom_id", "custom_id must be a non-empty string")
	}
	if first, dup := p.seen[id]; dup {
		p.dupsSeen[id]++
		if p.dupsSeen[id] <= p.prev.dups[id] {
			return batchAction{kind: actSkip}
		}
		return batchAction{kind: actError, customID: &id, code: "duplicate_custom_id",
			msg: fmt.Sprintf("line %d: custom_id %q already appeared on line %d; custom_ids must be unique", n, id, first)}
	}
	p.seen[id] = n
	if p.prev.answered[id] {
		return batchAction{kind: actSkip}
	}
	var method, url string
	if json.Unmarshal(l.Method, &method) != nil || method != http.MethodPost {
		return batchAction{kind: actError, customID: &id, code: "invalid_method",
			msg: fmt.Sprintf("line %d: method must be \"POST\", got %s", n, orMissing(l.Method))}
	}
	if json.Unmarshal(l.URL, &url) != nil || !batchURLs[url] {
		return batchAction{kind: actError, customID: &id, code: "invalid_url",
			msg: fmt.Sprintf("line %d: url must be \"/v1/completions\", \"/v1/chat/completions\" or \"/v1/responses\", got %s", n, orMissing(l.URL))}
	}
	var body []byte
	if l.Body != nil && !isJSONNull(l.Body) {
		body = l.Body // the API itself answers a missing or malformed body (400)
	}
	return batchAction{kind: actRun, customID: &id, url: url, body: body}
}

func isJSONNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

// orMissing shows a raw JSON value in an error message.
func orMissing(v json.RawMessage) string {
	if v == nil {
		return "nothing"
	}
	if len(v) > 64 {
		return string(v[:64]) + "…"
	}
	return string(v)
}

// openBatchOutput opens path for appending, creating it when missing. An existing file
// is read first: a trailing partial line (a run killed mid-write) is truncated away and
// the complete lines say which input lines are already answered.
func openBatchOutput(path string) (*os.File, *resumeState, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("run-batch: %w", err)
	}
	prev := &resumeState{answered: map[string]bool{}, dups: map[string]int{}}
	br := bufio.NewReaderSize(f, 1<<20)
	var complete int64
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if err == io.EOF {
			break // line, if any, is partial
		}
		if err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("run-batch: read %s: %w", path, err)
		}
		complete += int64(len(line))
		var r struct {
			CustomID *string `json:"custom_id"`
			Error    *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if t := bytes.TrimSpace(line); len(t) == 0 {
			continue
		} else if json.Unmarshal(t, &r) != nil || (r.CustomID == nil && r.Error == nil) {
			f.Close()
			return nil, nil, fmt.Errorf("run-batch: --output %s line %d is not a run-batch result; give a new --output", path, n)
		}
		prev.lines++
		switch {
		case r.CustomID == nil:
			prev.anonymous++
		case r.Error != nil && r.Error.Code == "duplicate_custom_id":
			prev.dups[*r.CustomID]++
		default:
			prev.answered[*r.CustomID] = true
		}
	}
	if err := f.Truncate(complete); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("run-batch: %w", err)
	}
	prev.bytes = complete
	return f, prev, nil
}

// lineWriter appends whole lines to the output: one Write per line under a mutex, so
// lines never interleave and a kill leaves at most a partial last line (which a resumed
// run truncates away). The file is not buffered: a line is in the kernel once written.
// A write that fails (a full disk: part of the line written, then ENOSPC) stops the run
// and cuts the file back to its last whole line, so that the output holds only whole
// lines and a rerun resumes right after them.
type lineWriter struct {
	mu      sync.Mutex
	f       *os.File
	out     io.Writer // f, or a test's wrapper of it
	size    int64     // bytes of whole lines in f
	err     error
	n       int
	fail    func()
	onWrite func(int)
	stats   *batchStats
}

// write appends line (which ends in "\n") and counts it.
func (w *lineWriter) write(line []byte, ok bool, tokens int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return
	}
	if n, err := w.out.Write(line); err != nil || n != len(line) {
		var pe *fs.PathError
		switch {
		case err == nil:
			err = io.ErrShortWrite
		case errors.As(err, &pe):
			err = pe.Err // the error names the file already
		}
		if terr := w.f.Truncate(w.size); terr != nil {
			err = fmt.Errorf("%w; cutting the partial line failed too (a rerun cuts it): %w", err, terr)
		}
		w.err = err
		if w.fail != nil {
			w.fail()
		}
		return
	}
	w.size += int64(len(line))
	w.n++
	if w.stats != nil {
		w.stats.written.Add(1)
		if !ok {
			w.stats.failed.Add(1)
		}
		w.stats.tokens.Add(int64(tokens))
	}
	if w.onWrite != nil {
		w.onWrite(w.n)
	}
}

func (w *lineWriter) error() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// batchRun runs lines through the API's handler.
type batchRun struct {
	handler http.Handler
	w       *lineWriter
	stats   *batchStats
}

// run answers one line and writes its result. A line whose ctx ends before its response
// is complete is not written (a resumed run answers it).
func (b *batchRun) run(ctx context.Context, act batchAction) {
	if stream, ok := streamRequested(act.body); ok && stream {
		body := []byte(`{"error":{"message":"stream is not supported in a batch: batch responses are not streamed; leave stream out or set it to false","type":"invalid_request_error","param":"stream","code":"invalid_value"}}`)
		b.w.write(resultLine(*act.customID, http.StatusBadRequest, newHexID("req-"), body), false, 0)
		return
	}
	backoff := 20 * time.Millisecond
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, act.url, bytes.NewReader(act.body))
		if err != nil { // the url was checked: cannot happen
			panic(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.RemoteAddr = "127.0.0.1:0"
		rec := &recorder{header: http.Header{}}
		b.handler.ServeHTTP(rec, req)
		if ctx.Err() != nil && (rec.status != http.StatusOK || rec.body.Len() == 0) {
			return // aborted: not answered
		}
		if rec.status == http.StatusTooManyRequests { // the engine's queue is full: wait for room
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		body := bytes.TrimSpace(rec.body.Bytes())
		if !json.Valid(body) {
			b.w.write(errorResultLine(act.customID, "invalid_response", fmt.Sprintf("the API answered %d with a body that is not JSON", rec.status)), false, 0)
			return
		}
		if bytes.ContainsAny(body, "\r\n") {
			var c bytes.Buffer
			_ = json.Compact(&c, body)
			body = c.Bytes()
		}
		tokens := 0
		if rec.status == http.StatusOK {
			var u struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
					OutputTokens     int `json:"output_tokens"` // /v1/responses
				} `json:"usage"`
			}
			if json.Unmarshal(body, &u) == nil {
				tokens = u.Usage.CompletionTokens + u.Usage.OutputTokens
			}
		}
		b.w.write(resultLine(*act.customID, rec.status, rec.header.Get("X-Request-Id"), body), rec.status == http.StatusOK, tokens)
		return
	}
}

// streamRequested reports the body's "stream" member when it is a boolean.
func streamRequested(body []byte) (stream, ok bool) {
	var m struct {
		Stream *bool `json:"stream"`
	}
	if len(body) == 0 || body[0] != '{' || json.Unmarshal(body, &m) != nil || m.Stream == nil {
		return false, false
	}
	return *m.Stream, true
}

// resultLine is the output line of an answered request: body is the API's JSON response.
func resultLine(customID string, status int, requestID string, body []byte) []byte {
	var b bytes.Buffer
	b.Grow(len(body) + 160)
	b.WriteString(`{"id":`)
	b.Write(jsonString(newHexID("batch_req_")))
	b.WriteString(`,"custom_id":`)
	b.Write(jsonString(customID))
	fmt.Fprintf(&b, `,"response":{"status_code":%d,"request_id":`, status)
	b.Write(jsonString(requestID))
	b.WriteString(`,"body":`)
	b.Write(body)
	b.WriteString("},\"error\":null}\n")
	return b.Bytes()
}

// errorResultLine is the output line of a line that could not be run.
func errorResultLine(customID *string, code, msg string) []byte {
	type errObj struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	line, _ := json.Marshal(struct {
		ID       string  `json:"id"`
		CustomID *string `json:"custom_id"`
		Response any     `json:"response"`
		Error    errObj  `json:"error"`
	}{newHexID("batch_req_"), customID, nil, errObj{code, msg}})
	return append(line, '\n')
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

// newHexID returns prefix and 24 random hex digits.
func newHexID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// recorder is the http.ResponseWriter the API writes a line's response into.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}

// progressBar redraws one status line on stderr a few times a second.
type progressBar struct {
	w     io.Writer
	stats *batchStats
	stopc chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	msg   string
}

func startProgressBar(w io.Writer, stats *batchStats) *progressBar {
	p := &progressBar{w: w, stats: stats, stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.draw(false)
			case <-p.stopc:
				p.draw(true)
				return
			}
		}
	}()
	return p
}

// note replaces the rate part of the line with msg.
func (p *progressBar) note(msg string) {
	p.mu.Lock()
	p.msg = msg
	p.mu.Unlock()
}

// stop draws the final state and ends the line. A nil bar does nothing.
func (p *progressBar) stop() {
	if p == nil {
		return
	}
	close(p.stopc)
	<-p.done
}

func (p *progressBar) draw(final bool) {
	s := p.stats
	if s.started.IsZero() {
		return
	}
	p.mu.Lock()
	msg := p.msg
	p.mu.Unlock()
	line := formatProgress(s.skipped+int(s.written.Load()), s.total, int(s.written.Load()), int(s.tokens.Load()),
		int(s.failed.Load()), int(s.inflight.Load()), time.Since(s.started), 30)
	if msg != "" && final {
		msg = "interrupted"
	}
	if msg != "" {
		line += "  " + msg
	}
	end := ""
	if final {
		end = "\n"
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s%s", line, end)
}

// formatProgress renders the bar: done of total lines, this run's line and output-token
// rates, and the time left at the current line rate.
func formatProgress(done, total, ran, tokens, failed, inflight int, elapsed time.Duration, width int) string {
	frac := 1.0
	if total > 0 {
		frac = float64(done) / float64(total)
	}
	fill := int(frac * float64(width))
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	secs := elapsed.Seconds()
	rate, tps := 0.0, 0.0
	if secs > 0 {
		rate, tps = float64(ran)/secs, float64(tokens)/secs
	}
	eta := "--:--"
	if rate > 0 {
		eta = formatClock(time.Duration(float64(total-done) / rate * float64(time.Second)))
	}
	s := fmt.Sprintf("[%s] %d/%d lines  %.1f lines/s  %.0f tok/s  ETA %s  (%d running", bar, done, total, rate, tps, eta, inflight)
	if failed > 0 {
		s += fmt.Sprintf(", %d not 200", failed)
	}
	return s + ")"
}

// formatClock prints d as m:ss or h:mm:ss.
func formatClock(d time.Duration) string {
	t := int(d.Round(time.Second).Seconds())
	if t >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", t/3600, t/60%60, t%60)
	}
	return fmt.Sprintf("%d:%02d", t/60, t%60)
}
