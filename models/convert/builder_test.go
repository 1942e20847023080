package convert

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/modeldir"
	"github.com/conveyor-llm/conveyor/models/ort"
)

// builderTestInitORT loads ONNX Runtime for the builder's tests: $CONVEYOR_ORT_LIB, or
// .ort/libonnxruntime.so.1 next to go.mod. A missing library fails the test.
func builderTestInitORT(t testing.TB) {
	t.Helper()
	lib := os.Getenv(models.ORTLibEnv)
	if lib == "" {
		dir, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				lib = filepath.Join(dir, ".ort", "libonnxruntime.so.1")
				break
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				t.Fatal("go.mod not found above the test directory; set CONVEYOR_ORT_LIB")
			}
			dir = parent
		}
	}
	if _, err := os.Stat(lib); err != nil {
		t.Fatalf("ONNX Runtime library %s is missing: run `make ort` (or set %s)", lib, models.ORTLibEnv)
	}
	if err := models.InitORT(lib); err != nil {
		t.Fatalf("models.InitORT(%s): %v", lib, err)
	}
}

// builderTestTensor is a float32 output of builderTestSession.run.
type builderTestTensor struct {
	shape []int64
	data  []float32
}

// builderTestSession runs a model file through ONNX Runtime with named inputs.
type builderTestSession struct {
	s       *ort.Session
	inNames []string
	outs    []string
}

