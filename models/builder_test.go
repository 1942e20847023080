package models

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	ort "github.com/yalue/onnxruntime_go"
)

// builderTestInitORT loads ONNX Runtime for the builder's tests: $CONVEYOR_ORT_LIB, or
// .ort/libonnxruntime.so.1 next to go.mod. A missing library fails the test.
func builderTestInitORT(t testing.TB) {
	t.Helper()
	lib := os.Getenv(ORTLibEnv)
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
		t.Fatalf("ONNX Runtime library %s is missing: run `make ort` (or set %s)", lib, ORTLibEnv)
	}
	if err := InitORT(lib); err != nil {
		t.Fatalf("InitORT(%s): %v", lib, err)
	}
}

// builderTestTensor is a float32 output of builderTestRun.
type builderTestTensor struct {
	shape []int64
	data  []float32
}

// builderTestSession runs a model file through ONNX Runtime with named inputs.
type builderTestSession struct {
	s       *ort.DynamicAdvancedSession
	inNames []string
	outs    []string
}

func openBuilderTestSession(t testing.TB, path string, inNames, outNames []string) *builderTestSession {
	t.Helper()
	builderTestInitORT(t)
	so, err := ort.NewSessionOptions()
	if err != nil {
		t.Fatal(err)
	}
	defer so.Destroy()
	if err := so.SetIntraOpNumThreads(1); err != nil {
		t.Fatal(err)
	}
	s, err := ort.NewDynamicAdvancedSession(path, inNames, outNames, so)
	if err != nil {
		t.Fatalf("ONNX Runtime rejects %s: %v", path, err)
	}
	t.Cleanup(func() { s.Destroy() })
	return &builderTestSession{s: s, inNames: inNames, outs: outNames}
}

// run feeds inputs (ort values in inNames order) and returns the float32 outputs.
func (bs *builderTestSession) run(t testing.TB, inputs []ort.Value) []builderTestTensor {
	t.Helper()
	outputs := make([]ort.Value, len(bs.outs))
	if err := bs.s.Run(inputs, outputs); err != nil {
		t.Fatalf("Run: %v", err)
	}
	res := make([]builderTestTensor, len(outputs))
	for i, o := range outputs {
		ft, ok := o.(*ort.Tensor[float32])
		if !ok {
			t.Fatalf("output %s is %T, want float32 tensor", bs.outs[i], o)
		}
		res[i] = builderTestTensor{shape: append([]int64(nil), ft.GetShape()...), data: append([]float32(nil), ft.GetData()...)}
		o.Destroy()
	}
	for _, in := range inputs {
		in.Destroy()
	}
	return res
}

func mustTensor[T ort.TensorData](t testing.TB, shape []int64, data []T) ort.Value {
	t.Helper()
	v, err := ort.NewTensor(ort.NewShape(shape...), data)
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
		TieWordEmbeddings: true, BOSTokenID: &bos, EOSTokenID: TokenIDs{2},
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
	inputs := []ort.Value{
		mustTensor(t, []int64{int64(B), int64(S)}, flat(ids)),
		mustTensor(t, []int64{int64(B), int64(T)}, flat(mask)),
		mustTensor(t, []int64{int64(B), int64(S)}, flat(pos)),
	}
	kvShape := []int64{int64(B), int64(cfg.KVHeads()), int64(pastLen), int64(cfg.HeadDimOrDefault())}
	n := B * cfg.KVHeads() * pastLen * cfg.HeadDimOrDefault()
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		for j := 0; j < 2; j++ {
			data := make([]float32, max(n, 1))[:n]
			if past != nil {
				copy(data, past[l][j])
			}
			if n == 0 {
				e, err := ort.NewEmptyTensor[float32](ort.NewShape(kvShape...))
				if err != nil {
					t.Fatal(err)
				}
				inputs = append(inputs, e)
				continue
			}
			inputs = append(inputs, mustTensor(t, kvShape, data))
		}
	}
	return s.run(t, inputs)
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
