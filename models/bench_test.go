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

	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/kernels"
	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// benchModels are the random models the decode benchmarks run on; with
// CONVEYOR_BENCH_05B=1 also Qwen2.5-0.5B's shape (models/testdata/qwen2-0.5b, ~25 s and
// 4 GB of disk per build, cached under os.TempDir()), and with CONVEYOR_BENCH_GEMMA3=1
// Gemma 3 1B's, windowed and all full.
var benchModels = func() []benchModel {
	ms := []benchModel{
		{"5M", tinyConfigCtx(256, 4, 4, 2, 768, 4096, 1024)},
		{"50M", tinyConfigCtx(512, 8, 8, 4, 1536, 8192, 4096)},
	}
	if os.Getenv("CONVEYOR_BENCH_05B") == "1" {
		cfg, err := convert.LoadConfig(filepath.Join("testdata", "qwen2-0.5b"))
		if err != nil {
			panic(err)
		}
		cfg.MaxPositionEmbeddings = 4096 // the rotary tables need no more for these pasts
		ms = append(ms, benchModel{"0.5B", cfg})
	}
	if os.Getenv("CONVEYOR_BENCH_GEMMA3") == "1" {
		// Gemma 3 1B's shape (models/testdata/gemma3-1b: 5 of every 6 layers see a
		// 512-token window), and the same shape with every layer full: the difference is
		// what the windows save.
		for _, full := range []bool{false, true} {
			cfg, err := convert.LoadConfig(filepath.Join("testdata", "gemma3-1b"))
			if err != nil {
				panic(err)
			}
			cfg.MaxPositionEmbeddings = 4096
			name := "gemma3-1B"
			if full {
				one := 1
				cfg.SlidingWindowPattern = &one
				name += "-full"
			}
			ms = append(ms, benchModel{name, cfg})
		}
	}
	return ms
}()

type benchModel struct {
	name string
	cfg  *convert.Config
}

func tinyConfigCtx(hidden, layers, heads, kvHeads, inter, vocab, ctx int) *convert.Config {
	c := tinyConfig(hidden, layers, heads, kvHeads, inter, vocab, true)
	c.MaxPositionEmbeddings = ctx
	return c
}

// benchModelDir builds (once per config and quantization, cached under os.TempDir()) a
// random model and returns its directory; it skips the benchmark when the model cannot
// be built.
func benchModelDir(b *testing.B, cfg *convert.Config, quantize string, stepKV convert.DType) string {
	b.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	q, err := convert.ParseQuantization(quantize)
	if err != nil {
		b.Fatal(err)
	}
	// The fields, not q's String (which names only the bit width): a change of scheme
	// must not reuse a model built with another.
	sum := sha256.Sum256(append(raw, fmt.Sprintf("bits %d block %d level %d int8 %s packed own_threads step kv %v format %d", q.Bits, q.BlockSize, q.AccuracyLevel, kernels.Int8OpName, stepKV, modeldir.StepFormat)...))
	dir := filepath.Join(os.TempDir(), "conveyor-bench-models", hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(filepath.Join(dir, "step", "step.json")); err == nil {
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
	cfgDir := b.TempDir()
	if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), raw, 0o644); err != nil {
		b.Fatal(err)
	}
	if _, err := convert.BuildRandom(filepath.Join(cfgDir, "config.json"), tmp, 1, convert.Options{Quantize: q, StepKVDType: stepKV}); err != nil {
		b.Skipf("cannot build the benchmark model: %v", err)
	}
	if err := os.Rename(tmp, dir); err != nil && !os.IsExist(err) {
		if _, statErr := os.Stat(filepath.Join(dir, "step", "step.json")); statErr != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// BenchmarkDecodeStep times one decode step (one new token per row) on the step graph,
// for batches of sequences that all have the same past length, each in its own randomly
// placed blocks.
func BenchmarkDecodeStep(b *testing.B) { benchDecode(b, benchOptions{attention: AttentionGraph}) }

// BenchmarkDecodeStepDense is BenchmarkDecodeStep on the dense Optimum path, over the
// same kind of cache: the step includes gathering every row's past out of its blocks
// and scattering the new keys and values back.
func BenchmarkDecodeStepDense(b *testing.B) { benchDecode(b, benchOptions{attention: AttentionDense}) }

// BenchmarkDecodeStepFloat16 is BenchmarkDecodeStep with a float16 KV cache (the serving
// default).
func BenchmarkDecodeStepFloat16(b *testing.B) {
	benchDecode(b, benchOptions{attention: AttentionGraph, kvDType: "float16"})
}

// BenchmarkDecodeStepInt8 is BenchmarkDecodeStep with int8 weights (build-model
// --quantize int8).
func BenchmarkDecodeStepInt8(b *testing.B) {
	benchDecode(b, benchOptions{attention: AttentionGraph, quantize: "int8"})
}

// BenchmarkDecodeStepInt8Float16 is BenchmarkDecodeStepInt8 with a float16 KV cache.
func BenchmarkDecodeStepInt8Float16(b *testing.B) {
	benchDecode(b, benchOptions{attention: AttentionGraph, quantize: "int8", kvDType: "float16"})
}

// BenchmarkDecodeStepInt4 is BenchmarkDecodeStep with int4 weights.
func BenchmarkDecodeStepInt4(b *testing.B) {
	benchDecode(b, benchOptions{attention: AttentionGraph, quantize: "int4"})
}

// benchOptions choose the model variant a benchmark runs.
type benchOptions struct {
	attention, kvDType, quantize string
}

func benchDecode(b *testing.B, o benchOptions) {
	for _, m := range benchModels {
		b.Run(m.name, func(b *testing.B) {
			r := openBenchModel(b, m.cfg, o)
			for _, past := range []int{128, 512, 2048} {
				if past >= m.cfg.MaxPositionEmbeddings {
					continue
				}
				for _, batch := range []int{1, 16, 64} {
					b.Run(fmt.Sprintf("past%d/batch%d", past, batch), func(b *testing.B) {
						tokens := make([][]int32, batch)
						lens := make([]int, batch)
						for i := range tokens {
							tokens[i], lens[i] = []int32{int32(i % m.cfg.VocabSize)}, past
						}
						timeSteps(b, r, benchBatch(r.Spec(), tokens, lens), batch)
					})
				}
			}
		})
	}
}

// BenchmarkPrefill times one prompt of 128 to 2048 tokens with no past, on both paths.
func BenchmarkPrefill(b *testing.B) {
	benchPrefill(b, "", []string{AttentionGraph, AttentionDense})
}

// BenchmarkPrefillInt8 is BenchmarkPrefill with int8 weights, on the step graph.
func BenchmarkPrefillInt8(b *testing.B) {
	benchPrefill(b, "int8", []string{AttentionGraph})
}

func benchPrefill(b *testing.B, quantize string, paths []string) {
	for _, m := range benchModels {
		b.Run(m.name, func(b *testing.B) {
			for _, attention := range paths {
				b.Run(attention, func(b *testing.B) {
					r := openBenchModel(b, m.cfg, benchOptions{attention: attention, quantize: quantize})
					for _, n := range []int{128, 512, 2048} {
						if n > m.cfg.MaxPositionEmbeddings {
							continue
						}
						b.Run(fmt.Sprintf("tokens%d", n), func(b *testing.B) {
							timeSteps(b, r, benchBatch(r.Spec(), [][]int32{randTokens(1, n, m.cfg.VocabSize)}, []int{0}), n)
						})
					}
				})
			}
		})
	}
}

func openBenchModel(b *testing.B, cfg *convert.Config, o benchOptions) Model {
	stepKV := convert.Float32
	if o.attention == AttentionGraph && o.kvDType == "float16" {
		stepKV = convert.Float16 // the step graph's cache type is built in
	}
	dir := benchModelDir(b, cfg, o.quantize, stepKV)
	r, err := Open(dir, RunnerOptions{ORTLib: testORTLib(b), Attention: o.attention, KVCacheDType: o.kvDType})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Close() })
	return r
}

