package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/models/modeldir"
)

func TestRunMainListsCommands(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}} {
		var out, errOut bytes.Buffer
		if code := runMain(args, &out, &errOut); code != 0 {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errOut.String())
		}
		if !strings.Contains(out.String(), "build-model") {
			t.Errorf("%v: command list lacks build-model:\n%s", args, out.String())
		}
	}
	// No command: the list on stderr, and exit 2.
	var out, errOut bytes.Buffer
	if code := runMain(nil, &out, &errOut); code != 2 || out.Len() != 0 || !strings.Contains(errOut.String(), "build-model") {
		t.Errorf("no command: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
}

// registerTestCommands adds the commands TestRunMainErrorsAreOneLine runs, once per
// process (go test -count=N runs the test N times).
var registerTestCommands = sync.OnceFunc(func() {
	register(command{name: "fail-test", summary: "fails", run: func([]string) error {
		return errors.New("first line\nsecond line")
	}})
	register(command{name: "panic-test", summary: "panics", run: func([]string) error { panic("boom") }})
})

func TestRunMainErrorsAreOneLine(t *testing.T) {
	registerTestCommands()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"nope"}, `conveyor: unknown command "nope"`},
		{[]string{"fail-test"}, "conveyor: first line second line\n"},
		{[]string{"panic-test"}, "conveyor: internal error: boom\n"},
		{[]string{"build-model", "--out", "x"}, "conveyor: build-model: give --from"},
		{[]string{"build-model", "--random", "--out", "x"}, "conveyor: build-model: --random needs --config"},
		{[]string{"build-model", "--from", "x", "--out", "y", "--seed", "5"}, "conveyor: build-model: --seed only goes with --random"},
		{[]string{"perplexity", "--model", "x", "--file", "y", "--kv-cache-dtype", "bad"}, `conveyor: perplexity: --kv-cache-dtype "bad": want`},
		{[]string{"build-model", "--from", "x", "--out", "y", "--quantize", "int3"}, `conveyor: build-model: --quantize: unknown quantization "int3"`},
		{[]string{"perplexity", "--model", "x"}, "conveyor: perplexity: --model and --file are required"},
		{[]string{"perplexity", "--model", "x", "--file", "y", "--quantize", "fp8"}, `conveyor: perplexity: --quantize: unknown quantization "fp8"`},
		{[]string{"perplexity", "--model", "x", "--file", "y", "--chunk", "-1"}, "conveyor: perplexity: --chunk -1 must be >= 0"},
		{[]string{"perplexity", "--model", "x", "--file", "y", "--max-windows", "-1"}, "conveyor: perplexity: --max-windows -1 must be >= 0"},
		{[]string{"perplexity", "--model", "x", "--file", "y", "--threads", "1000000"}, "conveyor: perplexity: --threads 1000000: want 0 (all cores) to"},
		{[]string{"generate", "--model", "x", "--prompt", "y", "--threads", "1000000"}, "conveyor: generate: --threads 1000000: want 0 (all cores) to"},
		{[]string{"serve", "--model", "x", "--quantize", "int2"}, `conveyor: serve: --quantize: unknown quantization "int2"`},
		{[]string{"serve", "--model", "x", "--tool-call-parser", "pythonic"}, `conveyor: serve: --tool-call-parser: unknown tool-call format "pythonic"`},
		{[]string{"run-batch", "--output", "x"}, "conveyor: run-batch: --input is required"},
		{[]string{"run-batch", "--input", "x"}, "conveyor: run-batch: --output is required"},
		{[]string{"run-batch", "--input", "x", "--output", "y", "--max-in-flight", "-1"}, "conveyor: run-batch: --max-in-flight -1 must be >= 0"},
		{[]string{"run-batch", "--input", "x", "--output", "y", "--quantize", "int2"}, `conveyor: run-batch: --quantize: unknown quantization "int2"`},
		{[]string{"run-batch", "--input", "/nonexistent/in.jsonl", "--output", "y"}, "conveyor: run-batch: open /nonexistent/in.jsonl: no such file or directory"},
		{[]string{"run-batch", "--input", "x", "--output", "y", "--bogus"}, "conveyor: run-batch: flag provided but not defined: -bogus"},
	} {
		var out, errOut bytes.Buffer
		code := runMain(tc.args, &out, &errOut)
		if code != 1 {
			t.Errorf("%v: exit %d, want 1", tc.args, code)
		}
		if !strings.HasPrefix(errOut.String(), tc.want) || strings.Count(errOut.String(), "\n") != 1 {
			t.Errorf("%v: stderr %q, want one line starting %q", tc.args, errOut.String(), tc.want)
		}
	}
}

