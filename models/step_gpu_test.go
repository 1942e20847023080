package models

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/conveyor-llm/conveyor/models/convert"
)

// gpuFamilyTolerance is the largest absolute logit difference from the float32 PyTorch
// reference accepted of a 16-bit step graph on the GPU (16-bit weights and activations;
// the fixtures' logits span about ±10): float16 keeps 11 significant bits, bfloat16 8,
// so its bound is 8 times float16's less a margin (both stated before any GPU run).
var gpuFamilyTolerance = map[convert.DType]float64{convert.Float16: 0.1, convert.BFloat16: 0.5}

// TestStepGraphFamiliesOnGPU runs every family fixture through its float16 and bfloat16
// step graphs on the GPU: all sequences in one step, then token by token through the
// cache. It runs only with CONVEYOR_TEST_DEVICE=cuda (scripts/gpu-check.sh sets it), on a
// machine with an NVIDIA GPU, the CUDA libraries and ONNX Runtime's CUDA provider (`make
// ort-gpu`).
func TestStepGraphFamiliesOnGPU(t *testing.T) {
	if os.Getenv("CONVEYOR_TEST_DEVICE") != DeviceCUDA {
		t.Skip("set CONVEYOR_TEST_DEVICE=cuda to run the fixtures on an NVIDIA GPU (scripts/gpu-check.sh)")
	}
	refs, err := filepath.Glob(filepath.Join("testdata", "families", "*", "reference.json"))
	if err != nil || len(refs) == 0 {
		t.Fatalf("no family fixtures: %v", err)
	}
	for _, dtype := range []convert.DType{convert.Float16, convert.BFloat16} {
		for _, refPath := range refs {
			stepGraphFamilyOnGPU(t, refPath, dtype)
		}
	}
}

// stepGraphFamilyOnGPU runs one family fixture through its dtype step graph on the GPU.
func stepGraphFamilyOnGPU(t *testing.T, refPath string, dtype convert.DType) {
	src := filepath.Dir(refPath)
	bound := gpuFamilyTolerance[dtype]
	t.Run(dtype.String()+"/"+filepath.Base(src), func(t *testing.T) {
		ref := loadFamilyReference(t, refPath)
		dir := t.TempDir()
		if _, err := convert.BuildFromHF(src, dir, convert.Options{StepDType: dtype}); err != nil {
			t.Fatalf("BuildFromHF: %v", err)
		}
		m, err := Open(dir, RunnerOptions{ORTLib: testORTLib(t), Device: DeviceCUDA})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		vocab := len(ref.Logits[0][0])
		worst := 0.0
		check := func(how string, seq, pos int, logits []float32) {
			t.Helper()
			d := maxAbsDiff64(logits[:vocab], ref.Logits[seq][pos])
			worst = max(worst, d)
			if d > bound {
				t.Errorf("%s: sequence %d position %d differs from PyTorch by %.2e", how, seq, pos, d)
			}
		}
		kv := newTestCache(m.Spec(), len(ref.Sequences), 64, 16, 3)
		seqs := make([]int, len(ref.Sequences))
		for i := range seqs {
			seqs[i] = i
		}
		out, err := m.Forward(kv.batch(seqs, ref.Sequences, true))
		if err != nil {
			t.Fatal(err)
		}
		for s, toks := range ref.Sequences {
			for p := range toks {
				check("one batch", s, p, out.Logits[s][p*vocab:])
			}
		}
		kv = newTestCache(m.Spec(), len(ref.Sequences), 64, 16, 5)
		for step := 0; ; step++ {
			var rows []int
			var toks [][]int32
			for s, seq := range ref.Sequences {
				if step < len(seq) {
					rows, toks = append(rows, s), append(toks, seq[step:step+1])
				}
			}
			if len(rows) == 0 {
				break
			}
			out, err := m.Forward(kv.batch(rows, toks, false))
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			for r, s := range rows {
				check("token by token", s, step, out.Logits[r])
			}
		}
		t.Logf("%s, %v on %s: largest difference from PyTorch %.3e (bound %.2g)", filepath.Base(src), dtype, m.Device(), worst, bound)
	})
}

// BenchmarkVerifyStepGPU is BenchmarkVerifyStepInt8 on the GPU: Qwen2.5-0.5B's shape
// (random weights) with a float16 step graph, past 128, one row feeding 1 token (its
// argmax only) or 1 + 4 (every position's logits, as speculative decoding's verifying
// step asks). It runs only with CONVEYOR_TEST_DEVICE=cuda (scripts/gpu-check.sh).
func BenchmarkVerifyStepGPU(b *testing.B) {
	if os.Getenv("CONVEYOR_TEST_DEVICE") != DeviceCUDA {
		b.Skip("set CONVEYOR_TEST_DEVICE=cuda to time the verifying step on an NVIDIA GPU (scripts/gpu-check.sh)")
	}
	cfg, err := convert.LoadConfig(filepath.Join("testdata", "qwen2-0.5b"))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxPositionEmbeddings = 4096
	raw, err := json.Marshal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cfgPath, dir := filepath.Join(b.TempDir(), "config.json"), b.TempDir()
	if err := os.WriteFile(cfgPath, raw, 0o644); err != nil {
		b.Fatal(err)
	}
	if _, err := convert.BuildRandom(cfgPath, dir, 1, convert.Options{StepDType: convert.Float16}); err != nil {
		b.Fatal(err)
	}
	m, err := Open(dir, RunnerOptions{ORTLib: testORTLib(b), Device: DeviceCUDA})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	for _, n := range []int{1, 5} {
		b.Run(fmt.Sprintf("tokens%d", n), func(b *testing.B) {
			in := benchBatch(m.Spec(), [][]int32{randTokens(1, n, cfg.VocabSize)}, []int{128})
			in.Seqs[0].AllLogits = n > 1
			in.Seqs[0].ArgmaxOnly = n == 1
			timeSteps(b, m, in, n)
		})
	}
}
