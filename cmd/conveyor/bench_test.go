package main

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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
	})
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused bench compare created --out: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("a refused command left files in %s: %v", dir, entries)
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
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		saved := os.Stderr
		os.Stderr = w
		var stdout, errOut bytes.Buffer
		code := runMain(tc.args, &stdout, &errOut)
		os.Stderr = saved
		w.Close()
		help, _ := io.ReadAll(r)
		r.Close()
		if code != 0 || errOut.Len() != 0 {
			t.Errorf("%v: exit %d, %q", tc.args, code, errOut.String())
		}
		if !strings.HasPrefix(string(help), tc.want) || !strings.Contains(string(help), "\n  -") {
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
