package models

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/models/build"
)

// benchModels are the random models the decode benchmarks run on.
var benchModels = []struct {
	name string
	cfg  *build.Config
}{
	{"5M", tinyConfigCtx(256, 4, 4, 2, 768, 4096, 1024)},
	{"50M", tinyConfigCtx(512, 8, 8, 4, 1536, 8192, 1024)},
}

func tinyConfigCtx(hidden, layers, heads, kvHeads, inter, vocab, ctx int) *build.Config {
	c := tinyConfig(hidden, layers, heads, kvHeads, inter, vocab, true)
	c.MaxPositionEmbeddings = ctx
	return c
}

// benchModelDir builds (once per config, cached under os.TempDir()) a random model and
// returns its directory; it skips the benchmark when the model cannot be built.
func benchModelDir(b *testing.B, cfg *build.Config) string {
	b.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	dir := filepath.Join(os.TempDir(), "conveyor-bench-models", hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, "model.onnx")); err == nil {
		return dir
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "building-")
	if err != nil {
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			b.Skipf("cannot create model cache: %v", err)
		}
		if tmp, err = os.MkdirTemp(filepath.Dir(dir), "building-"); err != nil {
			b.Skipf("cannot create model cache: %v", err)
		}
	}
	defer os.RemoveAll(tmp)
	if err := build.BuildLlamaONNX(cfg, build.RandomWeights(cfg, 1), tmp); err != nil {
		b.Skipf("cannot build the benchmark model: %v", err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "config.json"), raw, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp, dir); err != nil && !os.IsExist(err) {
		if _, statErr := os.Stat(filepath.Join(dir, "model.onnx")); statErr != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// staticKV leaves the past as the runner allocated it (zeros) and drops the new keys
// and values, so the benchmark measures the forward pass alone.
type staticKV struct{}

func (staticKV) GatherPast(k, v []DenseKV) error                { return nil }
func (staticKV) ScatterNew(k, v []DenseKV, newOffset int) error { return nil }

// BenchmarkDecodeStep times one decode step (one new token per row) for batches of
// sequences that all have the same past length.
func BenchmarkDecodeStep(b *testing.B) {
	for _, m := range benchModels {
		b.Run(m.name, func(b *testing.B) {
			dir := benchModelDir(b, m.cfg)
			r, err := OpenRunner(dir, RunnerOptions{ORTLib: testORTLib(b)})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			for _, past := range []int{128, 512} {
				for _, batch := range []int{1, 4, 16, 64} {
					b.Run(fmt.Sprintf("past%d/batch%d", past, batch), func(b *testing.B) {
						in := &Batch{Seqs: make([]SeqInput, batch)}
						for i := range in.Seqs {
							in.Seqs[i] = SeqInput{Tokens: []int32{int32(i % m.cfg.VocabSize)}, PastLen: past}
						}
						if _, err := r.Forward(in, staticKV{}); err != nil { // warm up, size buffers
							b.Fatal(err)
						}
						b.ResetTimer()
						start := time.Now()
						for i := 0; i < b.N; i++ {
							if _, err := r.Forward(in, staticKV{}); err != nil {
								b.Fatal(err)
							}
						}
						perStep := time.Since(start).Seconds() / float64(b.N)
						b.ReportMetric(perStep*1e3, "ms/step")
						b.ReportMetric(float64(batch)/perStep, "tokens/s")
					})
				}
			}
		})
	}
}
