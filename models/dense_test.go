package models

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/convert"
)

// logitTolerance is the largest accepted logit difference relative to the logits' scale.
const logitTolerance = 1e-4

// gqaModel builds a small grouped-query model shared by the runner tests.
func gqaModel(t *testing.T) (*DenseRunner, *convert.Config, convert.Weights) {
	t.Helper()
	cfg := tinyConfig(64, 2, 4, 2, 96, 211, false)
	dir := t.TempDir()
	w := buildTestModel(t, cfg, 7, dir)
	return openTestRunner(t, dir), cfg, w
}

func TestRunnerSpec(t *testing.T) {
	cfg := tinyConfig(48, 3, 6, 2, 80, 101, true)
	cfg.BOSTokenID = new(int32)
	*cfg.BOSTokenID = 1
	dir := t.TempDir()
	buildTestModel(t, cfg, 1, dir)
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"eos_token_id": [2, 5]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	r := openTestRunner(t, dir)
	got := r.Spec()
	want := Spec{NumLayers: 3, NumKVHeads: 2, HeadDim: 8, VocabSize: 101, MaxPositions: 256, KVDType: Float32,
		BOSTokenID: 1, EOSTokenIDs: []int32{2, 5}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Spec = %+v, want %+v", got, want)
	}
	if n := got.KVBytesPerToken(); n != 2*3*2*8*4 {
		t.Errorf("KVBytesPerToken = %d", n)
	}
}

// TestKVCachedDecoding checks that prefill followed by 32 single-token steps through the
// KV cache gives the same logits as recomputing the whole sequence without a cache.
func TestKVCachedDecoding(t *testing.T) {
	r, cfg, w := gqaModel(t)
	kv := newContextCache(r.Spec(), 1)
	seq := randTokens(1, 9, cfg.VocabSize)
	out, err := r.Forward(kv.batch([]int{0}, [][]int32{seq}, false))
	if err != nil {
		t.Fatal(err)
	}
	cached := append([]float32(nil), out.Logits[0]...)
	for step := 0; step <= 32; step++ {
		full, err := r.Forward(&Batch{Seqs: []SeqInput{{Tokens: seq}}})
		if err != nil {
			t.Fatal(err)
		}
		if e := relErr32(cached, full.Logits[0]); e > logitTolerance {
			t.Fatalf("step %d (position %d): cached logits differ from recomputation by %.2e", step, len(seq)-1, e)
		}
		if step == 32 {
			break
		}
		next := argmax(cached)
		seq = append(seq, next)
		out, err := r.Forward(kv.batch([]int{0}, [][]int32{{next}}, false))
		if err != nil {
			t.Fatal(err)
		}
		cached = append(cached[:0], out.Logits[0]...)
	}
	// The cache holds every position's keys and values, as one pass over the whole
	// sequence stores them.
	whole := newContextCache(r.Spec(), 1)
	if _, err := r.Forward(whole.batch([]int{0}, [][]int32{seq}, false)); err != nil {
		t.Fatal(err)
	}
	gotK, gotV := kv.keys(0)
	wantK, wantV := whole.keys(0)
	for l := range gotK {
		if e := max(relErr32(gotK[l], wantK[l]), relErr32(gotV[l], wantV[l])); e > logitTolerance {
			t.Fatalf("layer %d: the cache's %d positions differ from one pass's by %.2e", l, len(seq), e)
		}
	}
	// The end of the trajectory also matches the independent reference.
	ref := newRefModel(t, cfg, w).forward(t, seq)
	if e := relErr(cached, ref[len(seq)-1]); e > logitTolerance {
		t.Fatalf("cached logits differ from the reference by %.2e", e)
	}
}

// trajectory is one sequence decoded alone: its tokens and the logits at every position.
type trajectory struct {
	prompt int
	tokens []int32
	logits [][]float32 // logits[p] predicts token p+1
}

