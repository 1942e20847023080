package models

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/ort"
)

// buildStepTestModel builds the tiny random Llama with a step graph of dtype.
func buildStepTestModel(t *testing.T, dtype convert.DType) string {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join("testdata", "tiny-llama", "config.json")
	if _, err := convert.BuildRandom(cfg, dir, 3, convert.Options{StepDType: dtype}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestStepRunnerCopyBlocks(t *testing.T) {
	m := openTestModel(t, buildStepTestModel(t, convert.Float32), AttentionGraph)
	kv := newTestCache(m.Spec(), 1, 8, 4, 1) // blocks of 16 tokens, the op's smallest
	if _, err := m.Forward(kv.batch([]int{0}, [][]int32{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18}}, false)); err != nil {
		t.Fatal(err)
	}
	src, dst := kv.tables[0][1], kv.free[0] // the partial block, and a free one
	copier, ok := m.(BlockCopier)
	if !ok {
		t.Fatal("the step runner copies no blocks")
	}
	if err := copier.CopyBlocks([]kvcache.CopyOp{{Src: src, Dst: dst}}); err != nil {
		t.Fatal(err)
	}
	blockBytes := kv.bs * m.Spec().NumKVHeads * m.Spec().HeadDim * m.Spec().KVDType.Size()
	for l := range m.Spec().NumLayers {
		for _, arena := range [][]byte{kv.storage.LayerK(l), kv.storage.LayerV(l)} {
			s := arena[int(src)*blockBytes : int(src+1)*blockBytes]
			if !bytes.Equal(s, arena[int(dst)*blockBytes:int(dst+1)*blockBytes]) || bytes.Equal(s, make([]byte, blockBytes)) {
				t.Fatalf("layer %d: block %d was not copied to %d", l, src, dst)
			}
		}
	}
	if err := copier.CopyBlocks([]kvcache.CopyOp{{Src: 0, Dst: 99}}); !errors.Is(err, ErrBatch) {
		t.Fatalf("a copy outside the cache: %v", err)
	}
}

func TestOpenDevices(t *testing.T) {
	cpuDir := buildStepTestModel(t, convert.Float32)
	gpuDir := buildStepTestModel(t, convert.Float16)
	lib := testORTLib(t)
	open := func(dir, device, attention string) (Model, error) {
		m, err := Open(dir, RunnerOptions{ORTLib: lib, IntraOpThreads: 2, Device: device, Attention: attention,
			CUDAProvider: filepath.Join(t.TempDir(), "libonnxruntime_providers_cuda.so")})
		if err == nil {
			t.Cleanup(func() { m.Close() })
		}
		return m, err
	}
	for _, tc := range []struct {
		dir, device, attention string
		want                   string // the error's text, or the path opened
	}{
		{cpuDir, DeviceCUDA, "", "rebuild it with `conveyor build-model --dtype float16`"},
		{gpuDir, DeviceCUDA, AttentionDense, "the GPU runs the step graph"},
		{gpuDir, DeviceCUDA, "", "make ort-gpu"},
		{gpuDir, DeviceCPU, AttentionGraph, "runs on NVIDIA GPUs only"},
		{gpuDir, DeviceAuto, "", AttentionDense}, // no GPU here: the GPU's graph does not run on the CPU
		{cpuDir, "", AttentionGraph, AttentionGraph},
		{cpuDir, DeviceCPU, "", AttentionGraph},
	} {
		m, err := open(tc.dir, tc.device, tc.attention)
		switch {
		case err != nil && !strings.Contains(err.Error(), tc.want):
			t.Errorf("device %q attention %q: %v, want %q", tc.device, tc.attention, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "\n"):
			t.Errorf("device %q attention %q: the error spans lines: %q", tc.device, tc.attention, err)
		case err == nil && (m.Attention() != tc.want || m.Device() != DeviceCPU):
			t.Errorf("device %q attention %q: opened %s on %s, want %s", tc.device, tc.attention, m.Attention(), m.Device(), tc.want)
		}
	}
	if _, err := Open(cpuDir, RunnerOptions{ORTLib: lib, Attention: AttentionGraph, KVCacheDType: "float16"}); err == nil ||
		!strings.Contains(err.Error(), "built for a float32 cache") || !strings.Contains(err.Error(), "--kv-cache-dtype float16") {
		t.Errorf("a float16 cache for a step graph built with a float32 one: %v", err)
	}
	if _, err := open(gpuDir, DeviceCUDA, ""); !errors.Is(err, ort.ErrNoDevice) {
		t.Errorf("cuda without the provider: %v, want ErrNoDevice", err)
	}
}

// TestStepPacking checks the step graph's small inputs for a batch that mixes a prompt
// asking for every position's logits, a decoding row and a prompt chunk over a past.
func TestStepPacking(t *testing.T) {
	st, err := kvcache.NewStorage(kvcache.StorageConfig{NumBlocks: 16, BlockSizeTokens: 4, Layers: 1, KVHeads: 1, HeadDim: 2,
		DType: kvcache.Float32, TokenMajor: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := &Batch{Cache: st, Seqs: []SeqInput{
		{Tokens: []int32{1, 2, 3, 4, 5, 6}, Blocks: []kvcache.BlockID{7, 3}, AllLogits: true},
		{Tokens: []int32{9}, PastLen: 9, Blocks: []kvcache.BlockID{1, 2, 11, 12}}, // a block beyond its positions
		{Tokens: []int32{4, 5, 6}, PastLen: 4, Blocks: []kvcache.BlockID{5, 6}},
	}}
	var r StepRunner
	r.pack(b)
	check := func(what string, got, want any) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	check("tokens", r.ids, []int64{1, 2, 3, 4, 5, 6, 9, 4, 5, 6})
	check("cumulative lengths", r.cu, []int32{0, 6, 7, 10})
	check("past lengths", r.past, []int32{0, 9, 4})
	check("table width", r.width, 3)
	check("block table", r.tables, [][]int32{{7, 3, 0, 1, 2, 11, 5, 6, 0}})
	check("logit rows", r.rows, []int64{0, 1, 2, 3, 4, 5, 6, 9})

	// A graph of two layer groups over a cache of one: both tables are the one table.
	r.graphGroups = 2
	r.pack(b)
	check("block tables of one group", r.tables, [][]int32{{7, 3, 0, 1, 2, 11, 5, 6, 0}, {7, 3, 0, 1, 2, 11, 5, 6, 0}})
	// Over a cache of the graph's groups each table is the group's, the entries a sliding
	// window has passed (NoBlock) padded with block 0.
	r.groups = 2
	b.Seqs[0].GroupBlocks = [][]kvcache.BlockID{{8, 4}}
	b.Seqs[1].GroupBlocks = [][]kvcache.BlockID{{kvcache.NoBlock, kvcache.NoBlock, 13, 14}}
	b.Seqs[2].GroupBlocks = [][]kvcache.BlockID{{kvcache.NoBlock, 9}}
	r.pack(b)
	check("block tables of two groups", r.tables, [][]int32{{7, 3, 0, 1, 2, 11, 5, 6, 0}, {8, 4, 0, 0, 0, 13, 0, 9, 0}})
	r.graphGroups, r.groups = 0, 0
	for i := range b.Seqs {
		b.Seqs[i].GroupBlocks = nil
	}
	r.pack(b)

	r.logits = make([]float32, 8*2)
	for i := range r.logits {
		r.logits[i] = float32(i)
	}
	r.spec.VocabSize = 2
	r.argmax = []int64{1, 0, 1, 1, 0, 1, 1, 0}
	out := r.split(b)
	check("row logits", out.Logits, [][]float32{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {12, 13}, {14, 15}})
	check("row argmax", out.Argmax, []int32{1, 1, 0})

	b.Seqs[1].ArgmaxOnly = true // a greedy row: its id, no logits
	out = r.split(b)
	if out.Logits[1] != nil || out.Argmax[1] != 1 || out.Logits[2] == nil {
		t.Errorf("an argmax-only row: logits %v, argmax %v", out.Logits, out.Argmax)
	}
}

// TestStepFloat16KV: family fixtures whose CPU step graphs keep their caches in float16
// (convert.Options.StepKVDType) stay close to PyTorch, one batch and token by token, and
// differ from the float32 cache's logits (the cache really holds halves, two bytes each).
func TestStepFloat16KV(t *testing.T) {
	for _, family := range []string{"llama3", "qwen2", "gemma2"} {
		t.Run(family, func(t *testing.T) {
			src := filepath.Join("testdata", "families", family)
			ref := loadFamilyReference(t, filepath.Join(src, "reference.json"))
			open := func(kv convert.DType) Model {
				dir := t.TempDir()
				if _, err := convert.BuildFromHF(src, dir, convert.Options{StepKVDType: kv}); err != nil {
					t.Fatal(err)
				}
				return openTestModel(t, dir, AttentionGraph)
			}
			half, full := open(convert.Float16), open(convert.Float32)
			if half.Spec().KVDType != Float16 || full.Spec().KVDType != Float32 {
				t.Fatalf("KV types %v and %v", half.Spec().KVDType, full.Spec().KVDType)
			}
			vocab := len(ref.Logits[0][0])
			worst, moved := 0.0, 0.0
			for s, seq := range ref.Sequences {
				kvh, kvf := newTestCache(half.Spec(), 1, 64, 16, 3), newTestCache(full.Spec(), 1, 64, 16, 3)
				for p := range seq {
					step := [][]int32{seq[p : p+1]}
					oh, err := half.Forward(kvh.batch([]int{0}, step, false))
					if err != nil {
						t.Fatal(err)
					}
					of, err := full.Forward(kvf.batch([]int{0}, step, false))
					if err != nil {
						t.Fatal(err)
					}
					worst = max(worst, maxAbsDiff64(oh.Logits[0][:vocab], ref.Logits[s][p]))
					for j := range vocab {
						moved = max(moved, math.Abs(float64(oh.Logits[0][j]-of.Logits[0][j])))
					}
				}
			}
			t.Logf("%s, float16 cache: largest difference from PyTorch %.2e, from the float32 cache %.2e", family, worst, moved)
			if worst > 1e-2 {
				t.Errorf("the float16 cache's logits differ from PyTorch by %.2e, want at most 1e-2", worst)
			}
			if moved == 0 {
				t.Error("float16 and float32 caches gave identical logits: the float16 cache is not used")
			}
		})
	}
}
