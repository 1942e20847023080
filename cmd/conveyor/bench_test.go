package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/bench"
)

func TestParseRates(t *testing.T) {
	inf := math.Inf(1)
	for _, tc := range []struct {
		in   string
		want []float64
		err  string
	}{
		{in: "0.5,1, 2", want: []float64{0.5, 1, 2}},
		{in: "1,inf", want: []float64{1, inf}},
		{in: "1,,2", err: `--rates "1,,2": item 2 is empty`},
		{in: "", err: `--rates "": item 1 is empty`},
		{in: "1,", err: `--rates "1,": item 2 is empty`},
		{in: "1,x", err: `--rates "1,x": item "x": want a positive number`},
		{in: "0", err: `--rates "0": item "0": want a positive number`},
	} {
		got, err := parseRates(tc.in)
		if tc.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("parseRates(%q) = %v, %v; want an error starting %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("parseRates(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("parseRates(%q) = %v; want %v", tc.in, got, tc.want)
			}
		}
	}
	if _, err := parseRate(""); err == nil {
		t.Error(`parseRate("") is not an error`)
	}
}

func TestCheckBurstiness(t *testing.T) {
	for b, ok := range map[float64]bool{1: true, 0.25: true, 4: true, 0: false, -1: false, math.NaN(): false, math.Inf(1): false} {
		if err := checkBurstiness(b); (err == nil) != ok {
			t.Errorf("checkBurstiness(%v) = %v, want ok %v", b, err, ok)
		}
	}
}

func TestNoneCompleted(t *testing.T) {
	results := []bench.Result{{Err: "HTTP 404: the model \"nope\" does not exist"}, {Err: "HTTP 503: overloaded"}}
	err := noneCompleted(bench.Summarise(results, time.Second, bench.SLO{}), results)
	if err == nil || !strings.Contains(err.Error(), "no request completed (2 failed)") || !strings.Contains(err.Error(), `HTTP 404: the model "nope"`) {
		t.Errorf("every request failed: %v, want an error naming the first failure", err)
	}
	results[1] = bench.Result{OutputTokens: 3, E2E: time.Millisecond}
	if err := noneCompleted(bench.Summarise(results, time.Second, bench.SLO{}), results); err != nil {
		t.Errorf("one completed: %v, want nil", err)
	}
}

