package build

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

// arch is what the graph builder needs to know about a checkpoint beyond its sizes:
// the ways its model_type departs from Llama, resolved from config.json once.
type arch struct {
	qkvBias    bool    // q, k and v projections have biases (Qwen2)
	qkNorm     bool    // per-head RMSNorm of q and k before rotary (Qwen3)
	normOffset float32 // RMSNorm multiplies by (normOffset + weight): 1 for Gemma
	embedScale float32 // embeddings are multiplied by it (Gemma: sqrt(hidden)); 0 = none
	act        string  // MLP activation: actSiLU, actGeluTanh or actGelu
	fused      bool    // checkpoint stores qkv_proj and gate_up_proj fused (Phi-3)
	window     []int   // per layer: sliding window in positions, 0 = full attention
	rotary     rotaryPlan
}

// rotaryPlan is the rotary embedding of every layer: rotate-half over the first dims
// of each head with the given inverse frequencies, cos and sin times factor.
type rotaryPlan struct {
	dims    int
	invFreq []float32 // dims/2 values
	factor  float32   // attention factor: cos and sin are multiplied by it (longrope)
	// maxPositions, when positive, caps the context below max_position_embeddings:
	// longrope's frequencies are only position-independent up to the original context.
	maxPositions int
}

// MLP activations.
const (
	actSiLU     = "silu"
	actGeluTanh = "gelu_pytorch_tanh"
	actGelu     = "gelu"
)

// archOf resolves cfg's model_type and options into an arch, refusing anything the
// graphs do not compute exactly as Hugging Face does. cfg must be valid. Errors wrap
// ErrBadConfig and name the config.json field and value.
func archOf(cfg *Config) (*arch, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	mt := cfg.ModelType
	if mt == "" {
		mt = "llama"
	}
	a := &arch{act: actSiLU}
	if cfg.NumLocalExperts > 0 || cfg.NumExperts > 0 {
		return nil, bad("num_local_experts/num_experts %d: mixtures of experts are not supported", max(cfg.NumLocalExperts, cfg.NumExperts))
	}
	if cfg.AttnLogitSoftcapping != nil || cfg.FinalLogitSoftcapping != nil {
		return nil, bad("attn_logit_softcapping/final_logit_softcapping are not supported for model_type %q", mt)
	}
	if cfg.MLPBias {
		return nil, bad("mlp_bias true is not supported")
	}
	if cfg.AttentionBias {
		return nil, bad("attention_bias true is not supported for model_type %q", mt)
	}
	act := cfg.HiddenAct
	window := 0
	switch mt {
	case "llama":
	case "mistral", "phi3":
		if cfg.SlidingWindow != nil {
			if *cfg.SlidingWindow <= 0 {
				return nil, bad("sliding_window %d must be positive or null", *cfg.SlidingWindow)
			}
			window = *cfg.SlidingWindow
		}
		a.fused = mt == "phi3"
	case "qwen2", "qwen3":
		if cfg.UseSlidingWindow != nil && *cfg.UseSlidingWindow {
			return nil, bad("use_sliding_window true is not supported for model_type %q (layers from max_window_layers on would need their own window)", mt)
		}
		a.qkvBias = mt == "qwen2"
		a.qkNorm = mt == "qwen3"
	case "gemma":
		a.normOffset = 1
		// As transformers' GemmaMLP: hidden_activation wins; without it the checkpoints
		// (whose hidden_act says "gelu") were trained with the tanh approximation.
		act = cfg.HiddenActivation
		if act == "" {
			act = actGeluTanh
		}
		a.embedScale = float32(math.Sqrt(float64(cfg.HiddenSize)))
	}
	switch act {
	case "", actSiLU:
		a.act = actSiLU
	case actGeluTanh, "gelu_new", "gelu_fast":
		a.act = actGeluTanh
	case actGelu:
		a.act = actGelu
	default:
		return nil, bad("hidden_act %q is not supported (want silu, gelu or gelu_pytorch_tanh)", act)
	}
	a.window = make([]int, cfg.NumHiddenLayers)
	for i := range a.window {
		a.window[i] = window
	}
	r, err := rotaryOf(cfg)
	if err != nil {
		return nil, err
	}
	a.rotary = r
	return a, nil
}

