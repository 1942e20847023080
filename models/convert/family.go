package convert

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// A family is one model_type's reading of config.json. Each family is one file
// (family_<name>.go) that registers itself: the model_type values it reads, how
// config.json turns into the shared parameters of arch (norms, activation, biases, q/k
// norms, each layer's window and rotary, soft-caps, embedding and attention scales),
// its tensors, and what it refuses, naming the field and value. The builder, the
// step graph and the dense graph read only arch, never the model_type.
type family struct {
	// modelTypes are the config.json model_type values the family reads.
	modelTypes []string
	// resolve reads cfg into a, which archOf fills first with Llama's reading: a silu
	// MLP (hidden_act), rotary from rope_theta and rope_scaling on every layer, full
	// attention everywhere, scores scaled by 1/sqrt(head_dim). It changes what its
	// family does otherwise and refuses what the graphs would not compute as
	// transformers does; errors wrap ErrBadConfig and name the field.
	resolve func(cfg *Config, a *arch) error
	// tensors edits the Llama layout (llamaTensors) into the family's checkpoint
	// tensors; nil keeps it.
	tensors func(cfg *Config, s map[string][]int)
	// softcaps is set for a family that reads attn_logit_softcapping and
	// final_logit_softcapping; the others refuse them.
	softcaps bool
	// defaults fills transformers' defaults into the sizes config.json leaves out
	// (zero); nil for families whose configs always carry them.
	defaults func(c *Config)
	// text is set for a multimodal wrapper whose text model is served on its own.
	text *textModel
}

// textModel is the text half of a multimodal checkpoint (Gemma 3): config.json nests
// the text model's config under text_config, read as modelType, and the checkpoint
// stores its tensors under one of prefixes (mapped to the text model's names); the
// tensors under drop (the vision tower, the projector) are left out of the build.
type textModel struct {
	modelType string
	prefixes  map[string]string // checkpoint prefix -> text model prefix
	drop      []string
}