// TestBenchFailsWhenNoneCompleted runs `conveyor bench` against a server that refuses
// every request: the report is printed and the command fails with the server's reason.
func TestBenchFailsWhenNoneCompleted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error": {"message": "the model \"nope\" does not exist"}}`)
	}))
	defer srv.Close()
	stdout := os.Stdout
	os.Stdout, _ = os.Open(os.DevNull) // runBench prints its report there
	defer func() { os.Stdout = stdout }()
	err := runBench([]string{"--base-url", srv.URL, "--model", "nope", "--num-requests", "3", "--no-progress", "--dataset", "fixed",
		"--input-len", "4", "--output-len", "4"})
	if err == nil || !strings.Contains(err.Error(), `no request completed (3 failed); the first failed with: HTTP 404: the model "nope" does not exist`) {
		t.Errorf("bench, every request refused: %v", err)
	}
}

// TestBenchFlagErrorsAreOneLine: a mistyped flag, a bad value or a stray argument of
// bench, bench compare and bench soak is one "conveyor: bench ...: " line with no usage
// dump, and is found before anything runs or any output is written.
func TestBenchFlagErrorsAreOneLine(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	model := t.TempDir() // no server is started: every case fails first
	// Should one start after all, it fails at once: this test binary would run these tests again.
	saved := serveExecutable
	serveExecutable = func() (string, error) { return filepath.Join(model, "no-conveyor"), nil }
	defer func() { serveExecutable = saved }()
	checkOneLineErrors(t, []oneLineError{
		{[]string{"bench", "--bogus"}, "conveyor: bench: flag provided but not defined: -bogus\n"},
		{[]string{"bench", "--num-requests", "abc"}, `conveyor: bench: invalid value "abc" for flag -num-requests`},
		{[]string{"bench", "extra"}, `conveyor: bench: unexpected argument "extra"`},
		{[]string{"bench", "--request-rate", ""}, `conveyor: bench: --request-rate "": want a positive number`},
		{[]string{"bench", "--burstiness", "0"}, "conveyor: bench: --burstiness 0: must be a positive number"},
		{[]string{"bench", "compare", "--bogus"}, "conveyor: bench compare: flag provided but not defined: -bogus\n"},
		{[]string{"bench", "compare", "extra", "--model", model, "--out", out}, `conveyor: bench compare: unexpected argument "extra"`},
		{[]string{"bench", "compare", "--model", model, "--out", out, "--rates", "1,,2"}, `conveyor: bench compare: --rates "1,,2": item 2 is empty`},
		{[]string{"bench", "compare", "--model", model, "--out", out, "--burstiness", "0"}, "conveyor: bench compare: --burstiness 0: must be"},
		{[]string{"bench", "compare", "--model", model, "--out", file}, "conveyor: bench compare: --out: mkdir " + file + ": not a directory\n"},
		{[]string{"bench", "soak", "--bogus"}, "conveyor: bench soak: flag provided but not defined: -bogus\n"},
		{[]string{"bench", "soak", "--url", "http://127.0.0.1:1", "extra"}, `conveyor: bench soak: unexpected argument "extra"`},
		{[]string{"bench", "soak", "--url", "http://127.0.0.1:1", "--out", filepath.Join(dir, "missing", "x.json")}, "conveyor: bench soak: --out: open "},
		{[]string{"bench", "soak", "--url", "http://127.0.0.1:1", "--out", dir}, "conveyor: bench soak: --out: open " + dir + ": is a directory\n"},
		{[]string{"bench", "--max-concurrency", "-1", "--base-url", "http://127.0.0.1:1"}, "conveyor: bench: --max-concurrency -1: must be >= 0 (0 = no cap)\n"},
		{[]string{"bench", "compare", "--model", model, "--out", out, "--server-log", dir}, "conveyor: bench compare: --server-log: open " + dir + ": is a directory\n"},
		{[]string{"bench", "soak", "--model", model, "--server-log", dir}, "conveyor: bench soak: --server-log: open " + dir + ": is a directory\n"},
		{[]string{"bench", "soak", "--model", model, "--server-flags", "--threads 2 --port 8405"}, "conveyor: bench soak: --server-flags: --port is not allowed: the started server listens on a free loopback port"},
		{[]string{"bench", "soak", "--model", model, "--server-flags", "-host=0.0.0.0"}, "conveyor: bench soak: --server-flags: --host is not allowed"},
	})
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused bench compare created --out: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("a refused command left files in %s: %v", dir, entries)
	}
}

// benchHelp runs `conveyor args...` (a -h) and returns the help it printed on stderr.
func benchHelp(t *testing.T, args []string) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	var stdout, errOut bytes.Buffer
	code := runMain(args, &stdout, &errOut)
	os.Stderr = saved
	w.Close()
	help, _ := io.ReadAll(r)
	r.Close()
	if code != 0 || errOut.Len() != 0 {
		t.Errorf("%v: exit %d, %q", args, code, errOut.String())
	}
	return string(help)
}

// TestBenchHelpHidesAPIKey: with $OPENAI_API_KEY set, -h of bench and bench soak says
// that --api-key defaults to it without printing the key; bench compare has no such flag
// and does not print it either.
func TestBenchHelpHidesAPIKey(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-secret123")
	for _, args := range [][]string{{"bench", "-h"}, {"bench", "soak", "--help"}, {"bench", "compare", "-h"}, {"help", "bench"}} {
		help := benchHelp(t, args)
		if strings.Contains(help, "sk-secret123") {
			t.Errorf("%v prints the key:\n%s", args, help)
		}
		if args[len(args)-1] != "compare" && args[1] != "compare" && !strings.Contains(help, "Bearer key (default $OPENAI_API_KEY)") {
			t.Errorf("%v does not say --api-key defaults to $OPENAI_API_KEY:\n%s", args, help)
		}
	}
}

// TestBenchAPIKey: bench sends $OPENAI_API_KEY unless --api-key is given, even empty.
func TestBenchAPIKey(t *testing.T) {
	var got []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			mu.Lock()
			got = append(got, r.Header.Get("Authorization"))
			mu.Unlock()
		}
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer srv.Close()
	stdout := os.Stdout
	os.Stdout, _ = os.Open(os.DevNull)
	defer func() { os.Stdout = stdout }()
	t.Setenv("OPENAI_API_KEY", "sk-secret123")
	for _, tc := range []struct {
		flags []string
		want  string
	}{{nil, "Bearer sk-secret123"}, {[]string{"--api-key", "other"}, "Bearer other"}, {[]string{"--api-key", ""}, ""}} {
		got = nil
		args := append([]string{"--base-url", srv.URL, "--model", "m", "--num-requests", "1", "--no-progress", "--dataset", "fixed",
			"--input-len", "4", "--output-len", "4"}, tc.flags...)
		if err := runBench(args); err == nil {
			t.Errorf("%q: every request refused, and no error", tc.flags)
		}
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("%q: sent Authorization %q, want %q", tc.flags, got, tc.want)
		}
	}
}

// TestBenchInterrupted: Ctrl-C during a run ends it: the report says it was interrupted
// and does not count the requests that were never sent as failed, and the command fails
// saying so. The server sends the signal when the first request arrives and holds it,
// so with --max-concurrency 1 that one is cut off in flight and the other four never go.
func TestBenchInterrupted(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		var once sync.Once
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/completions" {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			io.Copy(io.Discard, r.Body) // then a client that leaves ends r.Context()
			once.Do(func() { syscall.Kill(os.Getpid(), syscall.SIGINT) })
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
		}))
		defer srv.Close()
		f, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
		if err != nil {
			t.Fatal(err)
		}
		stdout := os.Stdout
		os.Stdout = f
		args := []string{"bench", "--base-url", srv.URL, "--model", "m", "--num-requests", "5", "--max-concurrency", "1", "--no-progress",
			"--dataset", "fixed", "--input-len", "4", "--output-len", "4"}
		if asJSON {
			args = append(args, "--json")
		}
		var o, e bytes.Buffer
		code := runMain(args, &o, &e)
		os.Stdout = stdout
		f.Close()
		report, _ := os.ReadFile(f.Name())
		want := "conveyor: bench: interrupted: 1 of 5 requests sent (0 completed, 1 failed), 4 not sent\n"
		if code != 1 || e.String() != want {
			t.Errorf("json %v: exit %d, stderr %q; want 1, %q", asJSON, code, e.String(), want)
		}
		if strings.Contains(string(report), "x not sent") {
			t.Errorf("json %v: the report counts unsent requests as failed:\n%s", asJSON, report)
		}
		if asJSON {
			var rep struct {
				Failed      int  `json:"failed"`
				Interrupted bool `json:"interrupted"`
				NotSent     int  `json:"not_sent"`
			}
			if err := json.Unmarshal(report, &rep); err != nil || !rep.Interrupted || rep.NotSent != 4 || rep.Failed != 1 {
				t.Errorf("json report %+v (%v), want interrupted, 4 not sent, 1 failed:\n%s", rep, err, report)
			}
		} else if !strings.HasPrefix(string(report), "Interrupted: 4 of 5 requests were not sent; they are not counted below.\n") ||
			!strings.Contains(string(report), fmt.Sprintf("%-34s %d\n", "Failed requests:", 1)) {
			t.Errorf("report does not say it was interrupted, or counts 4 unsent requests as failed:\n%s", report)
		}
	}
}

// TestBenchHelpHasUsageLine: -h of each bench command starts with its usage line, not
// the flag package's "Usage of ...", and is not an error.
func TestBenchHelpHasUsageLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "-h"}, "usage: conveyor bench [flags]\n"},
		{[]string{"bench", "compare", "-h"}, "usage: conveyor bench compare [flags]\n"},
		{[]string{"bench", "soak", "-h"}, "usage: conveyor bench soak --url URL [flags]\n"},
	} {
		help := benchHelp(t, tc.args)
		if !strings.HasPrefix(help, tc.want) || !strings.Contains(string(help), "\n  -") {
			t.Errorf("%v: help starts %.80q, want %q and the flags", tc.args, help, tc.want)
		}
	}
}

// TestStartServeProcessSaysWhy: a server that exits at start-up is an error that ends
// with its own error line, not just its exit status.
func TestStartServeProcessSaysWhy(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "fake-conveyor")
	script := "#!/bin/sh\necho 'time=now level=INFO msg=\"loading model\"' >&2\n" +
		"echo 'conveyor: serve: invalid value \"garbage\" for flag -kv-cache-memory' >&2\n\nexit 1\n"
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := startServeProcess(context.Background(), exe, []string{"--kv-cache-memory", "garbage"}, io.Discard, time.Minute)
	want := `conveyor serve exited early (exit status 1): conveyor: serve: invalid value "garbage" for flag -kv-cache-memory`
	if err == nil || err.Error() != want {
		t.Errorf("err %v, want %q", err, want)
	}
}

func TestStderrTail(t *testing.T) {
	for _, tc := range []struct {
		writes []string
		want   string
	}{
		{nil, ""},
		{[]string{"\n\n"}, ""},
		{[]string{"level=INFO a\nconv", "eyor: serve: bad\n\n"}, ": conveyor: serve: bad"},
		{[]string{"one\ntwo\nthree\n"}, ": two | three"},
		{[]string{strings.Repeat("x", 5000) + "END\n"}, ": …" + strings.Repeat("x", stderrSaidBytes-3) + "END"},
	} {
		var tail stderrTail
		for _, w := range tc.writes {
			tail.Write([]byte(w))
		}
		if got := tail.said(); got != tc.want {
			t.Errorf("writes %.40q: said %.60q, want %.60q", tc.writes, got, tc.want)
		}
	}
}
