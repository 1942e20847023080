package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// childArgsEnv carries serve's arguments to the child process of TestServeResponsesSurviveKill.
const childArgsEnv = "CONVEYOR_TEST_SERVE_CHILD_ARGS"

// startServeChild runs `serve` with args in a child process (this test binary) and
// returns its address; the child is SIGKILLed by kill.
func startServeChild(t *testing.T, args []string) (addr string, kill func()) {
	t.Helper()
	enc, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeResponsesSurviveKill$")
	cmd.Env = append(os.Environ(), childArgsEnv+"="+string(enc))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill = func() {
		_ = cmd.Process.Kill() // SIGKILL: no drain, no Close
		_ = cmd.Wait()
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return a, kill
		}
	}
	kill()
	t.Fatal("the child server did not start")
	return "", nil
}

func postJSON(t *testing.T, url, body string) map[string]any {
	t.Helper()
	res, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(res.Body).Decode(&m); err != nil || res.StatusCode != 200 {
		t.Fatalf("POST %s: %d %v %v", url, res.StatusCode, m, err)
	}
	return m
}

// TestServeResponsesSurviveKill stores a response in a real `serve` process, SIGKILLs
// it, starts another on the same --data-dir, reads the response back and continues the
// conversation from it.
func TestServeResponsesSurviveKill(t *testing.T) {
	if enc := os.Getenv(childArgsEnv); enc != "" {
		var args []string
		if err := json.Unmarshal([]byte(enc), &args); err != nil {
			t.Fatal(err)
		}
		o, err := parseServeFlags(args, env(nil), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		ready := make(chan string, 1)
		go func() { _ = serve(context.Background(), o, io.Discard, io.Discard, ready) }()
		fmt.Println("ADDR " + <-ready)
		time.Sleep(5 * time.Minute) // killed here
		return
	}
	args := []string{"--model", tinyModelDir(t), "--port", "0", "--ort-lib", testORTLib(t), "--threads", "1",
		"--kv-cache-memory", "8MiB", "--served-model-name", "tiny", "--data-dir", t.TempDir()}
	addr, kill := startServeChild(t, args)
	first := postJSON(t, "http://"+addr+"/v1/responses", `{"model":"tiny","input":"Hello","max_output_tokens":5}`)
	kill()

	addr, kill = startServeChild(t, args)
	defer kill()
	res, err := http.Get("http://" + addr + "/v1/responses/" + first["id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	_ = json.NewDecoder(res.Body).Decode(&got)
	res.Body.Close()
	if res.StatusCode != 200 || got["output_text"] != first["output_text"] || got["status"] != first["status"] {
		t.Fatalf("after kill -9: %d %v (stored %v)", res.StatusCode, got, first)
	}
	next := postJSON(t, "http://"+addr+"/v1/responses", `{"model":"tiny","input":"And then?","max_output_tokens":3,"previous_response_id":"`+first["id"].(string)+`"}`)
	in := func(m map[string]any) float64 { return m["usage"].(map[string]any)["input_tokens"].(float64) }
	if next["previous_response_id"] != first["id"] || in(next) <= in(first) {
		t.Fatalf("continued: %v", next)
	}
}
