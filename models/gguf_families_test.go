package models

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/convert"
)

// The GGUF cross-check: each family fixture's checkpoint is written as a GGUF file the
// way llama.cpp's convert_hf_to_gguf.py writes one (its tensor names, the llama
// architecture's permuted query and key rows, Gemma's norm weights stored as 1 + w,
// llama 3's rope scaling as a rope_freqs tensor, Phi-3's longrope factors as tensors,
// its metadata keys), in float32 and with a byte-level vocabulary; Conveyor builds the
// file and must give the logits its own build of the same checkpoint gives.

// ggufWriter writes a GGUF (version 3) file: metadata, then tensor infos, then the
// float32 data aligned to 32 bytes.
type ggufWriter struct {
	kv      bytes.Buffer
	nkv     int
	tensors []ggufTestTensor
}

type ggufTestTensor struct {
	name string
	dims []uint64 // GGUF order: the contiguous dimension first
	data []float32
	typ  uint32 // ggmlF32, ggmlQ8_0 (blocks of 32: an fp16 scale, 32 int8 values) or ggmlQ4_0
}

// The GGML types the test writer stores.
const (
	ggmlF32  = 0
	ggmlQ4_0 = 2
	ggmlQ8_0 = 8
)

// bytes returns the tensor as stored: float32, Q8_0 as ggml's quantize_row_q8_0 writes
// it (d = max|x|/127, q = round(x/d)), or Q4_0 as quantize_row_q4_0 does (d = the value
// of largest magnitude / -8, q = min(15, trunc(x/d + 8.5)), low nibbles the block's first
// half).
func (t ggufTestTensor) bytes() []byte {
	var b bytes.Buffer
	switch t.typ {
	case ggmlF32:
		binary.Write(&b, binary.LittleEndian, t.data)
		return b.Bytes()
	case ggmlQ4_0:
		for i := 0; i < len(t.data); i += 32 {
			blk := t.data[i : i+32]
			var extreme float32
			for _, x := range blk {
				if math.Abs(float64(x)) > math.Abs(float64(extreme)) {
					extreme = x
				}
			}
			d := extreme / -8
			inv := float32(0)
			if d != 0 {
				inv = 1 / d
			}
			binary.Write(&b, binary.LittleEndian, kvcache.Float32ToFloat16(d))
			for j := range 16 {
				lo := min(15, int(blk[j]*inv+8.5))
				hi := min(15, int(blk[j+16]*inv+8.5))
				b.WriteByte(byte(lo) | byte(hi)<<4)
			}
		}
		return b.Bytes()
	}
	for i := 0; i < len(t.data); i += 32 {
		blk := t.data[i : i+32]
		amax := float32(0)
		for _, x := range blk {
			amax = max(amax, float32(math.Abs(float64(x))))
		}
		d := amax / 127
		binary.Write(&b, binary.LittleEndian, kvcache.Float32ToFloat16(d))
		for _, x := range blk {
			q := int8(0)
			if d != 0 {
				q = int8(math.Round(float64(x / d)))
			}
			b.WriteByte(byte(q))
		}
	}
	return b.Bytes()
}

func (w *ggufWriter) str(b *bytes.Buffer, s string) {
	binary.Write(b, binary.LittleEndian, uint64(len(s)))
	b.WriteString(s)
}