// RopeScalingParams is config.json's rope_scaling object.
type RopeScalingParams struct {
	RopeType                      string    `json:"rope_type"`
	Type                          string    `json:"type"` // the older key for rope_type
	Factor                        float64   `json:"factor"`
	LowFreqFactor                 float64   `json:"low_freq_factor"`
	HighFreqFactor                float64   `json:"high_freq_factor"`
	OriginalMaxPositionEmbeddings int       `json:"original_max_position_embeddings"`
	ShortFactor                   []float64 `json:"short_factor"`
	LongFactor                    []float64 `json:"long_factor"`
	AttentionFactor               *float64  `json:"attention_factor"`
}

// rotaryOf returns the rotary embedding cfg describes: head_dim (or its
// partial_rotary_factor share) turned with rope_theta's frequencies, rescaled as
// rope_scaling says: default, linear, llama3, and longrope up to the original context
// (where transformers uses the short factors; beyond it, it switches every position to
// the long factors, which a KV cache cannot follow, so the context is capped there).
func rotaryOf(cfg *Config) (rotaryPlan, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	headDim := cfg.HeadDimOrDefault()
	dims := headDim
	if f := cfg.PartialRotaryFactor; f != 0 {
		if f < 0 || f > 1 {
			return rotaryPlan{}, bad("partial_rotary_factor %g must be in (0, 1]", f)
		}
		dims = int(float64(headDim) * f) // as transformers: int(head_dim * factor)
		if dims%2 != 0 {
			return rotaryPlan{}, bad("partial_rotary_factor %g gives an odd rotary size %d", f, dims)
		}
	}
	// As transformers: 1 / theta ** (arange(0, dims, 2).float() / dims).
	inv := make([]float64, dims/2)
	for j := range inv {
		exp := float32(2*j) / float32(dims)
		inv[j] = float64(float32(1 / math.Pow(cfg.Theta(), float64(exp))))
	}
	raw := strings.TrimSpace(string(cfg.RopeScaling))
	if raw != "" && raw != "null" {
		var s RopeScalingParams
		if err := json.Unmarshal(cfg.RopeScaling, &s); err != nil {
			return rotaryPlan{}, bad("rope_scaling %s: %v", truncateForError(cfg.RopeScaling), err)
		}
		kind := s.RopeType
		if kind == "" {
			kind = s.Type
		}
		switch kind {
		case "default":
		case "linear":
			if s.Factor <= 0 {
				return rotaryPlan{}, bad("rope_scaling factor %g must be positive", s.Factor)
			}
			for j := range inv {
				inv[j] = float64(float32(inv[j]) / float32(s.Factor))
			}
		case "llama3":
			if err := llama3Frequencies(inv, s); err != nil {
				return rotaryPlan{}, err
			}
		case "longrope":
			return longRope(cfg, dims, s)
		default:
			return rotaryPlan{}, bad("rope_scaling rope_type %q is not supported (supported: default, linear, llama3, longrope)", kind)
		}
	}
	r := rotaryPlan{dims: dims, invFreq: make([]float32, len(inv)), factor: 1}
	for j, f := range inv {
		r.invFreq[j] = float32(f)
	}
	return r, nil
}

// longRope is transformers' _compute_longrope_parameters for sequences within the
// original context: inverse frequencies 1 / (short_factor[j] * theta^(2j/dims)) and
// the attention factor sqrt(1 + ln(factor) / ln(original)), factor being
// max_position_embeddings / original_max_position_embeddings (Phi-3's top-level field)
// or rope_scaling's factor. The context is capped at the original one.
func longRope(cfg *Config, dims int, s RopeScalingParams) (rotaryPlan, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: rope_scaling (longrope): %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	if len(s.ShortFactor) != dims/2 || len(s.LongFactor) != dims/2 {
		return rotaryPlan{}, bad("short_factor and long_factor have %d and %d values, want %d (rotary dims / 2)", len(s.ShortFactor), len(s.LongFactor), dims/2)
	}
	factor := s.Factor
	orig := cfg.OriginalMaxPositionEmbeddings
	if orig > 0 {
		factor = float64(cfg.MaxPositionEmbeddings) / float64(orig)
	} else {
		orig = s.OriginalMaxPositionEmbeddings
		if orig <= 0 {
			orig = cfg.MaxPositionEmbeddings
		}
	}
	if orig <= 1 {
		return rotaryPlan{}, bad("original_max_position_embeddings %d must be above 1", orig)
	}
	att := 1.0
	switch {
	case s.AttentionFactor != nil:
		att = *s.AttentionFactor
	case factor > 1:
		att = math.Sqrt(1 + math.Log(factor)/math.Log(float64(orig)))
	}
	r := rotaryPlan{dims: dims, invFreq: make([]float32, dims/2), factor: float32(att)}
	for j, f := range s.ShortFactor {
		if f <= 0 {
			return rotaryPlan{}, bad("short_factor[%d] = %g must be positive", j, f)
		}
		shape := float32(2*j) / float32(dims)
		r.invFreq[j] = 1 / (float32(f) * float32(math.Pow(cfg.Theta(), float64(shape))))
	}
	if cfg.MaxPositionEmbeddings > orig {
		r.maxPositions = orig
	}
	return r, nil
}