// benchBatch returns a batch of the given rows over a cache where every row's past
// sits in its own randomly placed blocks.
func benchBatch(spec Spec, tokens [][]int32, past []int) *Batch {
	const bs = 16
	blocks := 0
	seqs := make([]int, len(tokens))
	for i := range tokens {
		blocks += (past[i]+len(tokens[i]))/bs + 1
		seqs[i] = i
	}
	kv := newTestCache(spec, len(tokens), blocks, bs, 1)
	for i := range tokens {
		kv.lens[i] = past[i]
		for len(kv.tables[i])*bs < past[i] {
			kv.tables[i] = append(kv.tables[i], kv.free[0])
			kv.free = kv.free[1:]
		}
	}
	return kv.batch(seqs, tokens, false)
}

// timeSteps runs in through r b.N times after a warm-up and reports ms/step and
// tokens/s for tokensPerStep tokens a step.
func timeSteps(b *testing.B, r Model, in *Batch, tokensPerStep int) {
	if _, err := r.Forward(in); err != nil { // warm up, size buffers, touch the arenas
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := r.Forward(in); err != nil {
			b.Fatal(err)
		}
	}
	perStep := time.Since(start).Seconds() / float64(b.N)
	b.ReportMetric(perStep*1e3, "ms/step")
	b.ReportMetric(float64(tokensPerStep)/perStep, "tokens/s")
}

// BenchmarkVerifyStepInt8 times the step a speculating row brings at one stream — its
// last token and 4 proposals, with the logits of all 5 positions — against a plain
// decode step of one token, on the int8 step graph at past 128 (the ratio is what
// verification costs: at most 1.3x makes it nearly free).
func BenchmarkVerifyStepInt8(b *testing.B) {
	for _, m := range benchModels {
		b.Run(m.name, func(b *testing.B) {
			for _, attention := range []string{AttentionGraph} {
				r := openBenchModel(b, m.cfg, benchOptions{attention: attention, quantize: "int8"})
				for _, n := range []int{1, 5} {
					b.Run(fmt.Sprintf("%s/tokens%d", attention, n), func(b *testing.B) {
						in := benchBatch(r.Spec(), [][]int32{randTokens(1, n, m.cfg.VocabSize)}, []int{128})
						in.Seqs[0].AllLogits = n > 1
						in.Seqs[0].ArgmaxOnly = n == 1
						timeSteps(b, r, in, n)
					})
				}
			}
		})
	}
}