func decodeAlone(t *testing.T, r *DenseRunner, prompt []int32, steps int) trajectory {
	t.Helper()
	kv := newContextCache(r.Spec(), 1)
	tr := trajectory{prompt: len(prompt), tokens: append([]int32(nil), prompt...)}
	out, err := r.Forward(kv.batch([]int{0}, [][]int32{prompt}, true))
	if err != nil {
		t.Fatal(err)
	}
	V := r.Spec().VocabSize
	for p := range prompt {
		tr.logits = append(tr.logits, append([]float32(nil), out.Logits[0][p*V:(p+1)*V]...))
	}
	for i := 0; i < steps; i++ {
		next := argmax(tr.logits[len(tr.logits)-1])
		tr.tokens = append(tr.tokens, next)
		out, err := r.Forward(kv.batch([]int{0}, [][]int32{{next}}, false))
		if err != nil {
			t.Fatal(err)
		}
		tr.logits = append(tr.logits, append([]float32(nil), out.Logits[0]...))
	}
	return tr
}

// TestBatchInvariance checks that a sequence's logits and greedy tokens do not depend on
// the other rows of its batch, whether rows prefill together, decode together, or mix
// prefill chunks with decode steps.
func TestBatchInvariance(t *testing.T) {
	r, _, _ := gqaModel(t)
	testBatchInvariance(t, r, logitTolerance)
}

// TestBatchInvarianceGroupedPasses runs the batch invariance schedules with every
// Forward planned as one pass, and with rows of different shapes always in separate
// passes, so that both paths of the planner are covered whatever it picks by default.
func TestBatchInvarianceGroupedPasses(t *testing.T) {
	r, _, _ := gqaModel(t)
	saved := r.cost
	defer func() { r.cost = saved }()
	for _, c := range []struct {
		name string
		cost costModel
	}{
		{"one pass", costModel{perToken: 1, perPass: 1e30}},
		{"split", costModel{perToken: 1, perAttn: 1, perKey: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.cost = c.cost
			testBatchInvariance(t, r, logitTolerance)
		})
	}
}