func openBuilderTestSession(t testing.TB, path string, inNames, outNames []string) *builderTestSession {
	t.Helper()
	builderTestInitORT(t)
	s, err := ort.NewSession(path, ort.SessionConfig{Threads: 1})
	if err != nil {
		t.Fatalf("ONNX Runtime rejects %s: %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return &builderTestSession{s: s, inNames: inNames, outs: outNames}
}

// run feeds inputs (in inNames order) and returns the float32 outputs, of outShapes (in
// the outputs' order): ONNX Runtime fails a run whose outputs come out in other shapes.
// It releases the inputs.
func (bs *builderTestSession) run(t testing.TB, inputs []*ort.Value, outShapes ...[]int64) []builderTestTensor {
	t.Helper()
	if len(outShapes) != len(bs.outs) {
		t.Fatalf("%d output shapes for %d outputs", len(outShapes), len(bs.outs))
	}
	res := make([]builderTestTensor, len(bs.outs))
	outputs := make([]*ort.Value, len(bs.outs))
	for i, shape := range outShapes {
		n := 1
		for _, d := range shape {
			n *= int(d)
		}
		res[i] = builderTestTensor{shape: shape, data: make([]float32, n)}
		outputs[i] = mustTensor(t, shape, res[i].data)
	}
	err := bs.s.Run(bs.inNames, inputs, bs.outs, outputs)
	for _, vs := range [][]*ort.Value{inputs, outputs} {
		for _, v := range vs {
			v.Release()
		}
	}
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

// mustTensor wraps data as a tensor of shape (no copy).
func mustTensor[T float32 | int64](t testing.TB, shape []int64, data []T) *ort.Value {
	t.Helper()
	elem := ort.Float32
	if _, ok := any(data).([]int64); ok {
		elem = ort.Int64
	}
	var p unsafe.Pointer
	if len(data) > 0 {
		p = unsafe.Pointer(&data[0])
	}
	v, err := ort.NewHostTensor(elem, shape, p, len(data)*int(unsafe.Sizeof(data[0])))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// tinyTestConfig is a small grouped-query Llama config.
func tinyTestConfig() *Config {
	bos := int32(1)
	return &Config{
		ModelType: "llama", VocabSize: 128, HiddenSize: 64, IntermediateSize: 128,
		NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2,
		RMSNormEps: 1e-5, RopeTheta: 10000, MaxPositionEmbeddings: 256,
		TieWordEmbeddings: true, BOSTokenID: &bos, EOSTokenID: modeldir.TokenIDs{2},
	}
}

// llamaSessionIO lists a decoder's input and output names.
func llamaSessionIO(layers int) (ins, outs []string) {
	ins = []string{InputIDsName, AttentionMaskName, PositionIDsName}
	outs = []string{LogitsName}
	for i := 0; i < layers; i++ {
		ins = append(ins, PastKeyName(i), PastValueName(i))
		outs = append(outs, PresentKeyName(i), PresentValueName(i))
	}
	return ins, outs
}

// llamaRun runs one decoder pass; past[l] is layer l's [K, V] flat data with pastLen
// tokens per (batch, head).
func llamaRun(t testing.TB, s *builderTestSession, cfg *Config, ids, mask, pos [][]int64, pastLen int, past [][2][]float32) []builderTestTensor {
	t.Helper()
	B, S, T := len(ids), len(ids[0]), len(mask[0])
	flat := func(rows [][]int64) []int64 {
		var out []int64
		for _, r := range rows {
			out = append(out, r...)
		}
		return out
	}
	inputs := []*ort.Value{
		mustTensor(t, []int64{int64(B), int64(S)}, flat(ids)),
		mustTensor(t, []int64{int64(B), int64(T)}, flat(mask)),
		mustTensor(t, []int64{int64(B), int64(S)}, flat(pos)),
	}
	kvShape := []int64{int64(B), int64(cfg.KVHeads()), int64(pastLen), int64(cfg.HeadDimOrDefault())}
	n := B * cfg.KVHeads() * pastLen * cfg.HeadDimOrDefault()
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		for j := 0; j < 2; j++ {
			data := make([]float32, n)
			if past != nil {
				copy(data, past[l][j])
			}
			inputs = append(inputs, mustTensor(t, kvShape, data))
		}
	}
	// logits [B, S, vocab], then every layer's present key and value [B, kv, T, hd].
	outShapes := [][]int64{{int64(B), int64(S), int64(cfg.VocabSize)}}
	presentShape := []int64{int64(B), int64(cfg.KVHeads()), int64(T), int64(cfg.HeadDimOrDefault())}
	for range 2 * cfg.NumHiddenLayers {
		outShapes = append(outShapes, presentShape)
	}
	return s.run(t, inputs, outShapes...)
}

func TestBuildTinyLlamaLoadsAndRuns(t *testing.T) {
	cfg := tinyTestConfig()
	dir := t.TempDir()
	if err := BuildLlamaONNX(cfg, RandomWeights(cfg, 1), dir); err != nil {
		t.Fatal(err)
	}
	ins, outs := llamaSessionIO(cfg.NumHiddenLayers)
	s := openBuilderTestSession(t, filepath.Join(dir, "model.onnx"), ins, outs)
	ids := [][]int64{{1, 5, 9}, {1, 7, 0}}
	mask := [][]int64{{1, 1, 1}, {1, 1, 0}}
	pos := [][]int64{{0, 1, 2}, {0, 1, 0}}
	res := llamaRun(t, s, cfg, ids, mask, pos, 0, nil)
	logits := res[0]
	if want := []int64{2, 3, 128}; !equalInt64s(logits.shape, want) {
		t.Fatalf("logits shape %v, want %v", logits.shape, want)
	}
	var sumAbs float64
	for i, v := range logits.data {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("logit %d is %v", i, v)
		}
		sumAbs += math.Abs(float64(v))
	}
	if sumAbs/float64(len(logits.data)) < 0.1 {
		t.Fatalf("logits are nearly zero (mean |x| %g)", sumAbs/float64(len(logits.data)))
	}
	for i, p := range res[1:] {
		if want := []int64{2, 2, 3, 16}; !equalInt64s(p.shape, want) {
			t.Fatalf("present %d shape %v, want %v", i, p.shape, want)
		}
	}
}

func equalInt64s(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// buildTinySession builds cfg with seed-1 random weights into a temp dir and opens it.
func buildTinySession(t *testing.T, cfg *Config, opts writeOptions) (*builderTestSession, string) {
	t.Helper()
	dir := t.TempDir()
	if err := buildLlamaONNX(cfg, RandomWeights(cfg, 1), dir, opts); err != nil {
		t.Fatal(err)
	}
	ins, outs := llamaSessionIO(cfg.NumHiddenLayers)
	return openBuilderTestSession(t, filepath.Join(dir, "model.onnx"), ins, outs), dir
}

// maxAbsDiff compares a[ao:ao+n] with b[bo:bo+n].
func maxAbsDiff(a []float32, ao int, b []float32, bo int, n int) float64 {
	var m float64
	for i := 0; i < n; i++ {
		m = math.Max(m, math.Abs(float64(a[ao+i])-float64(b[bo+i])))
	}
	return m
}

func allFinite(xs []float32) bool {
	for _, v := range xs {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return false
		}
	}
	return true
}

// TestBuildLlamaPaddingInvariance runs a sequence alone and inside a batch where it is
// right-padded, sits next to a longer row and a row that is all padding: its logits and
// new keys/values must not change, and nothing may become NaN.
func TestBuildLlamaPaddingInvariance(t *testing.T) {
	cfg := tinyTestConfig()
	s, _ := buildTinySession(t, cfg, writeOptions{})
	V := cfg.VocabSize
	alone := llamaRun(t, s, cfg, [][]int64{{1, 40, 41}}, [][]int64{{1, 1, 1}}, [][]int64{{0, 1, 2}}, 0, nil)
	batch := llamaRun(t, s, cfg,
		[][]int64{{1, 9, 8, 7, 6}, {1, 40, 41, 0, 0}, {0, 0, 0, 0, 0}},
		[][]int64{{1, 1, 1, 1, 1}, {1, 1, 1, 0, 0}, {0, 0, 0, 0, 0}},
		[][]int64{{0, 1, 2, 3, 4}, {0, 1, 2, 0, 0}, {0, 0, 0, 0, 0}}, 0, nil)
	if d := maxAbsDiff(alone[0].data, 0, batch[0].data, 5*V, 3*V); d > 1e-4 {
		t.Errorf("logits of a padded row differ from the row alone by %g", d)
	}
	for _, o := range batch {
		if !allFinite(o.data) {
			t.Fatal("padding produced NaN or Inf")
		}
	}
	// present.0.key: [3, kv, 5, hd]; row 1's first 3 columns match the row alone.
	kv, hd := cfg.KVHeads(), cfg.HeadDimOrDefault()
	for h := 0; h < kv; h++ {
		if d := maxAbsDiff(alone[1].data, h*3*hd, batch[1].data, (kv+h)*5*hd, 3*hd); d > 1e-5 {
			t.Errorf("present key of head %d differs by %g", h, d)
		}
	}
}

// TestBuildLlamaDecodeMatchesPrefill checks the past_key_values path: feeding a prompt
// in two passes (the second with the first's present as past, padded with garbage
// beyond a shorter row's past) gives the same logits as one pass.
func TestBuildLlamaDecodeMatchesPrefill(t *testing.T) {
	cfg := tinyTestConfig()
	s, _ := buildTinySession(t, cfg, writeOptions{})
	V, L := cfg.VocabSize, cfg.NumHiddenLayers
	kv, hd := cfg.KVHeads(), cfg.HeadDimOrDefault()
	full := llamaRun(t, s, cfg, [][]int64{{1, 50, 60, 70, 80}}, [][]int64{{1, 1, 1, 1, 1}}, [][]int64{{0, 1, 2, 3, 4}}, 0, nil)
	first := llamaRun(t, s, cfg, [][]int64{{1, 50, 60}}, [][]int64{{1, 1, 1}}, [][]int64{{0, 1, 2}}, 0, nil)
	shortFirst := llamaRun(t, s, cfg, [][]int64{{1, 50}}, [][]int64{{1, 1}}, [][]int64{{0, 1}}, 0, nil)

	// Batch of two rows with past 3: row 0 has past 3 (tokens 1,50,60) and feeds 70,80;
	// row 1 has past 2 (1,50; its third past column is garbage, masked) and feeds 60.
	past := make([][2][]float32, L)
	for l := 0; l < L; l++ {
		for j := 0; j < 2; j++ {
			buf := make([]float32, 2*kv*3*hd)
			for i := range buf {
				buf[i] = 1e3 // garbage where the mask hides it
			}
			for h := 0; h < kv; h++ {
				copy(buf[h*3*hd:(h+1)*3*hd], first[1+2*l+j].data[h*3*hd:(h+1)*3*hd])
				copy(buf[(kv+h)*3*hd:(kv+h)*3*hd+2*hd], shortFirst[1+2*l+j].data[h*2*hd:(h+1)*2*hd])
			}
			past[l][j] = buf
		}
	}
	step := llamaRun(t, s, cfg,
		[][]int64{{70, 80}, {60, 0}},
		[][]int64{{1, 1, 1, 1, 1}, {1, 1, 0, 1, 0}},
		[][]int64{{3, 4}, {2, 0}}, 3, past)
	if d := maxAbsDiff(full[0].data, 3*V, step[0].data, 0, 2*V); d > 1e-4 {
		t.Errorf("row 0: decode logits differ from prefill by %g", d)
	}
	if d := maxAbsDiff(full[0].data, 2*V, step[0].data, 2*V, V); d > 1e-4 {
		t.Errorf("row 1 (shorter past, masked hole): logits differ from prefill by %g", d)
	}
	if !allFinite(step[0].data) {
		t.Error("NaN or Inf in logits")
	}
	// present = Concat(past, new): the past columns come back unchanged.
	if d := maxAbsDiff(step[1].data, 0, past[0][0], 0, 3*hd); d != 0 {
		t.Errorf("present.0.key does not start with the past (diff %g)", d)
	}
}

func TestBuildLlamaUntiedAndExternal(t *testing.T) {
	cfg := tinyTestConfig()
	cfg.TieWordEmbeddings = false
	inline, _ := buildTinySession(t, cfg, writeOptions{})
	external, dir := buildTinySession(t, cfg, writeOptions{externalAboveBytes: -1})
	if _, err := os.Stat(filepath.Join(dir, "model.onnx.data")); err != nil {
		t.Fatalf("no external data file: %v", err)
	}
	ids, mask, pos := [][]int64{{1, 2, 3}}, [][]int64{{1, 1, 1}}, [][]int64{{0, 1, 2}}
	a := llamaRun(t, inline, cfg, ids, mask, pos, 0, nil)
	b := llamaRun(t, external, cfg, ids, mask, pos, 0, nil)
	if d := maxAbsDiff(a[0].data, 0, b[0].data, 0, len(a[0].data)); d != 0 {
		t.Errorf("external-data model differs from inline by %g", d)
	}
}

func TestBuildLlamaRejectsBadWeights(t *testing.T) {
	cfg := tinyTestConfig()
	for _, tc := range []struct {
		name   string
		modify func(Weights, *Config)
		sub    string
	}{
		{"missing", func(w Weights, c *Config) { delete(w, "model.layers.1.mlp.up_proj.weight") }, "model.layers.1.mlp.up_proj.weight is missing"},
		{"wrong shape", func(w Weights, c *Config) { w["model.norm.weight"].Shape = []int{63} }, "shape"},
		{"short data", func(w Weights, c *Config) {
			w["model.norm.weight"].Data = w["model.norm.weight"].Data[:10]
		}, "values"},
		{"bias", func(w Weights, c *Config) {
			w["model.layers.0.self_attn.q_proj.bias"] = &Tensor{Shape: []int{64}, Data: make([]float32, 64)}
		}, "bias"},
		{"untied without lm_head", func(w Weights, c *Config) { c.TieWordEmbeddings = false }, "lm_head"},
		{"rope scaling", func(w Weights, c *Config) { c.RopeScaling = []byte(`{"type":"llama3"}`) }, "rope_scaling"},
		{"invalid config", func(w Weights, c *Config) { c.NumKeyValueHeads = 3 }, "num_key_value_heads"},
	} {
		c := *cfg
		w := RandomWeights(cfg, 1)
		tc.modify(w, &c)
		err := BuildLlamaONNX(&c, w, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), tc.sub) {
			t.Errorf("%s: want error mentioning %q, got %v", tc.name, tc.sub, err)
		}
	}
}

func TestRandomWeightsDeterministic(t *testing.T) {
	cfg := tinyTestConfig()
	a, b, c := RandomWeights(cfg, 7), RandomWeights(cfg, 7), RandomWeights(cfg, 8)
	fa, fb, fc := flattenWeights(a), flattenWeights(b), flattenWeights(c)
	if maxAbsDiff(fa, 0, fb, 0, len(fa)) != 0 {
		t.Error("same seed gave different weights")
	}
	if maxAbsDiff(fa, 0, fc, 0, len(fa)) == 0 {
		t.Error("different seeds gave the same weights")
	}
	norm := a["model.layers.0.input_layernorm.weight"].Data
	var mean float64
	for _, v := range norm {
		mean += float64(v) / float64(len(norm))
	}
	if math.Abs(mean-1) > 0.1 {
		t.Errorf("norm weights average %g, want near 1", mean)
	}
}

func TestBuildFromHFAndRandomDirs(t *testing.T) {
	cfg := tinyTestConfig()
	hf := t.TempDir()
	cfgJSON := `{"model_type":"llama","vocab_size":128,"hidden_size":64,"intermediate_size":128,
		"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"rms_norm_eps":1e-5,
		"rope_theta":10000,"max_position_embeddings":256,"tie_word_embeddings":true,"bos_token_id":1,"eos_token_id":[2]}`
	writeTestFile(t, hf, "config.json", cfgJSON)
	writeTestFile(t, hf, "tokenizer.json", `{"model":{}}`)
	w := RandomWeights(cfg, 5)
	if err := WriteSafetensors(filepath.Join(hf, "model.safetensors"), w, Float32); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	res, err := BuildFromHF(hf, out, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Params != cfg.NumParams() || len(res.Files) != 4 {
		t.Errorf("result %+v", res)
	}
	for _, name := range []string{"model.onnx", "step/step.json", "step/step.onnx", "config.json", "tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Errorf("%s not written: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "generation_config.json")); !os.IsNotExist(err) {
		t.Errorf("generation_config.json should not appear from nowhere: %v", err)
	}
	// The model built from the checkpoint is the model built from the same weights directly.
	direct := t.TempDir()
	if err := BuildLlamaONNX(cfg, w, direct); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(out, "model.onnx"))
	b, _ := os.ReadFile(filepath.Join(direct, "model.onnx"))
	if !bytes.Equal(a, b) {
		t.Error("BuildFromHF wrote a different model.onnx than BuildLlamaONNX with the same weights")
	}

	// BuildRandom with the fixture copies the tokenizer files next to the config.
	rnd := t.TempDir()
	res, err = BuildRandom(filepath.Join("..", "testdata", "tiny-llama", "config.json"), rnd, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"model.onnx", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
		if _, err := os.Stat(filepath.Join(rnd, name)); err != nil {
			t.Errorf("BuildRandom: %s not written: %v", name, err)
		}
	}
	if _, err := BuildRandom(filepath.Join(hf, "nope.json"), rnd, 1, Options{}); err == nil {
		t.Error("missing config: no error")
	}
}

// BenchmarkBuildRandomModel times BuildLlamaONNX plus RandomWeights for a ~30M-parameter
// model (hidden 512, 8 layers, 8 heads, 4 KV heads, intermediate 1536, vocab 8192).
func BenchmarkBuildRandomModel(b *testing.B) {
	bos := int32(1)
	cfg := &Config{ModelType: "llama", VocabSize: 8192, HiddenSize: 512, IntermediateSize: 1536,
		NumHiddenLayers: 8, NumAttentionHeads: 8, NumKeyValueHeads: 4, RMSNormEps: 1e-5,
		MaxPositionEmbeddings: 2048, TieWordEmbeddings: true, BOSTokenID: &bos, EOSTokenID: modeldir.TokenIDs{2}}
	dir := b.TempDir()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := BuildLlamaONNX(cfg, RandomWeights(cfg, int64(i)), dir); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cfg.NumParams())/1e6, "Mparams")
}