func TestBuildModelRandom(t *testing.T) {
	out := t.TempDir()
	cfg := filepath.Join("..", "..", "models", "testdata", "tiny-llama", "config.json")
	var stdout, stderr bytes.Buffer
	if code := runMain([]string{"build-model", "--random", "--config", cfg, "--out", out, "--seed", "3"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, name := range []string{"model.onnx", "config.json", "tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Errorf("%s missing: %v", name, err)
		}
	}
	var errOut bytes.Buffer
	if code := runMain([]string{"build-model", "--from", t.TempDir(), "--out", out}, &stdout, &errOut); code != 1 || !strings.Contains(errOut.String(), "config.json") {
		t.Errorf("empty checkpoint dir: exit %d, %q", code, errOut.String())
	}
	// The CPU step graph keeps its cache in float16 unless --kv-cache-dtype float32.
	for kv, want := range map[string]string{"": "float16", "float32": "float32", "float16": "float16"} {
		dir := t.TempDir()
		args := []string{"build-model", "--random", "--config", cfg, "--out", dir}
		if kv != "" {
			args = append(args, "--kv-cache-dtype", kv)
		}
		if code := runMain(args, &stdout, &stderr); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr.String())
		}
		man, err := modeldir.LoadStep(dir)
		if err != nil {
			t.Fatal(err)
		}
		if man.CacheDType() != want {
			t.Errorf("--kv-cache-dtype %q: the step graph's cache is %s, want %s", kv, man.CacheDType(), want)
		}
	}
	errOut.Reset()
	if code := runMain([]string{"build-model", "--random", "--config", cfg, "--out", t.TempDir(), "--dtype", "bfloat16", "--kv-cache-dtype", "float16"}, &stdout, &errOut); code != 1 ||
		errOut.String() != "conveyor: build-model: --kv-cache-dtype float16: a bfloat16 step graph's cache is its own type (leave it auto)\n" {
		t.Errorf("--dtype bfloat16 --kv-cache-dtype float16: exit %d, %q", code, errOut.String())
	}
	errOut.Reset()
	if code := runMain([]string{"build-model", "--random", "--config", cfg, "--out", out, "--kv-cache-dtype", "int8"}, &stdout, &errOut); code != 1 ||
		errOut.String() != "conveyor: build-model: --kv-cache-dtype \"int8\": want float32, float16 or auto\n" {
		t.Errorf("--kv-cache-dtype int8: exit %d, %q", code, errOut.String())
	}
}

// TestSubcommandFlagErrorsAreOneLine checks that a mistyped flag or a stray argument is
// one "conveyor: <command>: ..." line, with no usage dump on the process's stderr.
func TestSubcommandFlagErrorsAreOneLine(t *testing.T) {
	checkOneLineErrors(t, []oneLineError{
		{[]string{"generate", "--model", "m", "--bogus"}, "conveyor: generate: flag provided but not defined: -bogus\n"},
		{[]string{"generate", "--max-tokens", "ten"}, `conveyor: generate: invalid value "ten" for flag -max-tokens`},
		{[]string{"generate", "--model", "m", "Once upon a time"}, `conveyor: generate: unexpected argument "Once upon a time"`},
		{[]string{"generate", "--model", "m"}, "conveyor: generate: --prompt is required"},
		{[]string{"generate", "--model", "m", "--prompt", "x", "--device", "gpu"}, `conveyor: generate: --device "gpu": want cpu, cuda or auto`},
		{[]string{"build-model", "--checkpoint", "x"}, "conveyor: build-model: flag provided but not defined: -checkpoint\n"},
		{[]string{"build-model", "--out", "x", "extra"}, `conveyor: build-model: unexpected argument "extra"`},
	})
}

// oneLineError is a command line and the start of the one stderr line it must fail with.
type oneLineError struct {
	args []string
	want string
}

// checkOneLineErrors runs each command line: it must exit 1 with one stderr line starting
// as given, and the flag package must not dump its usage on the process's stderr.
func checkOneLineErrors(t *testing.T, cases []oneLineError) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w // the flag package writes its usage dump here
	defer func() { os.Stderr = saved }()
	for _, tc := range cases {
		var out, errOut bytes.Buffer
		if code := runMain(tc.args, &out, &errOut); code != 1 {
			t.Errorf("%v: exit %d, want 1", tc.args, code)
		}
		if !strings.HasPrefix(errOut.String(), tc.want) || strings.Count(errOut.String(), "\n") != 1 {
			t.Errorf("%v: stderr %q, want one line starting %q", tc.args, errOut.String(), tc.want)
		}
	}
	w.Close()
	os.Stderr = saved
	if dump, _ := io.ReadAll(r); len(dump) > 0 {
		t.Errorf("the flag package wrote to stderr:\n%s", dump)
	}
}

// TestSecondSignalEndsProcess runs a child process that waits on notifyContext and
// then winds down slowly: the first SIGINT starts the wind-down, the second must end the
// process at once (killed by the signal) instead of being swallowed.
func TestSecondSignalEndsProcess(t *testing.T) {
	if os.Getenv("CONVEYOR_SIGNAL_CHILD") == "1" {
		ctx, stop := notifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		fmt.Println("ready")
		<-ctx.Done()
		fmt.Println("draining")
		time.Sleep(time.Minute) // a drain that would outlast the test's patience
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSecondSignalEndsProcess$")
	cmd.Env = append(os.Environ(), "CONVEYOR_SIGNAL_CHILD=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	expect := func(want string) {
		t.Helper()
		for lines.Scan() {
			if lines.Text() == want {
				return
			}
		}
		cmd.Process.Kill()
		t.Fatalf("child never printed %q", want)
	}
	expect("ready")
	cmd.Process.Signal(os.Interrupt)
	expect("draining")
	cmd.Process.Signal(os.Interrupt)
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child ended with %v, want killed by the second SIGINT", err)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Fatalf("child ended with %v, want killed by the second SIGINT", err)
	}
}