// llama3Frequencies rescales inv in place as transformers'
// _compute_llama3_parameters does: wavelengths above original/low_freq_factor are
// divided by factor, those below original/high_freq_factor kept, and the band between
// interpolated smoothly. The arithmetic is float32, as there.
func llama3Frequencies(inv []float64, s RopeScalingParams) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: rope_scaling (llama3): %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case s.Factor <= 0:
		return bad("factor %g must be positive", s.Factor)
	case s.LowFreqFactor <= 0 || s.HighFreqFactor <= s.LowFreqFactor:
		return bad("low_freq_factor %g and high_freq_factor %g must satisfy 0 < low < high", s.LowFreqFactor, s.HighFreqFactor)
	case s.OriginalMaxPositionEmbeddings <= 0:
		return bad("original_max_position_embeddings %d must be positive", s.OriginalMaxPositionEmbeddings)
	}
	factor, low, high := float32(s.Factor), float32(s.LowFreqFactor), float32(s.HighFreqFactor)
	old := float32(s.OriginalMaxPositionEmbeddings)
	lowWavelen, highWavelen := old/low, old/high
	for j, f64 := range inv {
		f := float32(f64)
		wavelen := float32(2*math.Pi) / f
		scaled := f
		if wavelen > lowWavelen {
			scaled = f / factor
		}
		if !(wavelen < highWavelen) && !(wavelen > lowWavelen) {
			smooth := (old/wavelen - low) / (high - low)
			scaled = (1-smooth)*scaled/factor + smooth*scaled
		}
		inv[j] = float64(scaled)
	}
	return nil
}

// WeightShapes returns every tensor a checkpoint for cfg holds, by its Hugging Face
// name, with its shape: Llama's names, plus q/k/v biases for Qwen2 and q_norm/k_norm
// for Qwen3, and Phi-3's fused qkv_proj and gate_up_proj in place of the separate
// projections. lm_head.weight is absent when the embeddings are tied. cfg must be valid.
func WeightShapes(cfg *Config) (map[string][]int, error) {
	a, err := archOf(cfg)
	if err != nil {
		return nil, err
	}
	return weightShapes(cfg, a), nil
}

func weightShapes(cfg *Config, a *arch) map[string][]int {
	H, I, V := cfg.HiddenSize, cfg.IntermediateSize, cfg.VocabSize
	D, NH, KV := cfg.HeadDimOrDefault(), cfg.NumAttentionHeads, cfg.KVHeads()
	s := map[string][]int{
		"model.embed_tokens.weight": {V, H},
		"model.norm.weight":         {H},
	}
	if !cfg.TieWordEmbeddings {
		s["lm_head.weight"] = []int{V, H}
	}
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		s[p+"input_layernorm.weight"] = []int{H}
		s[p+"post_attention_layernorm.weight"] = []int{H}
		s[p+"self_attn.o_proj.weight"] = []int{H, NH * D}
		s[p+"mlp.down_proj.weight"] = []int{H, I}
		if a.fused {
			s[p+"self_attn.qkv_proj.weight"] = []int{(NH + 2*KV) * D, H}
			s[p+"mlp.gate_up_proj.weight"] = []int{2 * I, H}
		} else {
			s[p+"self_attn.q_proj.weight"] = []int{NH * D, H}
			s[p+"self_attn.k_proj.weight"] = []int{KV * D, H}
			s[p+"self_attn.v_proj.weight"] = []int{KV * D, H}
			s[p+"mlp.gate_proj.weight"] = []int{I, H}
			s[p+"mlp.up_proj.weight"] = []int{I, H}
		}
		if a.qkvBias {
			s[p+"self_attn.q_proj.bias"] = []int{NH * D}
			s[p+"self_attn.k_proj.bias"] = []int{KV * D}
			s[p+"self_attn.v_proj.bias"] = []int{KV * D}
		}
		if a.qkNorm {
			s[p+"self_attn.q_norm.weight"] = []int{D}
			s[p+"self_attn.k_norm.weight"] = []int{D}
		}
	}
	return s
}

