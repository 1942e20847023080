package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
)

// benchModelConfig is a small random Llama (~5M parameters): big enough that a step
// costs milliseconds, small enough to build in a second.
const benchModelConfig = `{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 688,
  "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
  "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"
}`

var (
	benchOnce sync.Once
	benchDir  string
	benchErr  error
)

func benchModel(b *testing.B) *models.DenseRunner {
	b.Helper()
	benchOnce.Do(func() {
		dir := tinyModelDir(b) // shares the temporary directory removed by TestMain
		cfgPath := filepath.Join(filepath.Dir(dir), "bench-config.json")
		if benchErr = os.WriteFile(cfgPath, []byte(benchModelConfig), 0o644); benchErr != nil {
			return
		}
		benchDir = filepath.Join(filepath.Dir(dir), "bench-model")
		_, benchErr = convert.BuildRandom(cfgPath, benchDir, 7, convert.Options{})
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	r, err := models.OpenDense(benchDir, models.RunnerOptions{ORTLib: ortLib(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	return r
}

// contiguousCache is the baseline's cache: a kvcache.Storage in which each of rows
// sequences has capTokens positions of consecutive blocks, which the runner reads and
// writes as it does the engine's.
func contiguousCache(b *testing.B, spec models.Spec, rows, capTokens int) (*kvcache.Storage, [][]kvcache.BlockID) {
	const blockSize = 16
	perRow := (capTokens + blockSize - 1) / blockSize
	dt, err := kvDType(spec.KVDType)
	if err != nil {
		b.Fatal(err)
	}
	st, err := kvcache.NewStorage(kvcache.StorageConfig{NumBlocks: rows * perRow, BlockSizeTokens: blockSize,
		Layers: spec.NumLayers, KVHeads: spec.NumKVHeads, HeadDim: spec.HeadDim, DType: dt,
		Parallelism: DefaultConfig().StorageParallelism})
	if err != nil {
		b.Fatal(err)
	}
	tables := make([][]kvcache.BlockID, rows)
	for i := range tables {
		for j := range perRow {
			tables[i] = append(tables[i], kvcache.BlockID(i*perRow+j))
		}
	}
	return st, tables
}

// BenchmarkEngineVsRunner compares the engine's decode throughput with the bare runner's
// on the same batch: 16 sequences with 128-token prompts decoding 64 tokens each (past
// 128..192). The baseline feeds the runner directly, each sequence's past in
// consecutive blocks (contiguousCache), and takes the argmax; the engine adds scheduling,
// the block pool, sampling, stop checks and events. Reported: tokens/s of each from the median decode step (engine steps are
// whole loop iterations, end to end) and their ratio.
func BenchmarkEngineVsRunner(b *testing.B) {
	const seqs, promptLen, decode = 16, 128, 64
	r := benchModel(b)
	spec := r.Spec()
	prompts := make([][]int32, seqs)
	for i := range prompts {
		prompts[i] = make([]int32, promptLen)
		for j := range prompts[i] {
			prompts[i][j] = int32(3 + (i*131+j*17)%(spec.VocabSize-3))
		}
	}

	runner := func() []time.Duration {
		cache, tables := contiguousCache(b, spec, seqs, promptLen+decode+2)
		batch := &models.Batch{Seqs: make([]models.SeqInput, seqs), Cache: cache}
		for i := range batch.Seqs {
			batch.Seqs[i] = models.SeqInput{Tokens: prompts[i], Blocks: tables[i]}
		}
		out, err := r.Forward(batch)
		if err != nil {
			b.Fatal(err)
		}
		next := make([]int32, seqs)
		past := make([]int, seqs)
		for i := range next {
			next[i] = argmax(out.Logits[i])
			past[i] = promptLen
		}
		var steps []time.Duration
		last := time.Now()
		for step := range decode + 1 {
			for i := range batch.Seqs {
				batch.Seqs[i] = models.SeqInput{Tokens: next[i : i+1], PastLen: past[i], Blocks: tables[i]}
			}
			out, err := r.Forward(batch)
			if err != nil {
				b.Fatal(err)
			}
			for i := range next {
				next[i] = argmax(out.Logits[i])
				past[i]++
			}
			now := time.Now()
			if step > 0 { // like the engine's: the first decode step is not counted
				steps = append(steps, now.Sub(last))
			}
			last = now
		}
		return steps
	}

	engine := func() []time.Duration {
		cfg := DefaultConfig()
		cfg.MaxNumSeqs = seqs
		cfg.MaxNumBatchedTokens = seqs * promptLen
		cfg.KVCacheBytes = 64 << 20
		cfg.EnablePrefixCaching = false
		var stepEnds []time.Time
		cfg.OnStep = func(s StepInfo) {
			if s.NumTokens == seqs { // a pure decode step
				stepEnds = append(stepEnds, time.Now())
			}
		}
		e, err := New(cfg, r, nil)
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range seqs {
			req := greedyRequest(fmt.Sprint(i), prompts[i], decode+2)
			req.Params.IgnoreEOS = true
			ch, err := e.Submit(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range ch {
				}
			}()
		}
		e.Start(context.Background()) // every request queued: the first step prefills them all
		wg.Wait()
		if err := e.Shutdown(context.Background()); err != nil {
			b.Fatal(err)
		}
		// decode+1 decode steps; the first one's end starts the clock, leaving decode
		// full iterations (schedule, gather, forward, scatter, sample, events) timed.
		if len(stepEnds) != decode+1 {
			b.Fatalf("%d decode steps, want %d", len(stepEnds), decode+1)
		}
		steps := make([]time.Duration, decode)
		for i := range steps {
			steps[i] = stepEnds[i+1].Sub(stepEnds[i])
		}
		return steps
	}

	// The machine is shared: medians of per-step times resist interference better than
	// totals, so the ratio uses them.
	var stepsRunner, stepsEngine []time.Duration
	for b.Loop() {
		stepsRunner = append(stepsRunner, runner()...)
		stepsEngine = append(stepsEngine, engine()...)
	}
	runnerTPS := seqs / median(stepsRunner).Seconds()
	engineTPS := seqs / median(stepsEngine).Seconds()
	b.ReportMetric(runnerTPS, "runner_tok/s")
	b.ReportMetric(engineTPS, "engine_tok/s")
	b.ReportMetric(engineTPS/runnerTPS, "engine/runner")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkEngineStepOverhead measures everything the engine does around a forward pass
// (scheduling, greedy sampling over a 32000-token vocabulary, stop checks, events) with a
// model that costs nothing: 64 sequences decoding, one step per b.N.
func BenchmarkEngineStepOverhead(b *testing.B) {
	const seqs = 64
	m := &nullModel{spec: models.Spec{NumLayers: 1, NumKVHeads: 1, HeadDim: 1, VocabSize: 32000,
		MaxPositions: 1 << 20, KVDType: models.Float32, BOSTokenID: -1}}
	cfg := DefaultConfig()
	cfg.MaxNumSeqs = seqs
	cfg.KVCacheBytes = 8 << 20 // 8 bytes per token: a million tokens
	e, err := newEngine(cfg, m, nil)
	if err != nil {
		b.Fatal(err)
	}
	e.Start(context.Background())
	defer e.Close()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range seqs {
		req := greedyRequest(fmt.Sprint(i), []int32{int32(i + 1)}, b.N+1)
		req.Params.IgnoreEOS = true
		ch, err := e.Submit(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range ch {
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/step")
}

// nullModel returns constant logits and touches no K/V.
type nullModel struct {
	spec   models.Spec
	logits [][]float32
}

func (m *nullModel) Spec() models.Spec { return m.spec }
func (m *nullModel) Close() error      { return nil }

func (m *nullModel) Forward(b *models.Batch) (*models.Output, error) {
	for len(m.logits) < len(b.Seqs) {
		row := make([]float32, m.spec.VocabSize)
		row[len(m.logits)%m.spec.VocabSize] = 1
		m.logits = append(m.logits, row)
	}
	return &models.Output{Logits: m.logits[:len(b.Seqs)]}, nil
}
