package convert

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// gpt2Dir is an ONNX model directory exported by Optimum.
var gpt2Dir = filepath.Join("..", "testdata", "gpt2-optimum")

func TestPrepare(t *testing.T) {
	cache := t.TempDir()

	// A directory with model.onnx is used as it is.
	if out, built, err := Prepare(gpt2Dir, cache, Options{}); err != nil || out != gpt2Dir || built {
		t.Fatalf("Prepare(ONNX dir) = %q, %v, %v", out, built, err)
	}

	// A checkpoint is built once, then reused.
	hf := t.TempDir()
	cfg := tinyTestConfig()
	writeConfig(t, cfg, hf)
	if err := WriteSafetensors(filepath.Join(hf, "model.safetensors"), RandomWeights(cfg, 1), Float32); err != nil {
		t.Fatal(err)
	}
	copyTinyTokenizer(t, hf)
	out, built, err := Prepare(hf, cache, Options{})
	if err != nil || !built {
		t.Fatalf("Prepare(checkpoint) = %q, %v, %v; want a build", out, built, err)
	}
	for _, name := range []string{"model.onnx", "config.json"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Errorf("built directory lacks %s", name)
		}
	}
	builderTestInitORT(t)
	r, err := models.OpenDense(out, models.RunnerOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatalf("OpenDense(built): %v", err)
	}
	_ = r.Close()
	again, built, err := Prepare(hf, cache, Options{})
	if err != nil || again != out || built {
		t.Fatalf("second Prepare = %q, %v, %v; want %q reused", again, built, err, out)
	}

	// A build for the GPU (a float16 step graph) is cached apart.
	half, built, err := Prepare(hf, cache, Options{StepDType: Float16})
	if err != nil || half == out || !built {
		t.Fatalf("Prepare(float16 step graph) = %q, %v, %v", half, built, err)
	}
	if man, err := modeldir.LoadStep(half); err != nil || man.DType != "float16" {
		t.Fatalf("the GPU build's step graph: %+v, %v", man, err)
	}

	// A quantized build is cached apart, and records its quantization; asking a built
	// directory for another quantization is an error that says so.
	q4, _ := ParseQuantization("int4")
	quantized, built, err := Prepare(hf, cache, Options{Quantize: q4})
	if err != nil || quantized == out || !built || BuiltQuantization(quantized) != "int4" || BuiltQuantization(out) != "none" {
		t.Fatalf("Prepare(int4) = %q, %v, %v (quantization %s)", quantized, built, err, BuiltQuantization(quantized))
	}
	if again, built, err := Prepare(quantized, cache, Options{Quantize: q4}); err != nil || again != quantized || built {
		t.Fatalf("Prepare(built int4 dir, int4) = %q, %v, %v", again, built, err)
	}
	q8, _ := ParseQuantization("int8")
	if _, _, err := Prepare(out, cache, Options{Quantize: q8}); !errors.Is(err, ErrNotCheckpoint) || !strings.Contains(err.Error(), "quantization none") {
		t.Fatalf("Prepare(float dir, int8): %v", err)
	}

	// A changed checkpoint is a new build.
	cfg.RMSNormEps = 1e-6
	writeConfig(t, cfg, hf)
	if other, built, err := Prepare(hf, cache, Options{}); err != nil || other == out || !built {
		t.Fatalf("Prepare after a config change = %q, %v, %v; want a new build", other, built, err)
	}

	// Neither ONNX nor a checkpoint.
	if _, _, err := Prepare(t.TempDir(), cache, Options{}); !errors.Is(err, ErrNotCheckpoint) {
		t.Fatalf("Prepare(empty dir): %v, want ErrNotCheckpoint", err)
	}
	noWeights := t.TempDir()
	writeConfig(t, cfg, noWeights)
	if _, _, err := Prepare(noWeights, cache, Options{}); !errors.Is(err, ErrNotCheckpoint) {
		t.Fatalf("Prepare(config without weights): %v, want ErrNotCheckpoint", err)
	}
}

func writeConfig(t *testing.T, cfg *Config, dir string) {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// copyTinyTokenizer copies tiny-llama's tokenizer.json into dir.
func copyTinyTokenizer(t *testing.T, dir string) {
	t.Helper()
	if err := copyFile(filepath.Join("..", "testdata", "tiny-llama", "tokenizer.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
}

// TestPrepareRefusesCheckpointWithoutTokenizer: a checkpoint directory without
// tokenizer.json is refused before anything is built, in one line naming the directory
// and the file (it used to build, then fail to load naming the cache's tokenizer.json),
// and also when an earlier release built it into the cache already. A GGUF file carries
// its tokenizer, and a built model directory is not looked into.
func TestPrepareRefusesCheckpointWithoutTokenizer(t *testing.T) {
	cache := t.TempDir()
	hf := t.TempDir()
	cfg := tinyTestConfig()
	writeConfig(t, cfg, hf)
	if err := WriteSafetensors(filepath.Join(hf, "model.safetensors"), RandomWeights(cfg, 1), Float32); err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		out, built, err := Prepare(hf, cache, Options{})
		want := "the checkpoint " + hf + " has no tokenizer.json"
		if !errors.Is(err, ErrNoTokenizer) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") || out != "" || built {
			t.Errorf("%s: Prepare = %q, %v, %v; want one line with %q", what, out, built, err, want)
		}
	}
	check("no tokenizer")
	if entries, _ := os.ReadDir(cache); len(entries) > 0 {
		t.Errorf("the refused checkpoint left %v in the cache", entries)
	}
	// What an earlier release built for the same key: refused all the same.
	key, err := checkpointKey(hf, Options{})
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(cache, filepath.Base(hf)+"-"+key)
	if _, err := BuildFromHF(hf, stale, Options{}); err != nil {
		t.Fatal(err)
	}
	check("built before")
	os.WriteFile(filepath.Join(hf, "tokenizer.model"), []byte("sp"), 0o644)
	if _, _, err := Prepare(hf, cache, Options{}); err == nil || !strings.Contains(err.Error(), "tokenizer.model (SentencePiece's) is not read") {
		t.Errorf("with tokenizer.model: %v", err)
	}
	if err := os.Mkdir(filepath.Join(hf, "tokenizer.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Prepare(hf, cache, Options{}); !errors.Is(err, ErrNoTokenizer) || !strings.Contains(err.Error(), "tokenizer.json is not a file") {
		t.Errorf("tokenizer.json a directory: %v", err)
	}
	os.Remove(filepath.Join(hf, "tokenizer.json"))

	copyTinyTokenizer(t, hf)
	out, built, err := Prepare(hf, cache, Options{})
	if err != nil || !built {
		t.Fatalf("with tokenizer.json: %q, %v, %v", out, built, err)
	}
	if _, err := os.Stat(filepath.Join(out, "tokenizer.json")); err != nil {
		t.Errorf("the build has no tokenizer.json: %v", err)
	}
	if err := CheckTokenizer(out); err != nil {
		t.Errorf("CheckTokenizer(built): %v", err)
	}
	gguf := filepath.Join(t.TempDir(), "m.gguf")
	writeTinyGGUF(t, gguf, 64)
	if err := CheckTokenizer(gguf); err != nil {
		t.Errorf("CheckTokenizer(GGUF file): %v", err)
	}
}
