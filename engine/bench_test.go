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

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/build"
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

func benchModel(b *testing.B) *models.Runner {
	b.Helper()
	benchOnce.Do(func() {
		dir := tinyModelDir(b) // shares the temporary directory removed by TestMain
		cfgPath := filepath.Join(filepath.Dir(dir), "bench-config.json")
		if benchErr = os.WriteFile(cfgPath, []byte(benchModelConfig), 0o644); benchErr != nil {
			return
		}
		benchDir = filepath.Join(filepath.Dir(dir), "bench-model")
		_, benchErr = build.BuildRandom(cfgPath, benchDir, 7)
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	r, err := models.OpenRunner(benchDir, models.RunnerOptions{ORTLib: ortLib(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	return r
}

// contiguousKV is the baseline's cache: each sequence's past in one contiguous run per
// (layer, head), copied into and out of the runner's dense tensors like the paged cache.
type contiguousKV struct {
	heads, headDim, capTokens int
	k, v                      [][]byte // per layer: [rows][heads][capTokens][headDim] float32
	past, counts              []int
}

func newContiguousKV(spec models.Spec, rows, capTokens int) *contiguousKV {
	c := &contiguousKV{heads: spec.NumKVHeads, headDim: spec.HeadDim, capTokens: capTokens,
		past: make([]int, rows), counts: make([]int, rows)}
	for range spec.NumLayers {
		c.k = append(c.k, make([]byte, rows*spec.NumKVHeads*capTokens*spec.HeadDim*4))
		c.v = append(c.v, make([]byte, rows*spec.NumKVHeads*capTokens*spec.HeadDim*4))
	}
	return c
}

func (c *contiguousKV) GatherPast(k, v []models.DenseKV) error {
	row := c.headDim * 4
	for l := range k {
		t := k[l].Tokens
		for b := range k[l].Batch {
			for h := range c.heads {
				dst := ((b*c.heads + h) * t) * row
				src := ((b*c.heads + h) * c.capTokens) * row
				n := c.past[b] * row
				copy(k[l].Data[dst:dst+n], c.k[l][src:src+n])
				copy(v[l].Data[dst:dst+n], c.v[l][src:src+n])
				clear(k[l].Data[dst+n : dst+t*row])
				clear(v[l].Data[dst+n : dst+t*row])
			}
		}
	}
	return nil
}

func (c *contiguousKV) ScatterNew(k, v []models.DenseKV, newOffset int) error {
	row := c.headDim * 4
	for l := range k {
		t := k[l].Tokens
		for b := range k[l].Batch {
			for h := range c.heads {
				src := ((b*c.heads+h)*t + newOffset) * row
				dst := ((b*c.heads+h)*c.capTokens + c.past[b]) * row
				n := c.counts[b] * row
				copy(c.k[l][dst:dst+n], k[l].Data[src:src+n])
				copy(c.v[l][dst:dst+n], v[l].Data[src:src+n])
			}
		}
	}
	return nil
}

// BenchmarkEngineVsRunner compares the engine's decode throughput with the bare runner's
// on the same batch: 16 sequences with 128-token prompts decoding 64 tokens each (past
// 128..192). The baseline feeds the runner directly from a contiguous cache and takes
// the argmax; the engine adds scheduling, the paged cache, sampling, stop checks and
// events. Reported: tokens/s of each from the median decode step (engine steps are
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
		kv := newContiguousKV(spec, seqs, promptLen+decode+2)
		batch := &models.Batch{Seqs: make([]models.SeqInput, seqs)}
		for i := range batch.Seqs {
			batch.Seqs[i] = models.SeqInput{Tokens: prompts[i]}
			kv.counts[i] = promptLen
		}
		out, err := r.Forward(batch, kv)
		if err != nil {
			b.Fatal(err)
		}
		next := make([]int32, seqs)
		for i := range next {
			next[i] = argmax(out.Logits[i])
			kv.past[i], kv.counts[i] = promptLen, 1
		}
		var steps []time.Duration
		last := time.Now()
		for step := range decode + 1 {
			for i := range batch.Seqs {
				batch.Seqs[i] = models.SeqInput{Tokens: next[i : i+1], PastLen: kv.past[i]}
			}
			out, err := r.Forward(batch, kv)
			if err != nil {
				b.Fatal(err)
			}
			for i := range next {
				next[i] = argmax(out.Logits[i])
				kv.past[i]++
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

// nullModel returns constant logits and touches no K/V beyond the runner interface.
type nullModel struct {
	spec   models.Spec
	logits [][]float32
}

func (m *nullModel) Spec() models.Spec { return m.spec }

func (m *nullModel) Forward(b *models.Batch, kv models.KV) (*models.Output, error) {
	for len(m.logits) < len(b.Seqs) {
		row := make([]float32, m.spec.VocabSize)
		row[len(m.logits)%m.spec.VocabSize] = 1
		m.logits = append(m.logits, row)
	}
	return &models.Output{Logits: m.logits[:len(b.Seqs)]}, nil
}
