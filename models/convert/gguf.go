package convert

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/conveyor-llm/conveyor/models/gguf"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// A GGUF file (llama.cpp's format) is built as a Hugging Face checkpoint would be: its
// metadata become the config.json transformers would read for the same model, its
// tokenizer metadata a tokenizer.json and tokenizer_config.json (the files of
// tokenizer.TokenizerFilesFromGGUF, with the file's chat template), and its tensors the
// checkpoint's weights under Hugging Face's names, undoing what llama.cpp's converter did
// to them: the rotary permutation of the llama architecture's query and key rows, and the
// 1 it adds to every Gemma norm weight. Every tensor type the reader decodes is
// dequantized to float32; --quantize then stores the linear layers as it does for a
// checkpoint.

// ggufArchs are the GGUF architectures built, with the model_type and architectures
// entry of the config.json they become.
var ggufArchs = map[string]struct{ modelType, class string }{
	"llama":  {"llama", "LlamaForCausalLM"},
	"qwen2":  {"qwen2", "Qwen2ForCausalLM"},
	"qwen3":  {"qwen3", "Qwen3ForCausalLM"},
	"gemma":  {"gemma", "GemmaForCausalLM"},
	"gemma2": {"gemma2", "Gemma2ForCausalLM"},
	"gemma3": {"gemma3_text", "Gemma3ForCausalLM"},
	"phi3":   {"phi3", "Phi3ForCausalLM"},
}

