package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/conveyor-llm/conveyor/bench"
)

// errSoakFailed is returned when the soak ran and found unexpected outcomes.
var errSoakFailed = errors.New("bench soak: unexpected outcomes (see the summary)")

// runBenchSoak drives a server (--url, or one it starts on --model) with a seeded mix of
// request kinds for --duration and checks every reply.
func runBenchSoak(args []string, stdout io.Writer) error {
	d := bench.DefaultSoakConfig()
	fs := flag.NewFlagSet("bench soak", flag.ContinueOnError)
	url := fs.String("url", "", "attach to the server at this address (e.g. http://127.0.0.1:8000); without it, --model starts one")
	model := fs.String("model", "", "model directory a started server serves (without --url)")
	serverArgs := fs.String("server-flags", "", "extra flags of the started server, space-separated (e.g. \"--kv-cache-memory 3GiB --threads 2\"); not --host or --port: it listens on a free loopback port")
	logPath := fs.String("server-log", "", "file to append the started server's log to (default: discard)")
	name := fs.String("served-model", "", "model name sent in requests (default: the server's first model)")
	key := apiKeyFlag(fs)
	dur := fs.Duration("duration", d.Duration, "how long to send load")
	clients := fs.Int("clients", d.Clients, "concurrent clients (a closed loop: each sends its next request when the last ends)")
	seed := fs.Uint64("seed", d.Seed, "seed of the request mix")
	kinds := fs.String("kinds", "all", "request kinds (comma-separated): completion, completion_stream, chat, chat_stream, chat_n, drop, json_schema, tool_call, malformed, over_context; \"all\" is those; \"storm\" the largest requests (max_body, max_n), outside the default mix")
	every := fs.Duration("report-every", 10*time.Minute, "period of the progress line")
	maxTokens := fs.Int("max-tokens", d.MaxTokens, "max_tokens at most per request (json_schema, tool_call and drop use it as is)")
	maxLen := fs.Int("max-model-len", 0, "context length the over_context kind exceeds, in tokens (default: max_model_len from /v1/models)")
	reqTimeout := fs.Duration("request-timeout", d.RequestTimeout, "a request without its reply after this long is unexpected")
	idlePause := fs.Duration("idle-pause", d.IdlePause, "after the load: how long the server must stay idle before the KV cache is read")
	out := fs.String("out", "", "also write the report as JSON to this file")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: conveyor bench soak --url URL [flags]\n       conveyor bench soak --model DIR [flags]\n\nflags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if (*url == "") == (*model == "") {
		return errors.New("bench soak: pass --url to attach to a server or --model to start one (one of them)")
	}
	extra := strings.Fields(*serverArgs)
	if err := checkSoakServerFlags(extra); err != nil {
		return err
	}
	ks, err := bench.ParseSoakKinds(*kinds)
	if err != nil {
		return fmt.Errorf("bench soak: --kinds: %w", err)
	}
	cfg := d
	cfg.Target = bench.Target{BaseURL: *url, Model: *name, APIKey: key()}
	cfg.Duration, cfg.Clients, cfg.Seed, cfg.Kinds = *dur, *clients, *seed, ks
	cfg.ReportEvery, cfg.MaxTokens, cfg.MaxModelLen = *every, *maxTokens, *maxLen
	cfg.RequestTimeout, cfg.IdlePause, cfg.Log = *reqTimeout, *idlePause, stdout
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("bench %v", err)
	}
	if *out != "" {
		if err := checkOutFile(*out); err != nil {
			return fmt.Errorf("bench soak: --out: %w", err)
		}
	}
	// The first Ctrl-C (or SIGTERM) ends the load and the soak reports what ran; a second
	// one quits at once (notifyContext hands the signal back).
	ctx, stop := notifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *model != "" {
		logw, closeLog, err := openServerLog(*logPath)
		if err != nil {
			return fmt.Errorf("bench soak: %w", err)
		}
		defer closeLog()
		exe, err := serveExecutable()
		if err != nil {
			return err
		}
		// The server starts in serveEnv's environment, without this process's CONVEYOR_*
		// settings; the flags that locate ONNX Runtime come before --server-flags, which win.
		flags := append(append([]string{"--model", *model}, serveEnvFlags(os.Getenv)...), extra...)
		srv, err := startServeProcess(ctx, exe, flags, logw, 5*time.Minute) // a real-size model takes a while to load
		if err != nil {
			if ctx.Err() != nil {
				return errors.New("bench soak: interrupted while the server started")
			}
			return fmt.Errorf("bench soak: %w", err)
		}
		defer srv.stop()
		fmt.Fprintf(stdout, "started conveyor serve (pid %d) at %s\n", srv.pid, srv.base) // not its flags: --server-flags may hold an --api-key
		cfg.Target.BaseURL = srv.base
		cfg.RSS = func() (int64, error) { return procRSS(srv.pid) }
	}
	rep, err := bench.Soak(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return errors.New("bench soak: interrupted before the load started")
		}
		return fmt.Errorf("bench soak: %w", err)
	}
	interrupted := ctx.Err() != nil
	formatSoakReport(stdout, rep, interrupted)
	if *out != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("bench soak: --out: %w", err)
		}
	}
	switch {
	case interrupted && rep.Unexpected > 0:
		return fmt.Errorf("bench soak: interrupted after %v, with %d unexpected outcomes before it (see the summary)", rep.Duration, rep.Unexpected)
	case interrupted:
		// As run-batch: an interrupted run is an error (exit 1), not a pass.
		return fmt.Errorf("bench soak: interrupted after %v of %v (%d requests, none unexpected); the idle KV check did not run", rep.Duration, cfg.Duration, rep.Requests)
	case rep.Failed():
		return errSoakFailed
	}
	return nil
}

// formatSoakReport writes rep's summary. An interrupted soak's says INTERRUPTED where
// SoakReport.Format says FAIL: the idle KV check it skipped fails it, and the cause is
// the interrupt, not the server.
func formatSoakReport(w io.Writer, rep *bench.SoakReport, interrupted bool) {
	var b bytes.Buffer
	rep.Format(&b)
	s := b.String()
	if interrupted {
		s = strings.Replace(s, "soak FAIL: ", "soak INTERRUPTED: ", 1)
	}
	io.WriteString(w, s)
}

// checkSoakServerFlags refuses --host and --port in --server-flags: bench soak starts the
// server on a free loopback port and waits for it there, and a later --port would win.
func checkSoakServerFlags(flags []string) error {
	for _, f := range flags {
		name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
		if strings.HasPrefix(f, "-") && (name == "host" || name == "port") {
			return fmt.Errorf("bench soak: --server-flags: --%s is not allowed: the started server listens on a free loopback port (attach to a server of your own with --url)", name)
		}
	}
	return nil
}

// procRSS reads VmRSS of process pid from /proc/<pid>/status, in bytes.
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
