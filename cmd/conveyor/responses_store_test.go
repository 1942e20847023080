package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/api/respstore"
)

func TestParseRetention(t *testing.T) {
	for in, want := range map[string]struct {
		age time.Duration
		n   int
	}{"720h,10000": {720 * time.Hour, 10000}, "30d": {30 * 24 * time.Hour, 0}, "5000": {0, 5000}, "0": {0, 0}, "90m, 3": {90 * time.Minute, 3}} {
		age, n, err := parseRetention(in)
		if err != nil || age != want.age || n != want.n {
			t.Errorf("parseRetention(%q) = %v, %d, %v", in, age, n, err)
		}
	}
	for _, in := range []string{"", "x", "-1", "1h,2h", "3,4", "-5m", "xd"} {
		if _, _, err := parseRetention(in); err == nil {
			t.Errorf("parseRetention(%q) should fail", in)
		}
	}
}

func TestDefaultDataDir(t *testing.T) {
	if d := defaultDataDir(env(map[string]string{"XDG_STATE_HOME": "/s", "HOME": "/h"})); d != "/s/conveyor" {
		t.Errorf("with XDG_STATE_HOME: %q", d)
	}
	if d := defaultDataDir(env(map[string]string{"HOME": "/h"})); d != "/h/.local/state/conveyor" {
		t.Errorf("with HOME: %q", d)
	}
	if d := defaultDataDir(env(nil)); d != "" {
		t.Errorf("with neither: %q", d)
	}
	o, err := parseServeFlags([]string{"--model", "m"}, env(map[string]string{"HOME": "/h"}), io.Discard)
	if err != nil || o.dataDir != "/h/.local/state/conveyor" {
		t.Errorf("--data-dir default: %q, %v", o.dataDir, err)
	}
}

func TestOpenResponseStore(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	o := &serveOptions{cmd: "serve", dataDir: dir, responsesRetention: "1h,5"}
	rc, closeStore, err := o.openResponseStore(log, env(nil))
	st, ok := rc.Store.(*respstore.Store)
	if err != nil || !ok || st.Path() != filepath.Join(dir, "responses.db") {
		t.Fatalf("open: %+v, %v", rc, err)
	}
	// A second server on the same directory runs without a store and says why.
	rc2, close2, err := o.openResponseStore(log, env(nil))
	if err != nil || rc2.Store != nil || rc2.Unavailable == "" {
		t.Fatalf("second open: %+v, %v", rc2, err)
	}
	close2()
	closeStore()
	o.dataDir = ""
	if rc, _, err := o.openResponseStore(log, env(nil)); err != nil || rc.Store != nil || rc.Unavailable != "no --data-dir was given" {
		t.Fatalf("no data dir: %+v, %v", rc, err)
	}
	o.responsesRetention = "soon"
	if _, _, err := o.openResponseStore(log, env(nil)); err == nil {
		t.Fatal("a bad --responses-retention was accepted")
	}
}

// TestRunBatchResponsesLines runs /v1/responses lines: an omitted store keeps nothing
// and is served, store:true is a 400 naming store.
func TestRunBatchResponsesLines(t *testing.T) {
	dir := tinyModelDir(t)
	tmp := t.TempDir()
	input, output := filepath.Join(tmp, "in.jsonl"), filepath.Join(tmp, "out.jsonl")
	writeLines(t, input,
		`{"custom_id":"ok","method":"POST","url":"/v1/responses","body":{"model":"tiny","input":"Hello","max_output_tokens":6}}`,
		`{"custom_id":"stored","method":"POST","url":"/v1/responses","body":{"model":"tiny","input":"Hello","store":true}}`)
	if err := runBatch(context.Background(), newBatchOptions(t, dir, input, output), io.Discard, false); err != nil {
		t.Fatal(err)
	}
	res := byCustomID(readBatchOutput(t, output))
	ok := res["ok"]
	if len(ok) != 1 || ok[0].Response == nil || ok[0].Response.StatusCode != 200 {
		t.Fatalf("ok line: %+v", ok)
	}
	var body struct {
		Object string `json:"object"`
		Status string `json:"status"`
		Store  bool   `json:"store"`
		Usage  struct {
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(ok[0].Response.Body, &body); err != nil || body.Object != "response" || body.Store || body.Usage.OutputTokens == 0 {
		t.Fatalf("ok body %s", ok[0].Response.Body)
	}
	st := res["stored"]
	var e struct {
		Error struct {
			Param string `json:"param"`
		} `json:"error"`
	}
	if len(st) != 1 || st[0].Response == nil || st[0].Response.StatusCode != 400 || json.Unmarshal(st[0].Response.Body, &e) != nil || e.Error.Param != "store" {
		t.Fatalf("store:true line: %+v", st)
	}
}