// ggufArchNames lists ggufArchs' names, sorted, for errors.
func ggufArchNames() string {
	var names []string
	for n := range ggufArchs {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// ggufModel is a GGUF file read as a checkpoint.
type ggufModel struct {
	configJSON              []byte
	cfg                     *Config
	weights                 Weights
	tokenizerJSON, tokenCfg []byte
}

// readGGUF reads the GGUF file at path as a checkpoint: its config, tokenizer files and
// float32 weights under Hugging Face's names.
func readGGUF(path string) (*ggufModel, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	arch := f.Metadata.Architecture()
	a, ok := ggufArchs[arch]
	if !ok {
		return nil, fmt.Errorf("%w: %s: GGUF architecture %q is not supported (supported: %s)", ErrBadConfig, filepath.Base(path), arch, ggufArchNames())
	}
	vocab, err := ggufVocab(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	tokJSON, tokCfg, err := tokenizer.TokenizerFilesFromGGUF(vocab)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	hf, extra, err := ggufConfig(f, arch, a.modelType, a.class, vocab)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	configJSON, err := json.MarshalIndent(hf, "", "  ")
	if err != nil {
		return nil, err
	}
	cfg, err := parseConfig(configJSON)
	if err != nil {
		return nil, fmt.Errorf("%s: the config read from its metadata: %w", filepath.Base(path), err)
	}
	if err := cfg.Validate(); err != nil { // before the weights are decoded, in their sizes
		return nil, fmt.Errorf("%s: the config read from its metadata: %w", filepath.Base(path), err)
	}
	if err := checkBuildMemory(filepath.Base(path), cfg); err != nil {
		return nil, err
	}
	cfg.ropeFreqFactors = extra.ropeFreqFactors
	w, err := ggufWeights(f, arch, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return &ggufModel{configJSON: configJSON, cfg: cfg, weights: w, tokenizerJSON: tokJSON, tokenCfg: tokCfg}, nil
}

// ggufVocab reads the file's tokenizer metadata.
func ggufVocab(f *gguf.File) (*tokenizer.GGUFVocab, error) {
	v := &tokenizer.GGUFVocab{BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1, EOM: -1}
	v.Model, _ = f.Metadata.String("tokenizer.ggml.model")
	v.Pre, _ = f.Metadata.String("tokenizer.ggml.pre")
	tokens, ok := f.Metadata.Strings("tokenizer.ggml.tokens")
	if !ok {
		return nil, fmt.Errorf("%w: no tokenizer.ggml.tokens: the file carries no tokenizer", ErrBadConfig)
	}
	v.Tokens = tokens
	if s, ok := f.Metadata.Floats("tokenizer.ggml.scores"); ok {
		v.Scores = make([]float32, len(s))
		for i, x := range s {
			v.Scores[i] = float32(x)
		}
	}
	if t, ok := f.Metadata.Ints("tokenizer.ggml.token_type"); ok {
		v.Types = make([]int32, len(t))
		for i, x := range t {
			v.Types[i] = int32(x)
		}
	}
	v.Merges, _ = f.Metadata.Strings("tokenizer.ggml.merges")
	for key, dst := range map[string]*int32{
		"tokenizer.ggml.bos_token_id": &v.BOS, "tokenizer.ggml.eos_token_id": &v.EOS,
		"tokenizer.ggml.unknown_token_id": &v.UNK, "tokenizer.ggml.padding_token_id": &v.PAD,
		"tokenizer.ggml.eot_token_id": &v.EOT, "tokenizer.ggml.eom_token_id": &v.EOM,
	} {
		if id, ok := f.Metadata.Uint(key); ok && id < uint64(len(tokens)) {
			*dst = int32(id)
		}
	}
	for key, dst := range map[string]**bool{
		"tokenizer.ggml.add_bos_token": &v.AddBOS, "tokenizer.ggml.add_eos_token": &v.AddEOS,
		"tokenizer.ggml.add_space_prefix": &v.AddSpacePrefix,
	} {
		if b, ok := f.Metadata.Bool(key); ok {
			*dst = &b
		}
	}
	v.ChatTemplate, _ = f.Metadata.String("tokenizer.chat_template")
	return v, nil
}

// ggufExtra is what a GGUF file says that config.json cannot: llama 3's rope scaling as
// one factor per frequency (the rope_freqs tensor).
type ggufExtra struct {
	ropeFreqFactors []float32
}

// ggufConfig returns the config.json transformers would read for the model the file
// holds, and what config.json cannot say.
func ggufConfig(f *gguf.File, arch, modelType, class string, vocab *tokenizer.GGUFVocab) (map[string]any, ggufExtra, error) {
	var extra ggufExtra
	need := func(key string) (uint64, error) {
		v, ok := f.Metadata.Uint(arch + "." + key)
		if !ok || v == 0 || v > math.MaxInt32 {
			return 0, fmt.Errorf("%w: metadata %s.%s is missing or out of range", ErrBadConfig, arch, key)
		}
		return v, nil
	}
	hidden, err := need("embedding_length")
	if err != nil {
		return nil, extra, err
	}
	layers, err := need("block_count")
	if err != nil {
		return nil, extra, err
	}
	ff, err := need("feed_forward_length")
	if err != nil {
		return nil, extra, err
	}
	heads, err := need("attention.head_count")
	if err != nil {
		return nil, extra, err
	}
	kvHeads, ok := f.Metadata.Uint(arch + ".attention.head_count_kv")
	if !ok {
		kvHeads = heads
	}
	headDim := hidden / heads
	if k, ok := f.Metadata.Uint(arch + ".attention.key_length"); ok && k > 0 {
		headDim = k
	}
	ctx, err := need("context_length")
	if err != nil {
		return nil, extra, err
	}
	eps, ok := f.Metadata.Float(arch + ".attention.layer_norm_rms_epsilon")
	if !ok {
		eps = 1e-6
	}
	theta, ok := f.Metadata.Float(arch + ".rope.freq_base")
	if !ok {
		theta = 10000
	}
	emb, ok := f.Tensor("token_embd.weight")
	if !ok || len(emb.Dims) != 2 {
		return nil, extra, fmt.Errorf("%w: no token_embd.weight matrix", ErrBadConfig)
	}
	vocabSize := emb.Dims[1]
	_, untied := f.Tensor("output.weight")
	hf := map[string]any{
		"model_type":              modelType,
		"architectures":           []string{class},
		"hidden_size":             hidden,
		"intermediate_size":       ff,
		"num_hidden_layers":       layers,
		"num_attention_heads":     heads,
		"num_key_value_heads":     kvHeads,
		"head_dim":                headDim,
		"max_position_embeddings": ctx,
		"rms_norm_eps":            eps,
		"rope_theta":              theta,
		"vocab_size":              vocabSize,
		"tie_word_embeddings":     !untied,
		"torch_dtype":             "float32",
	}
	if vocab.BOS >= 0 {
		hf["bos_token_id"] = vocab.BOS
	}
	var eos []int32
	for _, id := range []int32{vocab.EOS, vocab.EOT, vocab.EOM} {
		if id >= 0 && !containsInt32(eos, id) {
			eos = append(eos, id)
		}
	}
	if len(eos) > 0 {
		hf["eos_token_id"] = eos
	}
	if dims, ok := f.Metadata.Uint(arch + ".rope.dimension_count"); ok && dims > 0 && dims < headDim {
		hf["partial_rotary_factor"] = float64(dims) / float64(headDim)
	}
	if typ, _ := f.Metadata.String(arch + ".rope.scaling.type"); typ == "linear" {
		if factor, ok := f.Metadata.Float(arch + ".rope.scaling.factor"); ok && factor > 0 {
			hf["rope_scaling"] = map[string]any{"rope_type": "linear", "factor": factor}
		}
	}
	if t, ok := f.Tensor("rope_freqs.weight"); ok {
		factors, err := f.ReadFloat32(t.Name)
		if err != nil {
			return nil, extra, err
		}
		extra.ropeFreqFactors = factors
	}
	if long, ok := f.Tensor("rope_factors_long.weight"); ok {
		short, ok := f.Tensor("rope_factors_short.weight")
		if !ok {
			return nil, extra, fmt.Errorf("%w: rope_factors_long.weight without rope_factors_short.weight", ErrBadConfig)
		}
		l, err := f.ReadFloat32(long.Name)
		if err != nil {
			return nil, extra, err
		}
		s, err := f.ReadFloat32(short.Name)
		if err != nil {
			return nil, extra, err
		}
		orig, ok := f.Metadata.Uint(arch + ".rope.scaling.original_context_length")
		if !ok {
			return nil, extra, fmt.Errorf("%w: longrope factors without %s.rope.scaling.original_context_length", ErrBadConfig, arch)
		}
		hf["rope_scaling"] = map[string]any{"type": "longrope", "long_factor": l, "short_factor": s}
		hf["original_max_position_embeddings"] = orig
	}
	if w, ok := f.Metadata.Uint(arch + ".attention.sliding_window"); ok && w > 0 {
		hf["sliding_window"] = w
	}
	switch arch {
	case "qwen2":
		if _, ok := hf["sliding_window"]; ok {
			hf["use_sliding_window"] = true
		}
	case "gemma", "gemma2", "gemma3":
		hf["hidden_activation"] = "gelu_pytorch_tanh"
		if arch == "gemma" {
			break
		}
		// llama.cpp takes the attention scale from the model's size, as the checkpoints'
		// query_pre_attn_scalar says it: hidden/heads for the 27B models (46 and 62
		// layers), the head size otherwise.
		scalar := headDim
		if (arch == "gemma2" && layers == 46) || (arch == "gemma3" && layers == 62) {
			scalar = hidden / heads
		}
		hf["query_pre_attn_scalar"] = scalar
		if arch == "gemma2" {
			for _, k := range []string{"attn_logit_softcapping", "final_logit_softcapping"} {
				if c, ok := f.Metadata.Float(arch + "." + k); ok && c > 0 {
					hf[k] = c
				}
			}
			break
		}
		// Every pattern-th layer attends globally; llama.cpp takes 6 when the file says none.
		pattern := uint64(6)
		if p, ok := f.Metadata.Uint(arch + ".attention.sliding_window_pattern"); ok && p > 0 && p <= layers {
			pattern = p
		}
		hf["sliding_window_pattern"] = pattern
		hf["rope_local_base_freq"] = 10000.0
	default:
		hf["hidden_act"] = "silu"
	}
	return hf, extra, nil
}

func containsInt32(xs []int32, x int32) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

var ggufBlockTensor = regexp.MustCompile(`^blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias)$`)

// ggufLayerNames maps a layer tensor's GGUF name to its Hugging Face name under
// model.layers.N., per architecture where they differ.
func ggufLayerName(arch, name string) (string, bool) {
	switch name {
	case "attn_norm":
		return "input_layernorm", true
	case "attn_q":
		return "self_attn.q_proj", true
	case "attn_k":
		return "self_attn.k_proj", true
	case "attn_v":
		return "self_attn.v_proj", true
	case "attn_qkv":
		return "self_attn.qkv_proj", true
	case "attn_output":
		return "self_attn.o_proj", true
	case "attn_q_norm":
		return "self_attn.q_norm", true
	case "attn_k_norm":
		return "self_attn.k_norm", true
	case "post_attention_norm":
		return "post_attention_layernorm", true
	case "ffn_norm":
		if arch == "gemma2" || arch == "gemma3" {
			return "pre_feedforward_layernorm", true
		}
		return "post_attention_layernorm", true
	case "post_ffw_norm":
		return "post_feedforward_layernorm", true
	case "ffn_gate":
		return "mlp.gate_proj", true
	case "ffn_up":
		if arch == "phi3" {
			return "mlp.gate_up_proj", true
		}
		return "mlp.up_proj", true
	case "ffn_down":
		return "mlp.down_proj", true
	}
	return "", false
}

// ggufWeights reads every tensor of the file as float32 under its Hugging Face name.
func ggufWeights(f *gguf.File, arch string, cfg *Config) (Weights, error) {
	w := Weights{}
	for _, t := range f.Tensors() {
		var hfName string
		switch t.Name {
		case "token_embd.weight":
			hfName = "model.embed_tokens.weight"
		case "output_norm.weight":
			hfName = "model.norm.weight"
		case "output.weight":
			hfName = "lm_head.weight"
		case "rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight":
			continue // read into the config
		default:
			m := ggufBlockTensor.FindStringSubmatch(t.Name)
			if m == nil {
				return nil, fmt.Errorf("%w: tensor %s is not one of a %s model's", ErrBadConfig, t.Name, arch)
			}
			layer, _ := strconv.Atoi(m[1])
			name, ok := ggufLayerName(arch, m[2])
			if !ok || layer >= cfg.NumHiddenLayers {
				return nil, fmt.Errorf("%w: tensor %s is not one of a %s model's", ErrBadConfig, t.Name, arch)
			}
			hfName = fmt.Sprintf("model.layers.%d.%s.%s", layer, name, m[3])
		}
		data, err := f.ReadFloat32(t.Name)
		if err != nil {
			return nil, err
		}
		shape := make([]int, len(t.Dims))
		for i, d := range t.Dims {
			shape[len(shape)-1-i] = int(d) // GGUF lists the contiguous dimension first
		}
		if arch == "llama" && strings.Contains(t.Name, ".attn_q.") {
			unpermuteRotary(data, shape, cfg.NumAttentionHeads)
		}
		if arch == "llama" && strings.Contains(t.Name, ".attn_k.") {
			unpermuteRotary(data, shape, cfg.KVHeads())
		}
		if strings.HasPrefix(arch, "gemma") && strings.HasSuffix(t.Name, "norm.weight") {
			for i := range data {
				data[i]-- // llama.cpp's converter stores Gemma's norm weights as 1 + w
			}
		}
		w[hfName] = &Tensor{Name: hfName, Shape: shape, Data: data, SourceBits: t.Type.WeightBits()}
	}
	return w, nil
}

// unpermuteRotary undoes llama.cpp's permutation of a llama query or key projection
// (weight rows, or bias values): within each of heads heads, its converter moved row
// j·D/2 + i (the rotate-half pair's j-th member of frequency i) to row 2i + j. The rows
// go back in place.
func unpermuteRotary(data []float32, shape []int, heads int) {
	rows, cols := shape[0], 1
	if len(shape) == 2 {
		cols = shape[1]
	}
	if heads <= 0 || rows%heads != 0 || (rows/heads)%2 != 0 {
		return // not a rotary layout; the build checks the shapes
	}
	d := rows / heads
	tmp := make([]float32, d*cols)
	for h := range heads {
		head := data[h*d*cols : (h+1)*d*cols]
		for i := range d / 2 {
			for j := range 2 {
				copy(tmp[(j*d/2+i)*cols:(j*d/2+i+1)*cols], head[(2*i+j)*cols:(2*i+j+1)*cols])
			}
		}
		copy(head, tmp)
	}
}

// BuildFromGGUF writes a Conveyor model directory for the GGUF file at path, as
// BuildFromHF does for a checkpoint: config.json, tokenizer.json and
// tokenizer_config.json read from its metadata, next to the graphs. outDir is replaced
// as BuildFromHF replaces it.
func BuildFromGGUF(path, outDir string, o Options) (*BuildResult, error) {
	return buildModelDir(outDir, func(dir string) (*BuildResult, error) { return buildFromGGUF(path, dir, o) })
}

// buildFromGGUF is BuildFromGGUF writing straight into dir.
func buildFromGGUF(path, outDir string, o Options) (*BuildResult, error) {
	m, err := readGGUF(path)
	if err != nil {
		return nil, err
	}
	side, err := os.MkdirTemp("", "conveyor-gguf-")
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	defer os.RemoveAll(side)
	for name, b := range map[string][]byte{"config.json": m.configJSON, "tokenizer.json": m.tokenizerJSON, "tokenizer_config.json": m.tokenCfg} {
		if err := os.WriteFile(filepath.Join(side, name), b, 0o644); err != nil {
			return nil, fmt.Errorf("models: %w", err)
		}
	}
	return buildDir(m.cfg, textWeights(m.cfg, m.weights), filepath.Join(side, "config.json"), side, outDir, o, writeOptions{})
}

// IsGGUF reports whether path names a GGUF file (a regular file beginning with the
// GGUF magic).
func IsGGUF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	if _, err := f.Read(magic[:]); err != nil {
		return false
	}
	return string(magic[:]) == "GGUF"
}

// notGGUF refuses a path that names a file (not a directory) which is not a GGUF file:
// a directory was meant, or the file is not what its name says.
func notGGUF(path string) error {
	if st, err := os.Stat(path); err == nil && !st.IsDir() && !IsGGUF(path) {
		return fmt.Errorf("%w: %s is a file but not a GGUF file (it does not begin with GGUF's magic); give a GGUF file, a Hugging Face checkpoint directory or a built model directory",
			ErrNotCheckpoint, path)
	}
	return nil
}

// GGUFQuantization returns how the linear weights of the GGUF file at path are stored
// when --quantize does not say: as close to the file's own types as Conveyor's quantized
// linears come, weighing each linear weight by its size. Files whose linear weights are
// mostly 4-bit (Q4_0, Q4_1, Q4_K) get int4, and on the CPU the linears that the file holds
// with more bits (a Q4_K_M file's Q6_K and Q5_0 tensors: the layers llama-quantize keeps
// wider) int8 (WideInt8); mostly 5- to 8-bit ones (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0) int8,
// float files none.
// For the GPU (gpu), whose step graph takes no int8 weights, int8 becomes none (its
// 16-bit type). The second string says what the file holds, for the log.
func GGUFQuantization(path string, gpu bool) (Quantization, string, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return Quantization{}, "", err
	}
	defer f.Close()
	bits := map[int]int64{}
	types := map[string]int64{}
	for _, t := range f.Tensors() {
		m := ggufBlockTensor.FindStringSubmatch(t.Name)
		if m == nil || len(t.Dims) != 2 || m[3] != "weight" || !(strings.HasPrefix(m[2], "attn_") || strings.HasPrefix(m[2], "ffn_")) || strings.HasSuffix(m[2], "_norm") {
			continue
		}
		n := t.Elements()
		types[t.Type.String()] += n
		switch t.Type {
		case gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ4_K:
			bits[4] += n
		case gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ5_K, gguf.TypeQ6_K, gguf.TypeQ8_0:
			bits[8] += n
		default:
			bits[0] += n
		}
	}
	var names []string
	for name := range types {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool { return types[names[i]] > types[names[j]] })
	holds := "linear weights " + strings.Join(names, ", ")
	var q Quantization
	switch {
	case bits[4] >= bits[8] && bits[4] >= bits[0] && bits[4] > 0:
		q, _ = ParseQuantization("int4")
		q.WideInt8 = !gpu && bits[8] > 0
	case bits[8] >= bits[0] && bits[8] > 0 && !gpu:
		q, _ = ParseQuantization("int8")
	}
	return q, holds, nil
}