// textWeights returns w under the text model's tensor names when cfg was read from a
// multimodal wrapper's text_config, without the other modalities' tensors; otherwise w.
func textWeights(cfg *Config, w Weights) Weights {
	f := families[cfg.wrapper]
	if f == nil || f.text == nil {
		return w
	}
	out := make(Weights, len(w))
	for name, t := range w {
		if slices.ContainsFunc(f.text.drop, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		for from, to := range f.text.prefixes {
			if strings.HasPrefix(name, from) {
				name = to + strings.TrimPrefix(name, from)
				break
			}
		}
		out[name] = t
	}
	return out
}

// families maps every registered model_type to its family.
var families = map[string]*family{}

// registerFamily adds f under each of its model types; a type registered twice is a
// programming error.
func registerFamily(f *family) {
	for _, t := range f.modelTypes {
		if families[t] != nil {
			panic("convert: model_type " + t + " registered twice")
		}
		families[t] = f
	}
}

// supportedModelTypes returns the registered model types, sorted.
func supportedModelTypes() []string { return sortedKeys(families) }

// arch is what the graph builder needs to know about a checkpoint beyond its sizes,
// resolved from config.json once by its family.
type arch struct {
	family     *family
	qkvBias    bool    // q, k and v projections have biases (Qwen2)
	qkNorm     bool    // per-head RMSNorm of q and k before rotary (Qwen3, Gemma 3)
	normOffset float32 // RMSNorm multiplies by (normOffset + weight): 1 for Gemma
	embedScale float32 // embeddings are multiplied by it (Gemma: sqrt(hidden)); 0 = none
	act        string  // MLP activation: actSiLU, actGeluTanh or actGelu
	fused      bool    // checkpoint stores qkv_proj and gate_up_proj fused (Phi-3)
	// sandwich: the attention output and the MLP output are normalized before their
	// residual adds (post_attention_layernorm, post_feedforward_layernorm), and the MLP
	// input by pre_feedforward_layernorm (Gemma 2, 3).
	sandwich bool
	// queryScale multiplies q·k: 1/sqrt(head_dim), or 1/sqrt(query_pre_attn_scalar).
	queryScale float32
	// attnSoftcap bounds the scaled scores to c*tanh(s/c) before the mask;
	// finalSoftcap the logits likewise. 0 = none.
	attnSoftcap, finalSoftcap float32

	// window is every layer's sliding window in keys (the query's own included), 0 for
	// full attention.
	window []int
	// rotary is every layer's rotary plan (layers may share one); a plan with dims 0
	// turns nothing.
	rotary []*rotaryPlan
}

// rotaryPlan is the rotary embedding of a layer: rotate-half over the first dims of
// each head with the given inverse frequencies, cos and sin times factor.
type rotaryPlan struct {
	dims    int
	invFreq []float32 // dims/2 values
	factor  float32   // attention factor: cos and sin are multiplied by it (longrope)
	// maxPositions, when positive, caps the context below max_position_embeddings:
	// longrope's frequencies are only position-independent up to the original context.
	maxPositions int
}

// noRotary is the plan of a layer without position embeddings (SmolLM3's NoPE layers).
var noRotary = &rotaryPlan{factor: 1}

// contextCap returns the longest context the layers' rotary plans allow, 0 for no cap.
func (a *arch) contextCap() int {
	c := 0
	for _, r := range a.rotary {
		if r.maxPositions > 0 && (c == 0 || r.maxPositions < c) {
			c = r.maxPositions
		}
	}
	return c
}

// MLP activations.
const (
	actSiLU     = "silu"
	actGeluTanh = "gelu_pytorch_tanh"
	actGelu     = "gelu"
)

// badConfig returns an error wrapping ErrBadConfig.
func badConfig(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
}

// archOf resolves cfg's model_type and options into an arch through the model type's
// family, refusing anything the graphs do not compute exactly as Hugging Face does.
// cfg must be valid. Errors wrap ErrBadConfig and name the config.json field and value.
func archOf(cfg *Config) (*arch, error) {
	mt := modelTypeOrLlama(cfg)
	f := families[mt]
	if f == nil {
		return nil, badConfig("model_type %q is not supported (supported: %s)", mt, strings.Join(supportedModelTypes(), ", "))
	}
	if cfg.NumLocalExperts > 0 || cfg.NumExperts > 0 {
		return nil, badConfig("num_local_experts/num_experts %d: mixtures of experts are not supported", max(cfg.NumLocalExperts, cfg.NumExperts))
	}
	if !f.softcaps && (cfg.AttnLogitSoftcapping != nil || cfg.FinalLogitSoftcapping != nil) {
		return nil, badConfig("attn_logit_softcapping/final_logit_softcapping are not supported for model_type %q", mt)
	}
	if cfg.MLPBias {
		return nil, badConfig("mlp_bias true is not supported")
	}
	if cfg.AttentionBias {
		return nil, badConfig("attention_bias true is not supported for model_type %q", mt)
	}
	r, err := rotaryOf(cfg)
	if err != nil {
		return nil, err
	}
	n := cfg.NumHiddenLayers
	a := &arch{
		family:     f,
		act:        cfg.HiddenAct,
		queryScale: float32(1 / math.Sqrt(float64(cfg.HeadDimOrDefault()))),
		window:     make([]int, n),
		rotary:     make([]*rotaryPlan, n),
	}
	for i := range a.rotary {
		a.rotary[i] = &r
	}
	if err := f.resolve(cfg, a); err != nil {
		return nil, err
	}
	switch a.act {
	case "", actSiLU:
		a.act = actSiLU
	case actGeluTanh, "gelu_new", "gelu_fast":
		a.act = actGeluTanh
	case actGelu:
		a.act = actGelu
	default:
		return nil, badConfig("hidden_act %q is not supported (want silu, gelu or gelu_pytorch_tanh)", a.act)
	}
	return a, nil
}

// layerWindows sets a.window: window on the layers sliding reports, unless config.json
// names every layer's attention in layer_types, which then decides. A sliding layer
// needs a positive window.
func layerWindows(cfg *Config, a *arch, window int, sliding func(layer int) bool) error {
	n := cfg.NumHiddenLayers
	if cfg.LayerTypes != nil {
		if len(cfg.LayerTypes) != n {
			return badConfig("layer_types has %d entries for %d layers", len(cfg.LayerTypes), n)
		}
		sliding = func(i int) bool { return cfg.LayerTypes[i] == "sliding_attention" }
		for i, t := range cfg.LayerTypes {
			if t != "sliding_attention" && t != "full_attention" {
				return badConfig("layer_types[%d] %q is not supported (want full_attention or sliding_attention)", i, t)
			}
		}
	}
	for i := range a.window {
		a.window[i] = 0
		if sliding(i) {
			if window <= 0 {
				return badConfig("sliding_window %d must be positive for sliding layer %d", window, i)
			}
			a.window[i] = window
		}
	}
	return nil
}

// optionalWindow reads a sliding_window that applies to every layer when set (Mistral,
// Phi-3): positive or null.
func optionalWindow(cfg *Config, a *arch) error {
	if cfg.SlidingWindow == nil {
		return nil
	}
	w := *cfg.SlidingWindow
	if w <= 0 {
		return badConfig("sliding_window %d must be positive or null", w)
	}
	for i := range a.window {
		a.window[i] = w
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
	s := llamaTensors(cfg)
	if a.family.tensors != nil {
		a.family.tensors(cfg, s)
	}
	return s
}

// llamaTensors is Llama's checkpoint layout for cfg.
func llamaTensors(cfg *Config) map[string][]int {
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
		p := layerPrefix(i)
		s[p+"input_layernorm.weight"] = []int{H}
		s[p+"post_attention_layernorm.weight"] = []int{H}
		s[p+"self_attn.q_proj.weight"] = []int{NH * D, H}
		s[p+"self_attn.k_proj.weight"] = []int{KV * D, H}
		s[p+"self_attn.v_proj.weight"] = []int{KV * D, H}
		s[p+"self_attn.o_proj.weight"] = []int{H, NH * D}
		s[p+"mlp.gate_proj.weight"] = []int{I, H}
		s[p+"mlp.up_proj.weight"] = []int{I, H}
		s[p+"mlp.down_proj.weight"] = []int{H, I}
	}
	return s
}

// layerPrefix is the tensor name prefix of layer i.
func layerPrefix(i int) string { return fmt.Sprintf("model.layers.%d.", i) }

// addQKNorms adds per-head q_norm and k_norm weights to every layer of s.
func addQKNorms(cfg *Config, s map[string][]int) {
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		s[layerPrefix(i)+"self_attn.q_norm.weight"] = []int{cfg.HeadDimOrDefault()}
		s[layerPrefix(i)+"self_attn.k_norm.weight"] = []int{cfg.HeadDimOrDefault()}
	}
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
	if c := m.arch.contextCap(); c > 0 && c < m.cfg.MaxPositionEmbeddings {
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
		data, bits := w[name].Data, w[name].SourceBits
		for k, part := range parts {
			n := rows[k] * H
			out[part] = &Tensor{Name: part, Shape: []int{rows[k], H}, Data: data[:n:n], SourceBits: bits}
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
		if !slices.Equal(t.Shape, want[name]) {
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