// add writes one metadata value: string, bool, uint32, int32, float32, []string,
// []int32 or []float32.
func (w *ggufWriter) add(key string, v any) {
	w.nkv++
	w.str(&w.kv, key)
	le := binary.LittleEndian
	switch v := v.(type) {
	case string:
		binary.Write(&w.kv, le, uint32(8))
		w.str(&w.kv, v)
	case bool:
		binary.Write(&w.kv, le, uint32(7))
		binary.Write(&w.kv, le, v)
	case uint32:
		binary.Write(&w.kv, le, uint32(4))
		binary.Write(&w.kv, le, v)
	case int32:
		binary.Write(&w.kv, le, uint32(5))
		binary.Write(&w.kv, le, v)
	case float32:
		binary.Write(&w.kv, le, uint32(6))
		binary.Write(&w.kv, le, v)
	case []string:
		binary.Write(&w.kv, le, uint32(9))
		binary.Write(&w.kv, le, uint32(8))
		binary.Write(&w.kv, le, uint64(len(v)))
		for _, s := range v {
			w.str(&w.kv, s)
		}
	case []int32:
		binary.Write(&w.kv, le, uint32(9))
		binary.Write(&w.kv, le, uint32(5))
		binary.Write(&w.kv, le, uint64(len(v)))
		binary.Write(&w.kv, le, v)
	case []float32:
		binary.Write(&w.kv, le, uint32(9))
		binary.Write(&w.kv, le, uint32(6))
		binary.Write(&w.kv, le, uint64(len(v)))
		binary.Write(&w.kv, le, v)
	default:
		panic(fmt.Sprintf("ggufWriter: %T", v))
	}
}

