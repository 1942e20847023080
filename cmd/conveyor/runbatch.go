package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/conveyor-llm/conveyor/api"
	"github.com/conveyor-llm/conveyor/api/responses"
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
	// Both must be regular files: the input is read twice (counted, then run) and the
	// output is read back to resume. Checked before opening, which blocks on a FIFO.
	if st, err := os.Stat(o.input); err == nil && st.IsDir() {
		return fmt.Errorf("run-batch: --input %s is a directory", o.input)
	} else if err == nil && !st.Mode().IsRegular() {
		return fmt.Errorf("run-batch: --input %s is not a regular file (run-batch reads its input twice); save it to a file first", o.input)
	}
	if st, err := os.Stat(o.output); err == nil && st.IsDir() {
		return fmt.Errorf("run-batch: --output %s is a directory", o.output)
	} else if err == nil && !st.Mode().IsRegular() {
		return fmt.Errorf("run-batch: --output %s is not a regular file (run-batch appends to its output and resumes from it); give a file path", o.output)
	}
	in, err := os.Open(o.input)
	if err != nil {
		return fmt.Errorf("run-batch: %w", err)
	}
	defer in.Close()
	if st, err := in.Stat(); err != nil {
		return fmt.Errorf("run-batch: %w", err)
	} else if ost, err := os.Stat(o.output); err == nil && os.SameFile(st, ost) {
		return errors.New("run-batch: --input and --output are the same file")
	}
	// The output is only read now: it changes once the model has loaded (begin below), so
	// that a run that fails to start leaves it as it was.
	bo, err := openBatchOutput(o.output)
	if err != nil {
		return err
	}
	defer bo.Close()
	prev := bo.prev

	// A first pass counts the lines and what they need, so that the bar knows the
	// total and a batch with nothing left to run does not load the model.
	pl := newBatchPlanner(prev)
	var toRun int
	stats := &batchStats{}
	var binary error
	if err := scanLines(in, func(n int, line []byte) bool {
		if bytes.IndexByte(line, 0) >= 0 {
			binary = fmt.Errorf("run-batch: --input %s line %d holds a NUL byte: it is not a JSONL file", o.input, n)
			return false
		}
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
	} else if binary != nil {
		return binary
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
		acfg.Responses = responses.Config{Unavailable: "run-batch keeps no responses", NoStoreByDefault: true}
		ecfg, err := o.model.engineConfig(nil)
		if err != nil {
			return err
		}
		ecfg.Logger = srvLog
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

	out, err := bo.begin()
	if err != nil {
		return err
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
	if stats.total == 0 {
		fmt.Fprintf(stderr, "run-batch: %s has no lines; nothing to run\n", o.input)
		return nil
	}
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
