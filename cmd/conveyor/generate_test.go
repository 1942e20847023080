package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// testORTLib finds the ONNX Runtime library like the models tests do: $CONVEYOR_ORT_LIB
// or <repo>/.ort/libonnxruntime.so.1; missing is a failure that says to run `make ort`.
func testORTLib(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(models.ORTLibEnv); p != "" {
		return p
	}
	p, err := filepath.Abs(filepath.Join("..", "..", models.DefaultORTLib))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("ONNX Runtime library %s not found: run `make ort` (or set %s)", p, models.ORTLibEnv)
	}
	return p
}

// tinyModelDir builds the tiny-llama fixture with random weights and its tokenizer.
func tinyModelDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join("..", "..", "models", "testdata", "tiny-llama", "config.json")
	if _, err := convert.BuildRandom(cfg, dir, 5, convert.Options{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestGenerateGreedyMatchesRecompute checks the cached single-sequence path against
// greedy decoding that recomputes the whole sequence every step.
func TestGenerateGreedyMatchesRecompute(t *testing.T) {
	dir := tinyModelDir(t)
	lib := testORTLib(t)
	o := generateOptions{modelDir: dir, prompt: "hello there", maxTokens: 16, ortLib: lib, threads: 1}
	var out, info bytes.Buffer
	got, err := generate(context.Background(), o, &out, &info)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || !strings.Contains(info.String(), "generated") {
		t.Fatalf("generated %v, info %q", got, info.String())
	}

	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := models.OpenDense(dir, models.RunnerOptions{ORTLib: lib, IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	seq, err := tok.Encode(o.prompt, true)
	if err != nil {
		t.Fatal(err)
	}
	eos := r.Spec().EOSTokenIDs
	var want []int32
	for len(want) < o.maxTokens {
		res, err := r.Forward(&models.Batch{Seqs: []models.SeqInput{{Tokens: seq}}})
		if err != nil {
			t.Fatal(err)
		}
		id := argmax(res.Logits[0])
		want = append(want, id)
		if slices.Contains(eos, id) {
			break
		}
		seq = append(seq, id)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("generate produced %v, recomputation %v", got, want)
	}
}

func TestGenerateSeededSampling(t *testing.T) {
	dir := tinyModelDir(t)
	o := generateOptions{modelDir: dir, prompt: "abc", maxTokens: 12, temperature: 0.9, seed: 7, ortLib: testORTLib(t), threads: 1}
	run := func() []int32 {
		ids, err := generate(context.Background(), o, &bytes.Buffer{}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	if a, b := run(), run(); !slices.Equal(a, b) {
		t.Fatalf("same seed, different tokens: %v vs %v", a, b)
	}
}

func TestGenerateErrors(t *testing.T) {
	dir := tinyModelDir(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--prompt", "x"}, "--model is required"},
		{[]string{"--model", dir, "--max-tokens", "0"}, "--max-tokens"},
		{[]string{"--model", dir, "--temperature", "-1"}, "--temperature"},
		{[]string{"--model", dir, "--threads", "-2"}, "--threads"},
		{[]string{"--model", dir, "--prompt", "x", "--attention", "flash"}, "--attention"},
		{[]string{"--model", dir, "--prompt", "x", "--device", "gpu"}, `--device "gpu": want cpu, cuda or auto`},
		{[]string{"--model", dir, "--prompt", "x", "--ort-lib", filepath.Join(t.TempDir(), "missing.so")}, "make ort"},
		// Rules the engine judges (once the model is loaded) name the flag too.
		{[]string{"--model", dir, "--prompt", "x", "--ort-lib", testORTLib(t), "--threads", "1", "--temperature", "100"}, "generate: --temperature must be"},
		{[]string{"--model", dir, "--prompt", "x", "--ort-lib", testORTLib(t), "--threads", "1", "--max-tokens", "100000"}, "generate: --max-tokens must be"},
		{[]string{"--model", t.TempDir(), "--prompt", "x", "--ort-lib", testORTLib(t)}, "neither model.onnx nor config.json"},
		{[]string{"--model", filepath.Join(t.TempDir(), "missing"), "--prompt", "x", "--ort-lib", testORTLib(t)}, "missing does not exist"},
	} {
		err := runGenerate(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
}

func argmax(xs []float32) int32 {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return int32(best)
}

// TestGenerateWithDraftModel: generate with --speculative-config's draft_model method
// (the model's int4 build as its draft) prints the tokens it prints without; a draft
// whose tokenizer differs from the model's is refused with one line naming the token.
func TestGenerateWithDraftModel(t *testing.T) {
	dir := tinyModelDir(t)
	draft := filepath.Join(t.TempDir(), "int4")
	cfg := filepath.Join("..", "..", "models", "testdata", "tiny-llama", "config.json")
	if _, err := convert.BuildRandom(cfg, draft, 5, convert.Options{Quantize: convert.Quantization{Bits: 4, BlockSize: 32}}); err != nil {
		t.Fatal(err)
	}
	o := generateOptions{modelDir: dir, prompt: "the quick brown fox", maxTokens: 40, ortLib: testORTLib(t), threads: 1}
	want, err := generate(context.Background(), o, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	o.speculative = `{"method": "draft_model", "model": "` + draft + `", "num_speculative_tokens": 3}`
	got, err := generate(context.Background(), o, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("with the draft model %v, without %v", got, want)
	}

	// The same weights, two tokens of the vocabulary swapped.
	path := filepath.Join(draft, "tokenizer.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	swapped := strings.Replace(strings.Replace(string(data), `"!": 3,`, `"!": 4,`, 1), `"\"": 4,`, `"\"": 3,`, 1)
	if swapped == string(data) {
		t.Fatal("the tokenizer has no tokens to swap")
	}
	if err := os.WriteFile(path, []byte(swapped), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = generate(context.Background(), o, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "a draft must share the model's tokenizer") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("a draft with another vocabulary: %v; want one line refusing it", err)
	}
}

// TestPerplexityRefusalsNameTheFlags: a file too short for one window, or a --context the
// model cannot take, is one line naming --context; blank lines are no documents.
func TestPerplexityRefusalsNameTheFlags(t *testing.T) {
	dir := tinyModelDir(t)
	short := filepath.Join(t.TempDir(), "short.txt")
	if err := os.WriteFile(short, []byte("  \n\t\nOnce upon a time\n \n"), 0o644); err != nil {
		t.Fatal(err)
	}
	blank := filepath.Join(t.TempDir(), "blank.txt")
	if err := os.WriteFile(blank, []byte(" \n\t\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--file", short, "--context", "64"}, "conveyor: perplexity: " + short + " has "},
		{[]string{"--file", short, "--context", "100000"}, "conveyor: perplexity: --context 100000: the model's context takes windows of at most"},
		{[]string{"--file", blank}, "conveyor: perplexity: " + blank + " holds no text"},
	} {
		var stderr bytes.Buffer
		args := append([]string{"perplexity", "--model", dir, "--ort-lib", testORTLib(t), "--threads", "1"}, tc.args...)
		if code := runMain(args, io.Discard, &stderr); code != 1 || !strings.HasPrefix(stderr.String(), tc.want) || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q, want one line starting %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// cancelWriter cancels its context on the first write.
type cancelWriter struct {
	cancel context.CancelFunc
}

func (w *cancelWriter) Write(p []byte) (int, error) {
	w.cancel()
	return len(p), nil
}

// TestGenerateInterrupted: Ctrl-C while generating (or before) is an error that says so,
// not the summary line of a generation that looks complete.
func TestGenerateInterrupted(t *testing.T) {
	o := generateOptions{modelDir: tinyModelDir(t), prompt: "hello there", maxTokens: 400, ortLib: testORTLib(t), threads: 1}
	ctx, cancel := context.WithCancel(context.Background())
	var info bytes.Buffer
	_, err := generate(ctx, o, &cancelWriter{cancel: cancel}, &info)
	if err == nil || !strings.Contains(err.Error(), "generate: interrupted after") || strings.Contains(info.String(), "generated;") {
		t.Fatalf("interrupted mid-way: %v, info %q", err, info.String())
	}
	if _, err := generate(ctx, o, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("interrupted before: %v", err)
	}
}
