package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/bench"
	"github.com/conveyor-llm/conveyor/models"
)

// TestBenchSoakTinyModel runs `conveyor bench soak --url` for a few seconds against the
// whole serve command on the tiny model: every kind runs, no outcome is unexpected, the
// replies of the json_schema and tool_call kinds validate at least once each, the KV
// cache is empty once the server is idle, and the JSON report is written.
func TestBenchSoakTinyModel(t *testing.T) {
	lib := testORTLib(t)
	dir := tinyModelDir(t)
	o, err := parseServeFlags([]string{"--model", dir, "--port", "0", "--ort-lib", lib, "--threads", "1",
		"--kv-cache-memory", "8MiB", "--served-model-name", "tiny", "--max-num-seqs", "8", "--max-num-batched-tokens", "256"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, o, io.Discard, io.Discard, ready) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("serve returned early: %v", err)
	}
	out := filepath.Join(t.TempDir(), "soak.json")
	var stdout bytes.Buffer
	err = runBenchSoak([]string{"--url", "http://" + addr, "--duration", "8s", "--clients", "4", "--seed", "3",
		"--report-every", "3s", "--max-tokens", "96", "--idle-pause", "300ms", "--out", out}, &stdout)
	t.Logf("soak output:\n%s", stdout.String())
	if err != nil {
		t.Fatalf("soak: %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.SoakReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Unexpected != 0 || rep.IdleKVUsed != 0 || rep.IdleErr != "" {
		t.Fatalf("unexpected %d, idle kv %d (%s): %v", rep.Unexpected, rep.IdleKVUsed, rep.IdleErr, rep.Problems)
	}
	kinds, _ := bench.ParseSoakKinds("all")
	for _, k := range kinds {
		n := 0
		for _, c := range rep.Outcomes[string(k)] {
			n += c
		}
		if n == 0 {
			t.Errorf("kind %s never ran: %v", k, rep.Outcomes)
		}
	}
	for _, k := range []string{"json_schema", "tool_call"} {
		if rep.Outcomes[k]["ok"] == 0 {
			t.Errorf("no %s reply ran to its end and validated: %v", k, rep.Outcomes[k])
		}
	}
	if rep.Outcomes["drop"]["dropped"] == 0 {
		t.Errorf("no stream was dropped: %v", rep.Outcomes["drop"])
	}
	if len(rep.Windows) < 2 || rep.RSS.Max <= 0 {
		t.Errorf("%d windows, rss %+v: want periodic lines with the RSS", len(rep.Windows), rep.RSS)
	}
	if !strings.Contains(stdout.String(), "soak PASS") || !strings.Contains(stdout.String(), "kv blocks") {
		t.Errorf("summary missing from the output")
	}
}

func TestBenchSoakFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{},                                       // neither --url nor --model
		{"--url", "http://x", "--model", "dir"},  // both
		{"--url", "http://x", "--kinds", "nope"}, // unknown kind
		{"--url", "http://x", "--clients", "0"},
	} {
		if err := runBenchSoak(args, io.Discard); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("bench soak %q: %v, want a one-line error", args, err)
		}
	}
}

// TestBenchSoakInterrupted: Ctrl-C during a soak on a server it started says INTERRUPTED
// and "interrupted", not FAIL and "unexpected outcomes"; the server it started did not
// see the bench's CONVEYOR_* settings and got the ONNX Runtime library as a flag, before
// --server-flags.
func TestBenchSoakInterrupted(t *testing.T) {
	record := fakeServeExe(t, "interrupt")
	lib := os.Getenv(models.ORTLibEnv)
	t.Setenv("CONVEYOR_API_KEY", "sk-server-key")
	var stdout bytes.Buffer
	err := runBenchSoak([]string{"--model", t.TempDir(), "--server-flags", "--threads 1", "--served-model", "m",
		"--max-model-len", "64", "--duration", "1m", "--clients", "1"}, &stdout)
	t.Logf("soak output:\n%s", stdout.String())
	if err == nil || !strings.HasPrefix(err.Error(), "bench soak: interrupted after ") ||
		!strings.HasSuffix(err.Error(), " of 1m0s (0 requests, none unexpected); the idle KV check did not run") {
		t.Errorf("soak: %v; want an error saying it was interrupted", err)
	}
	if !strings.Contains(stdout.String(), "\nsoak INTERRUPTED: ") || strings.Contains(stdout.String(), "soak FAIL") {
		t.Errorf("the summary does not say INTERRUPTED:\n%s", stdout.String())
	}
	rec := readServeRecord(t, record)
	for _, kv := range rec.Env {
		if strings.HasPrefix(kv, "CONVEYOR_") {
			t.Errorf("the started server's environment has %s", kv)
		}
	}
	// (--cuda-provider, from $CONVEYOR_ORT_CUDA_PROVIDER when set, may come between them.)
	args := strings.Join(rec.Args, " ")
	if i, j := strings.Index(args, "--ort-lib "+lib+" "), strings.Index(args, "--threads 1"); i < 0 || j < i || !strings.Contains(args, "--model ") {
		t.Errorf("server args %q, want --ort-lib %s before --server-flags", args, lib)
	}
}
