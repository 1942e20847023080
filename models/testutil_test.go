package models

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/conveyor-llm/conveyor/models/build"
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
func tinyConfig(hidden, layers, heads, kvHeads, inter, vocab int, tied bool) *build.Config {
	return &build.Config{
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
func buildTestModel(tb testing.TB, cfg *build.Config, seed int64, dir string) build.Weights {
	tb.Helper()
	w := build.RandomWeights(cfg, seed)
	if err := build.BuildLlamaONNX(cfg, w, dir); err != nil {
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
func openTestRunner(tb testing.TB, dir string) *Runner {
	tb.Helper()
	r, err := OpenRunner(dir, RunnerOptions{ORTLib: testORTLib(tb), IntraOpThreads: 2})
	if err != nil {
		tb.Fatalf("OpenRunner: %v", err)
	}
	tb.Cleanup(func() { _ = r.Close() })
	return r
}

// seqKV is one sequence's keys and values in a plain dense layout: k[layer] holds
// [pos][kvHead][headDim] elements of the model's KV type, as bytes.
type seqKV struct {
	k, v [][]byte
}

// denseKV is a simple in-memory KV implementation for tests: one seqKV per sequence,
// and the mapping of the current batch's rows to sequences. It copies bytes, so it
// serves float32 and float16 models alike.
type denseKV struct {
	spec   Spec
	seqs   []*seqKV
	rows   []int // rows[b] = index into seqs
	past   []int // rows' PastLen
	counts []int // rows' new-token counts
}

func newDenseKV(spec Spec, numSeqs int) *denseKV {
	d := &denseKV{spec: spec}
	for i := 0; i < numSeqs; i++ {
		d.seqs = append(d.seqs, &seqKV{k: make([][]byte, spec.NumLayers), v: make([][]byte, spec.NumLayers)})
	}
	return d
}

// headBytes is the size of one head's vector at one position.
func (d *denseKV) headBytes() int { return d.spec.HeadDim * d.spec.KVDType.Size() }

// length returns how many positions sequence i holds.
func (d *denseKV) length(i int) int {
	return len(d.seqs[i].k[0]) / (d.spec.NumKVHeads * d.headBytes())
}

// batch builds the Batch for the given sequences and new tokens, recording the row
// mapping for GatherPast/ScatterNew. Each row's PastLen is its sequence's length.
func (d *denseKV) batch(seqs []int, tokens [][]int32, allLogits bool) *Batch {
	b := &Batch{}
	d.rows, d.past, d.counts = seqs, nil, nil
	for i, s := range seqs {
		past := d.length(s)
		b.Seqs = append(b.Seqs, SeqInput{Tokens: tokens[i], PastLen: past, AllLogits: allLogits})
		d.past = append(d.past, past)
		d.counts = append(d.counts, len(tokens[i]))
	}
	return b
}

// checkDense verifies a DenseKV's geometry against the batch.
func (d *denseKV) checkDense(kv DenseKV) error {
	if kv.DType != d.spec.KVDType || kv.Batch != len(d.rows) || kv.KVHeads != d.spec.NumKVHeads || kv.HeadDim != d.spec.HeadDim {
		return fmt.Errorf("unexpected dense KV %dx%dx%dx%d %s", kv.Batch, kv.KVHeads, kv.Tokens, kv.HeadDim, kv.DType)
	}
	if want := kv.Batch * kv.KVHeads * kv.Tokens * kv.HeadDim * kv.DType.Size(); len(kv.Data) != want {
		return fmt.Errorf("DenseKV has %d bytes, want %d", len(kv.Data), want)
	}
	return nil
}

func (d *denseKV) GatherPast(k, v []DenseKV) error {
	if len(k) != d.spec.NumLayers || len(v) != d.spec.NumLayers {
		return fmt.Errorf("got %d/%d layers, want %d", len(k), len(v), d.spec.NumLayers)
	}
	kvh, hb := d.spec.NumKVHeads, d.headBytes()
	for l := range k {
		for kind, dst := range []DenseKV{k[l], v[l]} {
			if err := d.checkDense(dst); err != nil {
				return err
			}
			clear(dst.Data)
			for b, s := range d.rows {
				src := d.seqs[s].k[l]
				if kind == 1 {
					src = d.seqs[s].v[l]
				}
				for h := 0; h < kvh; h++ {
					for p := 0; p < d.past[b]; p++ {
						o := ((b*kvh+h)*dst.Tokens + p) * hb
						copy(dst.Data[o:o+hb], src[(p*kvh+h)*hb:(p*kvh+h+1)*hb])
					}
				}
			}
		}
	}
	return nil
}

func (d *denseKV) ScatterNew(k, v []DenseKV, newOffset int) error {
	kvh, hb := d.spec.NumKVHeads, d.headBytes()
	for l := range k {
		for kind, src := range []DenseKV{k[l], v[l]} {
			if err := d.checkDense(src); err != nil {
				return err
			}
			for b, s := range d.rows {
				dst := &d.seqs[s].k[l]
				if kind == 1 {
					dst = &d.seqs[s].v[l]
				}
				if len(*dst) != d.past[b]*kvh*hb {
					return fmt.Errorf("row %d: sequence holds %d bytes, want past %d", b, len(*dst), d.past[b])
				}
				for j := 0; j < d.counts[b]; j++ {
					for h := 0; h < kvh; h++ {
						o := ((b*kvh+h)*src.Tokens + newOffset + j) * hb
						*dst = append(*dst, src.Data[o:o+hb]...)
					}
				}
			}
		}
	}
	return nil
}

// modelVariant changes the Llama graph's interface the way other exporters do.
type modelVariant = build.Variant

// buildModelVariant writes the Llama graph for cfg with the interface changes of v.
func buildModelVariant(tb testing.TB, cfg *build.Config, seed int64, dir string, v modelVariant) build.Weights {
	tb.Helper()
	w := build.RandomWeights(cfg, seed)
	if err := build.BuildLlamaVariant(cfg, w, dir, v); err != nil {
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
