package models

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// testORTLib returns the ONNX Runtime library for tests: $CONVEYOR_ORT_LIB, else
// <repo>/.ort/libonnxruntime.so.1 found by walking up to go.mod. A missing library is
// a test failure (not a skip) that says how to get it.
func testORTLib(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv(ORTLibEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			tb.Fatalf("%s=%s: %v (run `make ort`)", ORTLibEnv, p, err)
		}
		return p
	}
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, DefaultORTLib)
			if _, err := os.Stat(p); err != nil {
				tb.Fatalf("ONNX Runtime library %s not found: run `make ort` (or set %s)", p, ORTLibEnv)
			}
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatalf("go.mod not found above the test directory; set %s", ORTLibEnv)
		}
		dir = parent
	}
}

// tinyConfig returns a small Llama config for tests.
func tinyConfig(hidden, layers, heads, kvHeads, inter, vocab int, tied bool) *convert.Config {
	return &convert.Config{
		Architectures:         []string{"LlamaForCausalLM"},
		ModelType:             "llama",
		VocabSize:             vocab,
		HiddenSize:            hidden,
		IntermediateSize:      inter,
		NumHiddenLayers:       layers,
		NumAttentionHeads:     heads,
		NumKeyValueHeads:      kvHeads,
		RMSNormEps:            1e-5,
		RopeTheta:             10000,
		MaxPositionEmbeddings: 256,
		TieWordEmbeddings:     tied,
		EOSTokenID:            modeldir.TokenIDs{2},
	}
}

// buildTestModel writes a random-weight model for cfg into dir and returns its weights.
func buildTestModel(tb testing.TB, cfg *convert.Config, seed int64, dir string) convert.Weights {
	tb.Helper()
	w := convert.RandomWeights(cfg, seed)
	if err := convert.BuildLlamaONNX(cfg, w, dir); err != nil {
		tb.Fatalf("BuildLlamaONNX: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		raw, err := json.Marshal(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return w
}

// openTestRunner opens the model in dir with the test library and two threads.
func openTestRunner(tb testing.TB, dir string) *DenseRunner {
	tb.Helper()
	r, err := OpenDense(dir, RunnerOptions{ORTLib: testORTLib(tb), IntraOpThreads: 2})
	if err != nil {
		tb.Fatalf("OpenDense: %v", err)
	}
	tb.Cleanup(func() { _ = r.Close() })
	return r
}

// modelVariant changes the Llama graph's interface the way other exporters do.
type modelVariant = convert.Variant

// buildModelVariant writes the Llama graph for cfg with the interface changes of v.
func buildModelVariant(tb testing.TB, cfg *convert.Config, seed int64, dir string, v modelVariant) convert.Weights {
	tb.Helper()
	w := convert.RandomWeights(cfg, seed)
	if err := convert.BuildLlamaVariant(cfg, w, dir, v); err != nil {
		tb.Fatal(err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		tb.Fatal(err)
	}
	return w
}

func randTokens(seed uint64, n, vocab int) []int32 {
	out := make([]int32, n)
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range out {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		out[i] = int32(x % uint64(vocab))
	}
	return out
}

// maxAbs returns the largest magnitude in xs.
func maxAbs(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = math.Max(m, math.Abs(x))
	}
	return m
}

// relErr returns the largest |got-want| relative to want's scale (max |want|); a
// length mismatch is an infinite error.
func relErr(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	scale := math.Max(maxAbs(want), 1e-6)
	worst := 0.0
	for i := range want {
		worst = math.Max(worst, math.Abs(float64(got[i])-want[i])/scale)
	}
	return worst
}

// relErr32 is relErr for two float32 vectors.
func relErr32(got, want []float32) float64 {
	w := make([]float64, len(want))
	for i, x := range want {
		w[i] = float64(x)
	}
	return relErr(got, w)
}

// argmax returns the index of the largest value.
func argmax(xs []float32) int32 {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return int32(best)
}