// testBatchInvariance decodes four sequences alone and then batched in several
// schedules, and requires every row to match its solo run within tol.
func testBatchInvariance(t *testing.T, r *DenseRunner, tol float64) {
	V := r.Spec().VocabSize
	prompts := [][]int32{
		randTokens(11, 5, V), randTokens(12, 13, V), randTokens(13, 1, V), randTokens(14, 8, V),
	}
	const steps = 6
	alone := make([]trajectory, len(prompts))
	for i, p := range prompts {
		alone[i] = decodeAlone(t, r, p, steps)
	}

	// check compares one batched pass's rows with the sequences decoded alone.
	check := func(t *testing.T, name string, kv *testCache, b *Batch, out *Output) {
		t.Helper()
		for row, s := range kv.rows {
			in := b.Seqs[row]
			first := in.PastLen + len(in.Tokens) - 1
			if in.AllLogits {
				first = in.PastLen
			}
			for p := first; p < in.PastLen+len(in.Tokens); p++ {
				got := out.Logits[row][(p-first)*V : (p-first+1)*V]
				want := alone[s].logits[p]
				if e := relErr32(got, want); e > tol {
					t.Fatalf("%s: seq %d position %d differs from decoding alone by %.2e", name, s, p, e)
				}
				// Tokens after the prompt were chosen greedily when decoding alone.
				if p+1 >= alone[s].prompt && p+1 < len(alone[s].tokens) && argmax(got) != alone[s].tokens[p+1] {
					t.Fatalf("%s: seq %d position %d: greedy token %d, alone %d", name, s, p, argmax(got), alone[s].tokens[p+1])
				}
			}
		}
	}
	// run feeds each listed sequence its next n tokens of the alone trajectory.
	run := func(t *testing.T, name string, kv *testCache, seqs []int, n []int, allLogits bool) {
		t.Helper()
		toks := make([][]int32, len(seqs))
		for i, s := range seqs {
			p := kv.length(s)
			toks[i] = alone[s].tokens[p : p+n[i]]
		}
		b := kv.batch(seqs, toks, allLogits)
		out, err := r.Forward(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		check(t, name, kv, b, out)
	}
	all := []int{0, 1, 2, 3}
	ones := []int{1, 1, 1, 1}

	t.Run("together", func(t *testing.T) {
		kv := newContextCache(r.Spec(), 4)
		lens := make([]int, 4)
		for i, p := range prompts {
			lens[i] = len(p)
		}
		run(t, "prefill", kv, all, lens, true)
		for i := 0; i < steps; i++ {
			run(t, "decode", kv, all, ones, false)
		}
	})
	t.Run("mixed", func(t *testing.T) {
		kv := newContextCache(r.Spec(), 4)
		run(t, "prefill 0, chunk 1", kv, []int{0, 1}, []int{5, 6}, false)
		run(t, "decode 0, chunk 1, prefill 2", kv, []int{0, 1, 2}, []int{1, 7, 1}, true)
		run(t, "decode 0-2, prefill 3", kv, []int{2, 0, 3, 1}, []int{1, 1, 8, 1}, false)
		for i := 0; i < 4; i++ {
			run(t, "decode", kv, []int{3, 1, 0, 2}, ones, false)
		}
		run(t, "decode subset", kv, []int{3}, []int{1}, false)
	})
}

// TestFloat16KV runs a model whose keys and values are float16 at its interface: the
// runner detects the type, decoding through the cache follows the float32 reference
// (within float16 rounding), and batching does not change any row's result.
func TestFloat16KV(t *testing.T) {
	cfg := tinyConfig(64, 2, 4, 2, 96, 150, false)
	dir := t.TempDir()
	w := buildModelVariant(t, cfg, 9, dir, modelVariant{Float16KV: true})
	r := openTestRunner(t, dir)
	if got := r.Spec().KVDType; got != Float16 {
		t.Fatalf("KVDType = %s, want float16", got)
	}
	tr := decodeAlone(t, r, randTokens(21, 6, cfg.VocabSize), 10)
	ref := newRefModel(t, cfg, w).forward(t, tr.tokens)
	for p := range tr.logits {
		if e := relErr(tr.logits[p], ref[p]); e > 1e-2 {
			t.Fatalf("position %d: float16-cache logits differ from the reference by %.2e", p, e)
		}
	}
	// A prompt prefilled in chunks reads its earlier chunks back from the float16
	// cache, while a one-pass prefill uses them unrounded, so the schedules differ by
	// float16 rounding (about 1e-3 here); batching itself adds nothing.
	testBatchInvariance(t, r, 5e-3)
}

// TestLogitsVariants runs graphs whose logits are float16, or only for the last
// position ([batch, 1, vocab], allocated by ONNX Runtime), against the reference.
func TestLogitsVariants(t *testing.T) {
	cfg := tinyConfig(32, 2, 4, 2, 64, 90, true)
	prompts := [][]int32{randTokens(31, 5, cfg.VocabSize), randTokens(32, 5, cfg.VocabSize)}
	for name, v := range map[string]modelVariant{
		"float16 logits":     {Float16Logits: true},
		"last logits only":   {LastLogitsOnly: true},
		"float16 everything": {Float16KV: true, Float16Logits: true, LastLogitsOnly: true},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			w := buildModelVariant(t, cfg, 4, dir, v)
			r := openTestRunner(t, dir)
			ref := newRefModel(t, cfg, w)
			tol := 1e-2 // float16 rounding
			if !v.Float16KV && !v.Float16Logits {
				tol = logitTolerance
			}
			kv := newContextCache(r.Spec(), 2)
			seqs := [][]int32{prompts[0], prompts[1]}
			for step := 0; step < 4; step++ {
				toks := [][]int32{seqs[0][kv.length(0):], seqs[1][kv.length(1):]}
				out, err := r.Forward(kv.batch([]int{0, 1}, toks, false))
				if err != nil {
					t.Fatal(err)
				}
				for i := range seqs {
					want := ref.forward(t, seqs[i])
					if e := relErr(out.Logits[i], want[len(seqs[i])-1]); e > tol {
						t.Fatalf("step %d row %d: logits differ from the reference by %.2e", step, i, e)
					}
					seqs[i] = append(seqs[i], argmax(out.Logits[i]))
				}
			}
			// Rows of unequal length or all-position logits cannot be served by a
			// last-position-only graph; with full logits they are fine.
			for _, b := range []*Batch{
				{Seqs: []SeqInput{{Tokens: []int32{1, 2}}, {Tokens: []int32{3}}}},
				{Seqs: []SeqInput{{Tokens: []int32{1, 2}, AllLogits: true}}},
			} {
				_, err := r.Forward(b)
				if v.LastLogitsOnly && !errors.Is(err, ErrBatch) {
					t.Errorf("last-logits model: err = %v, want ErrBatch", err)
				}
				if !v.LastLogitsOnly && err != nil {
					t.Errorf("full-logits model: %v", err)
				}
			}
		})
	}
}