// modelPlan is everything a graph is built from: sizes, architecture and weights under
// the separate-projection names (Phi-3's fused tensors split into views).
type modelPlan struct {
	llamaDims
	cfg   *Config
	arch  *arch
	w     Weights
	quant Quantization
}

// contextLength is the longest sequence the built model serves: max_position_embeddings,
// or less when the rotary scaling caps it.
func (m *modelPlan) contextLength() int {
	if c := m.arch.rotary.maxPositions; c > 0 && c < m.cfg.MaxPositionEmbeddings {
		return c
	}
	return m.cfg.MaxPositionEmbeddings
}

// planModel validates cfg, w and q and resolves them into a modelPlan.
func planModel(cfg *Config, w Weights, q Quantization) (*modelPlan, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := q.validate(); err != nil {
		return nil, err
	}
	a, err := archOf(cfg)
	if err != nil {
		return nil, err
	}
	if err := checkWeights(cfg, a, w); err != nil {
		return nil, err
	}
	return &modelPlan{llamaDims: dimsOf(cfg), cfg: cfg, arch: a, w: unfused(cfg, a, w), quant: q}, nil
}

// unfused returns w with Phi-3's fused projections split into q/k/v and gate/up
// tensors that share the fused tensors' memory; other checkpoints come back as they are.
func unfused(cfg *Config, a *arch, w Weights) Weights {
	if !a.fused {
		return w
	}
	H, I := cfg.HiddenSize, cfg.IntermediateSize
	D, NH, KV := cfg.HeadDimOrDefault(), cfg.NumAttentionHeads, cfg.KVHeads()
	out := make(Weights, len(w)+3*cfg.NumHiddenLayers)
	for name, t := range w {
		out[name] = t
	}
	split := func(name string, parts []string, rows []int) {
		data := w[name].Data
		for k, part := range parts {
			n := rows[k] * H
			out[part] = &Tensor{Name: part, Shape: []int{rows[k], H}, Data: data[:n:n]}
			data = data[n:]
		}
		delete(out, name)
	}
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		split(p+"self_attn.qkv_proj.weight", []string{p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"}, []int{NH * D, KV * D, KV * D})
		split(p+"mlp.gate_up_proj.weight", []string{p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, []int{I, I})
	}
	return out
}

// checkWeights verifies that w holds every tensor cfg needs with the right shape and
// data length, and nothing the graph would silently ignore (biases it does not
// expect, norms of another architecture).
func checkWeights(cfg *Config, a *arch, w Weights) error {
	want := weightShapes(cfg, a)
	if _, ok := w["lm_head.weight"]; !ok && !cfg.TieWordEmbeddings {
		return fmt.Errorf("%w: lm_head.weight is missing and tie_word_embeddings is false", ErrBadWeights)
	}
	for _, name := range sortedKeys(want) {
		t, ok := w[name]
		if !ok || t == nil {
			return fmt.Errorf("%w: tensor %s is missing", ErrBadWeights, name)
		}
		if !equalInts(t.Shape, want[name]) {
			return fmt.Errorf("%w: tensor %s has shape %v, config.json implies %v", ErrBadWeights, name, t.Shape, want[name])
		}
		if len(t.Data) != t.NumElements() {
			return fmt.Errorf("%w: tensor %s has shape %v but %d values", ErrBadWeights, name, t.Shape, len(t.Data))
		}
	}
	for _, name := range sortedKeys(w) {
		if _, ok := want[name]; ok || name == "lm_head.weight" || strings.HasSuffix(name, "rotary_emb.inv_freq") {
			continue
		}
		if strings.HasSuffix(name, ".bias") {
			return fmt.Errorf("%w: tensor %s is a bias, which model_type %q does not have", ErrBadWeights, name, cfg.ModelType)
		}
		return fmt.Errorf("%w: tensor %s is not part of a model_type %q checkpoint", ErrBadWeights, name, cfg.ModelType)
	}
	return nil
}