// write writes the file: tensors in name order, as llama.cpp's writer lays them out.
func (w *ggufWriter) write(path string) error {
	sort.Slice(w.tensors, func(i, j int) bool { return w.tensors[i].name < w.tensors[j].name })
	var b bytes.Buffer
	le := binary.LittleEndian
	b.WriteString("GGUF")
	binary.Write(&b, le, uint32(3))
	binary.Write(&b, le, uint64(len(w.tensors)))
	binary.Write(&b, le, uint64(w.nkv))
	b.Write(w.kv.Bytes())
	off := uint64(0)
	for _, t := range w.tensors {
		w.str(&b, t.name)
		binary.Write(&b, le, uint32(len(t.dims)))
		binary.Write(&b, le, t.dims)
		binary.Write(&b, le, t.typ)
		binary.Write(&b, le, off)
		off += (uint64(len(t.bytes())) + 31) / 32 * 32
	}
	for b.Len()%32 != 0 {
		b.WriteByte(0)
	}
	for _, t := range w.tensors {
		b.Write(t.bytes())
		for b.Len()%32 != 0 {
			b.WriteByte(0)
		}
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// ggufArchOf is the GGUF architecture llama.cpp writes a model_type as.
var ggufArchOf = map[string]string{"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
	"gemma": "gemma", "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3"}

// writeFamilyGGUF writes the checkpoint in dir as llama.cpp's converter would, and
// returns the config.json of the checkpoint the file stands for: dir's, less what a GGUF
// of that architecture cannot say (llama.cpp's attention scale for Gemma 2 and 3, the
// sliding windows of llama and qwen2 files), which the comparison build is given.
func writeFamilyGGUF(t *testing.T, dir, path string) (arch string, cfgJSON map[string]any) {
	return writeFamilyGGUFAs(t, dir, path, nil)
}

// writeFamilyGGUFAs is writeFamilyGGUF, with each layer's linear weight in the type
// linearType gives for its GGUF name (nil: float32)
// (as llama-quantize's Q8_0 leaves the norms, embeddings and output in float).
func writeFamilyGGUFAs(t *testing.T, dir, path string, linearType func(name string) uint32) (arch string, cfgJSON map[string]any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &cfgJSON); err != nil {
		t.Fatal(err)
	}
	cfg, err := convert.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	arch = ggufArchOf[cfg.ModelType]
	if arch == "" || cfgJSON["text_config"] != nil {
		return "", nil // no architecture here, or a multimodal wrapper (its text model is a family of its own)
	}
	w, err := convert.LoadSafetensorsDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	g := &ggufWriter{}
	u := func(v int) uint32 { return uint32(v) }
	headDim := cfg.HeadDimOrDefault()
	g.add("general.architecture", arch)
	g.add(arch+".context_length", u(cfg.MaxPositionEmbeddings))
	g.add(arch+".embedding_length", u(cfg.HiddenSize))
	g.add(arch+".block_count", u(cfg.NumHiddenLayers))
	g.add(arch+".feed_forward_length", u(cfg.IntermediateSize))
	g.add(arch+".attention.head_count", u(cfg.NumAttentionHeads))
	g.add(arch+".attention.head_count_kv", u(cfg.KVHeads()))
	g.add(arch+".attention.key_length", u(headDim))
	g.add(arch+".attention.value_length", u(headDim))
	g.add(arch+".attention.layer_norm_rms_epsilon", float32(cfg.Eps()))
	g.add(arch+".rope.freq_base", float32(cfg.Theta()))
	rotary := headDim
	if f := cfg.PartialRotaryFactor; f != 0 {
		rotary = int(float64(headDim) * f)
	}
	g.add(arch+".rope.dimension_count", u(rotary))
	var scaling convert.RopeScalingParams
	_ = json.Unmarshal(cfg.RopeScaling, &scaling)
	kind := scaling.RopeType
	if kind == "" {
		kind = scaling.Type
	}
	switch kind {
	case "linear":
		g.add(arch+".rope.scaling.type", "linear")
		g.add(arch+".rope.scaling.factor", float32(scaling.Factor))
	case "llama3":
		// convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors.
		low := float64(scaling.OriginalMaxPositionEmbeddings) / scaling.LowFreqFactor
		high := float64(scaling.OriginalMaxPositionEmbeddings) / scaling.HighFreqFactor
		var factors []float32
		for j := 0; j < rotary; j += 2 {
			freq := 1 / math.Pow(cfg.Theta(), float64(j)/float64(rotary))
			wavelen := 2 * math.Pi / freq
			switch {
			case wavelen < high:
				factors = append(factors, 1)
			case wavelen > low:
				factors = append(factors, float32(scaling.Factor))
			default:
				smooth := (float64(scaling.OriginalMaxPositionEmbeddings)/wavelen - scaling.LowFreqFactor) / (scaling.HighFreqFactor - scaling.LowFreqFactor)
				factors = append(factors, float32(1/((1-smooth)/scaling.Factor+smooth)))
			}
		}
		g.tensors = append(g.tensors, ggufTestTensor{name: "rope_freqs.weight", dims: []uint64{uint64(len(factors))}, data: factors})
	case "longrope":
		g.tensors = append(g.tensors,
			ggufTestTensor{name: "rope_factors_long.weight", dims: []uint64{uint64(len(scaling.LongFactor))}, data: toF32(scaling.LongFactor)},
			ggufTestTensor{name: "rope_factors_short.weight", dims: []uint64{uint64(len(scaling.ShortFactor))}, data: toF32(scaling.ShortFactor)})
		orig := cfgJSON["original_max_position_embeddings"].(float64)
		g.add(arch+".rope.scaling.original_context_length", uint32(orig))
	}
	switch arch {
	case "gemma2", "gemma3", "phi3":
		if cfg.SlidingWindow != nil {
			g.add(arch+".attention.sliding_window", u(*cfg.SlidingWindow))
		}
	default:
		delete(cfgJSON, "sliding_window") // llama and qwen2 files carry none
		delete(cfgJSON, "use_sliding_window")
	}
	if arch == "gemma2" || arch == "gemma3" {
		cfgJSON["query_pre_attn_scalar"] = headDim // llama.cpp: the head size below 27B
	}
	if arch == "gemma3" {
		cfgJSON["sliding_window_pattern"] = 6 // llama.cpp's when the file says none
	}
	if arch == "gemma2" {
		for _, k := range []string{"attn_logit_softcapping", "final_logit_softcapping"} {
			if v, ok := cfgJSON[k].(float64); ok {
				g.add(arch+"."+k, float32(v))
			}
		}
	}
	// A byte-level vocabulary of vocab_size tokens, no merges.
	var tokens []string
	for i := range cfg.VocabSize {
		tokens = append(tokens, fmt.Sprintf("tok%d", i))
	}
	g.add("tokenizer.ggml.model", "gpt2")
	g.add("tokenizer.ggml.pre", "default")
	g.add("tokenizer.ggml.tokens", tokens)
	g.add("tokenizer.ggml.merges", []string{})
	types := make([]int32, len(tokens))
	for i := range types {
		types[i] = 1
	}
	g.add("tokenizer.ggml.token_type", types)
	g.add("tokenizer.ggml.eos_token_id", uint32(0))

	names := map[string]string{"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
	layer := map[string]string{"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
		"self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.qkv_proj": "attn_qkv",
		"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
		"mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
		"post_attention_layernorm": "ffn_norm", "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
	if arch == "gemma2" || arch == "gemma3" {
		layer["post_attention_layernorm"] = "post_attention_norm"
	}
	for name, ten := range w {
		gname, ok := names[name]
		if !ok {
			var i int
			var rest string
			if _, err := fmt.Sscanf(name, "model.layers.%d.%s", &i, &rest); err != nil {
				t.Fatalf("%s: tensor %s", dir, name)
			}
			suffix := rest[strings.LastIndex(rest, ".")+1:]
			base, ok := layer[strings.TrimSuffix(rest, "."+suffix)]
			if !ok {
				t.Fatalf("%s: tensor %s has no GGUF name here", dir, name)
			}
			gname = fmt.Sprintf("blk.%d.%s.%s", i, base, suffix)
		}
		data := append([]float32(nil), ten.Data...)
		if arch == "llama" && (strings.Contains(gname, ".attn_q.") || strings.Contains(gname, ".attn_k.")) {
			heads := cfg.NumAttentionHeads
			if strings.Contains(gname, ".attn_k.") {
				heads = cfg.KVHeads()
			}
			data = permuteRotary(data, ten.Shape, heads)
		}
		if strings.HasPrefix(arch, "gemma") && strings.HasSuffix(gname, "norm.weight") {
			for i := range data {
				data[i]++
			}
		}
		dims := make([]uint64, len(ten.Shape))
		for i, d := range ten.Shape {
			dims[len(dims)-1-i] = uint64(d)
		}
		linear := len(dims) == 2 && strings.HasPrefix(gname, "blk.") && !strings.Contains(gname, "norm")
		typ := uint32(ggmlF32)
		if linear && linearType != nil {
			typ = linearType(gname)
		}
		g.tensors = append(g.tensors, ggufTestTensor{name: gname, dims: dims, data: data, typ: typ})
	}
	if err := g.write(path); err != nil {
		t.Fatal(err)
	}
	return arch, cfgJSON
}

func toF32(xs []float64) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = float32(x)
	}
	return out
}

// permuteRotary is convert_hf_to_gguf.py's LlamaModel.permute: within each head, the
// rows [2][D/2] become [D/2][2].
func permuteRotary(data []float32, shape []int, heads int) []float32 {
	rows, cols := shape[0], 1
	if len(shape) == 2 {
		cols = shape[1]
	}
	d := rows / heads
	out := make([]float32, len(data))
	for h := range heads {
		for j := range 2 {
			for i := range d / 2 {
				src := (h*d + j*d/2 + i) * cols
				dst := (h*d + 2*i + j) * cols
				copy(out[dst:dst+cols], data[src:src+cols])
			}
		}
	}
	return out
}

// ggufFamiliesOutEnv names a folder TestGGUFFamiliesMatchCheckpoint copies every family's
// GGUF file into (FAMILY.gguf), for scripts/gguf-check.sh to run llama.cpp on them.
const ggufFamiliesOutEnv = "CONVEYOR_GGUF_FAMILIES_OUT"

// TestGGUFFamiliesForLlamaCpp writes, when CONVEYOR_GGUF_FAMILIES_OUT names a folder, a
// float32 GGUF file of Gemma 2 with 26 layers (gemma2_26.gguf: llama.cpp b4747 runs Gemma
// 2 only at the layer counts of its 2B, 9B and 27B, and scales queries by the head size
// at 2B), random weights on the gemma2 fixture's other sizes, for scripts/gguf-check.sh.
func TestGGUFFamiliesForLlamaCpp(t *testing.T) {
	out := os.Getenv(ggufFamiliesOutEnv)
	if out == "" {
		t.Skip("set " + ggufFamiliesOutEnv + " to write the files")
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "families", "gemma2", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	const layers = 26
	types := make([]string, layers)
	for i := range types {
		types[i] = "full_attention"
		if i%2 == 0 {
			types[i] = "sliding_attention"
		}
	}
	cfg["num_hidden_layers"], cfg["layer_types"], cfg["query_pre_attn_scalar"] = layers, types, cfg["head_dim"]
	dir := t.TempDir()
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := convert.WriteRandomCheckpoint(filepath.Join(dir, "config.json"), dir, 26); err != nil {
		t.Fatal(err)
	}
	writeFamilyGGUF(t, dir, filepath.Join(out, "gemma2_26.gguf"))
}

// TestGGUFFamiliesMatchCheckpoint: every family llama.cpp has an architecture for,
// written as a float32 GGUF file, builds and gives the logits of the same checkpoint
// built from its safetensors within 1e-4, at every position of the fixtures' sequences.
func TestGGUFFamiliesMatchCheckpoint(t *testing.T) {
	refs, err := filepath.Glob(filepath.Join("testdata", "families", "*", "reference.json"))
	if err != nil || len(refs) == 0 {
		t.Fatalf("no family fixtures: %v", err)
	}
	tested := 0
	for _, refPath := range refs {
		src := filepath.Dir(refPath)
		t.Run(filepath.Base(src), func(t *testing.T) {
			tmp := t.TempDir()
			file := filepath.Join(tmp, "model.gguf")
			arch, cfgJSON := writeFamilyGGUF(t, src, file)
			if arch == "" {
				t.Skip("no GGUF architecture for this model_type in llama.cpp's list here")
			}
			if dir := os.Getenv(ggufFamiliesOutEnv); dir != "" {
				raw, err := os.ReadFile(file)
				if err == nil {
					err = os.WriteFile(filepath.Join(dir, filepath.Base(src)+".gguf"), raw, 0o644)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			// The checkpoint the file stands for: the fixture's weights and its config as
			// a GGUF of this architecture can say it.
			ckpt := filepath.Join(tmp, "checkpoint")
			if err := os.MkdirAll(ckpt, 0o755); err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(cfgJSON)
			if err := os.WriteFile(filepath.Join(ckpt, "config.json"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			st, _ := filepath.Glob(filepath.Join(src, "*.safetensors"))
			for _, f := range st {
				if err := os.Symlink(mustAbs(t, f), filepath.Join(ckpt, filepath.Base(f))); err != nil {
					t.Fatal(err)
				}
			}
			fromGGUF, fromCkpt := filepath.Join(tmp, "gguf-built"), filepath.Join(tmp, "ckpt-built")
			if _, err := convert.BuildFromGGUF(file, fromGGUF, convert.Options{}); err != nil {
				t.Fatalf("BuildFromGGUF: %v", err)
			}
			if _, err := convert.BuildFromHF(ckpt, fromCkpt, convert.Options{}); err != nil {
				t.Fatalf("BuildFromHF: %v", err)
			}
			ref := loadFamilyReference(t, refPath)
			logits := func(dir string) [][]float32 { return familyLogits(t, dir, ref) }
			got, want := logits(fromGGUF), logits(fromCkpt)
			worst := 0.0
			for s := range want {
				for i := range want[s] {
					worst = max(worst, math.Abs(float64(got[s][i]-want[s][i])))
				}
			}
			if worst > 1e-4 {
				t.Fatalf("%s file: logits differ from the checkpoint's by %.2e", arch, worst)
			}
			tested++
		})
	}
	if tested < 8 {
		t.Errorf("%d families compared; want every one llama.cpp has an architecture for", tested)
	}
}

func mustAbs(t *testing.T, p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestGGUFRefusals: a GGUF file Conveyor cannot build is refused with one line that names
// why: an architecture outside the list (named, with the list), a file without a
// tokenizer, a tensor no architecture of the list has, and a file cut short.
func TestGGUFRefusals(t *testing.T) {
	tmp := t.TempDir()
	base := func(arch string) *ggufWriter {
		g := &ggufWriter{}
		g.add("general.architecture", arch)
		for k, v := range map[string]uint32{"context_length": 64, "embedding_length": 16, "block_count": 1,
			"feed_forward_length": 32, "attention.head_count": 2, "attention.head_count_kv": 1} {
			g.add(arch+"."+k, v)
		}
		return g
	}
	withVocab := func(g *ggufWriter) *ggufWriter {
		g.add("tokenizer.ggml.model", "gpt2")
		g.add("tokenizer.ggml.tokens", []string{"a", "b", "c", "d"})
		g.add("tokenizer.ggml.merges", []string{})
		g.tensors = append(g.tensors, ggufTestTensor{name: "token_embd.weight", dims: []uint64{16, 4}, data: make([]float32, 64)})
		return g
	}
	stray := withVocab(base("llama"))
	stray.tensors = append(stray.tensors, ggufTestTensor{name: "blk.0.ssm_in.weight", dims: []uint64{16, 16}, data: make([]float32, 256)})
	for _, tc := range []struct {
		name string
		g    *ggufWriter
		cut  int
		want string
	}{
		{"architecture", withVocab(base("mamba")), 0, `GGUF architecture "mamba" is not supported (supported: gemma, gemma2, gemma3, llama, phi3, qwen2, qwen3)`},
		{"no tokenizer", base("llama"), 0, "no tokenizer.ggml.tokens"},
		{"stray tensor", stray, 0, "tensor blk.0.ssm_in.weight is not one of a llama model's"},
		{"cut short", withVocab(base("llama")), 100, "gguf:"},
	} {
		path := filepath.Join(tmp, tc.name+".gguf")
		if err := tc.g.write(path); err != nil {
			t.Fatal(err)
		}
		if tc.cut > 0 {
			b, _ := os.ReadFile(path)
			if err := os.WriteFile(path, b[:tc.cut], 0o644); err != nil {
				t.Fatal(err)
			}
		}
		_, err := convert.BuildFromGGUF(path, filepath.Join(tmp, tc.name), convert.Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want one line with %q", tc.name, err, tc.want)
		}
	}
}

// TestGGUFQ8File: a family's checkpoint written with Q8_0 linear weights is built by
// default with int8 weights (Conveyor's nearest to Q8_0) and its logits stay within the
// int8 bound of the float checkpoint's (mean KL over the fixtures' positions, the bound
// TestFamiliesQuantized holds int8 to); with --quantize none it is served in float32,
// closer still.
// familyLogits opens the model directory dir on the step graph and returns every
// position's logits for the fixture's sequences, all in one step.
func familyLogits(t *testing.T, dir string, ref *familyReference) [][]float32 {
	t.Helper()
	m := openTestModel(t, dir, AttentionGraph)
	seqs := make([]int, len(ref.Sequences))
	for i := range seqs {
		seqs[i] = i
	}
	out, err := m.Forward(newTestCache(m.Spec(), len(seqs), 64, 16, 3).batch(seqs, ref.Sequences, true))
	if err != nil {
		t.Fatal(err)
	}
	return out.Logits
}

// ggufKL builds the GGUF file at file with quantization q into dir and returns the mean
// KL divergence of its next-token distributions from the family's PyTorch reference.
func ggufKL(t *testing.T, file, dir string, q convert.Quantization, ref *familyReference) float64 {
	t.Helper()
	if _, err := convert.BuildFromGGUF(file, dir, convert.Options{Quantize: q}); err != nil {
		t.Fatal(err)
	}
	logits := familyLogits(t, dir, ref)
	vocab := len(ref.Logits[0][0])
	sum, n := 0.0, 0
	for s, toks := range ref.Sequences {
		for p := range toks {
			want, have := logSoftmax64(ref.Logits[s][p]), logSoftmax(logits[s][p*vocab:(p+1)*vocab])
			for j := range want {
				sum += math.Exp(want[j]) * (want[j] - have[j])
			}
			n++
		}
	}
	return sum / float64(n)
}

// TestGGUFMixedQ4File: a file like a Q4_K_M one, mostly 4-bit with the tensors
// llama-quantize keeps wider in Q8_0 (attn_k, attn_v, ffn_down here), is built as int4 on
// the CPU with those linears int8 (WideInt8), closer to the reference than all int4.
func TestGGUFMixedQ4File(t *testing.T) {
	for _, family := range []string{"llama3", "qwen2"} {
		t.Run(family, func(t *testing.T) {
			src := filepath.Join("testdata", "families", family)
			tmp := t.TempDir()
			file := filepath.Join(tmp, "q4mixed.gguf")
			writeFamilyGGUFAs(t, src, file, func(name string) uint32 {
				if strings.Contains(name, ".attn_k.") || strings.Contains(name, ".attn_v.") || strings.Contains(name, ".ffn_down.") {
					return ggmlQ8_0
				}
				return ggmlQ4_0
			})
			q, holds, err := convert.GGUFQuantization(file, false)
			if err != nil || q.String() != "int4" || !q.WideInt8 || !strings.Contains(holds, "Q4_0") {
				t.Fatalf("GGUFQuantization: %+v (%s), %v; want int4 with its Q8_0 linears int8", q, holds, err)
			}
			if gq, _, _ := convert.GGUFQuantization(file, true); gq.String() != "int4" || gq.WideInt8 {
				t.Fatalf("on the GPU: %+v; want int4 throughout, the GPU taking no int8", gq)
			}
			ref := loadFamilyReference(t, filepath.Join(src, "reference.json"))
			mixedDir := filepath.Join(tmp, "mixed")
			mixed := ggufKL(t, file, mixedDir, q, ref)
			graph, err := os.ReadFile(filepath.Join(mixedDir, "step", "step.onnx"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(graph, []byte("MatMulNBits")) || !bytes.Contains(graph, []byte("Int8Linear")) {
				t.Fatalf("the step graph should hold int4 (MatMulNBits) and int8 (Int8Linear) linears")
			}
			all4 := q
			all4.WideInt8 = false
			int4 := ggufKL(t, file, filepath.Join(tmp, "int4"), all4, ref)
			t.Logf("%s Q4_0 file with Q8_0 attn_k/attn_v/ffn_down: mean KL from PyTorch %.5f with those int8, %.5f all int4", family, mixed, int4)
			if mixed >= int4 {
				t.Errorf("mean KL %.5f with the Q8_0 linears int8, %.5f all int4: want the mixed build closer", mixed, int4)
			}
		})
	}
}

func TestGGUFQ8File(t *testing.T) {
	for _, family := range []string{"llama3", "qwen2", "phi3"} { // rows a multiple of 32, as Q8_0 needs
		t.Run(family, func(t *testing.T) {
			src := filepath.Join("testdata", "families", family)
			tmp := t.TempDir()
			file := filepath.Join(tmp, "q8.gguf")
			writeFamilyGGUFAs(t, src, file, func(string) uint32 { return ggmlQ8_0 })
			q, holds, err := convert.GGUFQuantization(file, false)
			if err != nil || q.String() != "int8" || !strings.Contains(holds, "Q8_0") {
				t.Fatalf("GGUFQuantization: %v (%s), %v; want int8 for a Q8_0 file", q, holds, err)
			}
			if gq, _, _ := convert.GGUFQuantization(file, true); gq.String() != "none" {
				t.Fatalf("on the GPU: %v; want none (16-bit), the GPU taking no int8", gq)
			}
			ref := loadFamilyReference(t, filepath.Join(src, "reference.json"))
			none, _ := convert.ParseQuantization("none")
			klInt8, klFloat := ggufKL(t, file, filepath.Join(tmp, "int8"), q, ref), ggufKL(t, file, filepath.Join(tmp, "float"), none, ref)
			t.Logf("%s Q8_0 file: mean KL from PyTorch %.5f built int8, %.5f built float32", family, klInt8, klFloat)
			if klInt8 > 0.008 || klFloat > klInt8 {
				t.Errorf("mean KL %.5f (int8), %.5f (float32); want int8 within 0.008 and float32 no worse", klInt8, klFloat)
			}
		})
	}
}