func TestForwardRejectsBadBatches(t *testing.T) {
	r, cfg, _ := gqaModel(t)
	kv := newContextCache(r.Spec(), 1)
	blocks := kv.free // every block of the cache: room for any row
	row := func(past int, tokens ...int32) SeqInput {
		return SeqInput{Tokens: tokens, PastLen: past, Blocks: blocks}
	}
	rows := func(rs ...SeqInput) *Batch { return &Batch{Seqs: rs, Cache: kv.storage} }
	otherSpec := r.Spec()
	otherSpec.NumKVHeads++
	other := newContextCache(otherSpec, 1)
	cases := map[string]*Batch{
		"nil batch":       nil,
		"empty batch":     rows(),
		"no tokens":       rows(row(0, 1), row(0)),
		"negative past":   rows(row(-1, 1)),
		"beyond context":  rows(row(cfg.MaxPositionEmbeddings-1, 1, 2)),
		"token too large": rows(row(0, 1, int32(cfg.VocabSize))),
		"negative token":  rows(row(0, -1)),
		"too few blocks":  rows(SeqInput{Tokens: []int32{1, 2}, PastLen: 15, Blocks: blocks[:1]}),
		"another model's cache": {Seqs: []SeqInput{{Tokens: []int32{1}, Blocks: other.free}},
			Cache: other.storage},
	}
	for name, b := range cases {
		if _, err := r.Forward(b); !errors.Is(err, ErrBatch) {
			t.Errorf("%s: err = %v, want ErrBatch", name, err)
		}
	}
	if _, err := r.Forward(&Batch{Seqs: []SeqInput{{Tokens: []int32{1}, PastLen: 3}}}); !errors.Is(err, ErrBatch) {
		t.Errorf("past without a cache: err = %v, want ErrBatch", err)
	}
	// The context limit itself is fine.
	ok := &Batch{Seqs: []SeqInput{{Tokens: []int32{1, 2}}}}
	if _, err := r.Forward(ok); err != nil {
		t.Fatalf("valid batch after errors: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Forward(ok); !errors.Is(err, ErrRun) {
		t.Errorf("Forward after Close: err = %v, want ErrRun", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestForwardKVErrors makes the cache refuse the gather of the past, then the scatter of
// the new keys and values (a block outside the pool): the pass fails with ErrRun wrapping
// the cache's error.
func TestForwardKVErrors(t *testing.T) {
	r, _, _ := gqaModel(t)
	kv := newTestCache(r.Spec(), 1, 4, 4, 1)
	for call, blocks := range map[string][]kvcache.BlockID{
		"gather":  {99, 0}, // the past's block
		"scatter": {0, 99}, // the new token's block
	} {
		b := &Batch{Seqs: []SeqInput{{Tokens: []int32{3}, PastLen: 4, Blocks: blocks}}, Cache: kv.storage}
		_, err := r.Forward(b)
		if !errors.Is(err, ErrRun) || !errors.Is(err, kvcache.ErrInvalid) || !strings.Contains(err.Error(), call) {
			t.Errorf("%s: err = %v, want ErrRun wrapping the cache's refusal to %s", call, err, call)
		}
	}
}

func TestOpenRunnerErrors(t *testing.T) {
	lib := testORTLib(t)
	open := func(dir string) error {
		r, err := OpenDense(dir, RunnerOptions{ORTLib: lib})
		if err == nil {
			r.Close()
		}
		return err
	}
	cfg := tinyConfig(32, 1, 2, 2, 48, 50, true)
	good := t.TempDir()
	buildTestModel(t, cfg, 3, good)
	config, err := os.ReadFile(filepath.Join(good, "config.json"))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("missing dir", func(t *testing.T) {
		if err := open(filepath.Join(t.TempDir(), "nope")); !errors.Is(err, ErrModelDir) || !strings.Contains(err.Error(), "model.onnx") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("malformed onnx", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "model.onnx"), []byte("this is not a protobuf \x00\x01\x02"), 0o644)
		os.WriteFile(filepath.Join(dir, "config.json"), config, 0o644)
		if err := open(dir); !errors.Is(err, ErrModelDir) {
			t.Errorf("err = %v", err)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("error spans lines: %q", err)
		}
	})
	t.Run("truncated onnx", func(t *testing.T) {
		raw, err := os.ReadFile(filepath.Join(good, "model.onnx"))
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "model.onnx"), raw[:len(raw)/3], 0o644)
		os.WriteFile(filepath.Join(dir, "config.json"), config, 0o644)
		if err := open(dir); !errors.Is(err, ErrModelDir) {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("missing config", func(t *testing.T) {
		dir := t.TempDir()
		raw, _ := os.ReadFile(filepath.Join(good, "model.onnx"))
		os.WriteFile(filepath.Join(dir, "model.onnx"), raw, 0o644)
		if err := open(dir); !errors.Is(err, ErrModelDir) || !strings.Contains(err.Error(), "config.json") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("config without context length", func(t *testing.T) {
		dir := t.TempDir()
		raw, _ := os.ReadFile(filepath.Join(good, "model.onnx"))
		os.WriteFile(filepath.Join(dir, "model.onnx"), raw, 0o644)
		os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"vocab_size": 50}`), 0o644)
		if err := open(dir); !errors.Is(err, ErrModelDir) {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("negative threads", func(t *testing.T) {
		if _, err := OpenDense(good, RunnerOptions{ORTLib: lib, IntraOpThreads: -1}); err == nil {
			t.Error("no error")
		}
	})
	t.Run("good", func(t *testing.T) {
		if err := open(good); err != nil {
			t.Errorf("err = %v", err)
		}
	})
}

// TestORTLibraryErrors checks, in fresh processes, that a missing or wrong ONNX Runtime
// library gives a one-line error that says to run `make ort`.
func TestORTLibraryErrors(t *testing.T) {
	notLib := filepath.Join(t.TempDir(), "libonnxruntime.so.1")
	if err := os.WriteFile(notLib, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{
		"missing":   filepath.Join(t.TempDir(), "nope", "libonnxruntime.so.1"),
		"not a lib": notLib,
		"directory": t.TempDir(),
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), ortChildEnv+"="+path)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child failed: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "ORT-ERROR:") || !strings.Contains(string(out), "make ort") {
				t.Fatalf("child output lacks the expected error:\n%s", out)
			}
		})
	}
}

// TestInitORTIdempotent checks InitORT once a library is loaded in this process.
func TestInitORTIdempotent(t *testing.T) {
	lib := testORTLib(t)
	for _, p := range []string{lib, lib, ""} {
		if err := InitORT(p); err != nil {
			t.Fatalf("InitORT(%q): %v", p, err)
		}
	}
	if ORTVersion() == "" {
		t.Error("ORTVersion is empty after InitORT")
	}
	other := filepath.Join(t.TempDir(), "libonnxruntime.so.1")
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		filepath.Join(t.TempDir(), "missing.so"): "make ort",
		other:                                    "already initialised",
	} {
		if err := InitORT(path); !errors.Is(err, ErrORT) || !strings.Contains(err.Error(), want) {
			t.Errorf("InitORT(%s): err = %v, want ErrORT mentioning %q", path, err, want)
		}
	}
}
