package convert

import "github.com/conveyor-llm/conveyor/models/modeldir"

// Gemma 3's text model (gemma3_text): Gemma 2's four norms per layer and
// query_pre_attn_scalar, plus per-head q_norm and k_norm (times 1 + weight), and two
// rotary embeddings: sliding layers turn by rope_local_base_freq without scaling, full
// layers by rope_theta with rope_scaling (linear in the released checkpoints). The
// sliding layers are those layer_types names, or else all but every
// sliding_window_pattern-th. Soft-caps are read as Gemma 2's but default to none.
// Absent fields take Gemma3TextConfig's defaults.
//
// A Gemma 3 checkpoint with vision (gemma3, Gemma3ForConditionalGeneration) is served
// as its text model: config.json's text_config is read as gemma3_text (its token ids
// and dtype from the top level when text_config has none), the language model's
// tensors are renamed to the text model's (language_model.model.* as transformers
// 4.50 saves them, model.language_model.* as later versions do) and the vision tower
// and projector are left out.
func init() {
	registerFamily(&family{
		modelTypes: []string{"gemma3_text"},
		softcaps:   true,
		resolve:    gemma3Resolve,
		defaults:   gemma3Defaults,
		tensors: func(cfg *Config, s map[string][]int) {
			addSandwichNorms(cfg, s)
			addQKNorms(cfg, s)
		},
	})
	registerFamily(&family{
		modelTypes: []string{"gemma3"},
		resolve: func(cfg *Config, a *arch) error {
			return badConfig("model_type \"gemma3\" is read through its text_config (LoadConfig)")
		},
		text: &textModel{
			modelType: "gemma3_text",
			prefixes: map[string]string{
				"language_model.model.":   "model.",
				"language_model.lm_head.": "lm_head.",
				"model.language_model.":   "model.",
			},
			drop: []string{"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."},
		},
	})
}

// gemma3Defaults fills Gemma3TextConfig's defaults for the sizes a config.json leaves
// out (released multimodal checkpoints write only what differs from them).
func gemma3Defaults(c *Config) {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.VocabSize, 262_208)
	def(&c.HiddenSize, 2304)
	def(&c.IntermediateSize, 9216)
	def(&c.NumHiddenLayers, 26)
	def(&c.NumAttentionHeads, 8)
	def(&c.NumKeyValueHeads, 4)
	def(&c.HeadDim, 256)
	def(&c.MaxPositionEmbeddings, 131_072)
	if c.RopeTheta == 0 {
		c.RopeTheta = 1_000_000
	}
	if c.BOSTokenID == nil && !c.isNull("bos_token_id") {
		bos := int32(2)
		c.BOSTokenID = &bos
	}
	if c.EOSTokenID == nil && !c.isNull("eos_token_id") {
		c.EOSTokenID = modeldir.TokenIDs{1}
	}
	if !c.has("tie_word_embeddings") {
		c.TieWordEmbeddings = true
	}
}

func gemma3Resolve(cfg *Config, a *arch) error {
	if err := gemmaSizes(cfg); err != nil {
		return err
	}
	gemmaCommon(cfg, a)
	a.sandwich = true
	a.qkNorm = true
	var err error
	if a.queryScale, err = queryPreAttnScale(cfg); err != nil {
		return err
	}
	if a.attnSoftcap, err = softcap(cfg, "attn_logit_softcapping", cfg.AttnLogitSoftcapping, 0); err != nil {
		return err
	}
	if a.finalSoftcap, err = softcap(cfg, "final_logit_softcapping", cfg.FinalLogitSoftcapping, 0); err != nil {
		return err
	}
	pattern := 6
	if cfg.SlidingWindowPattern != nil {
		pattern = *cfg.SlidingWindowPattern
	}
	if pattern <= 0 && cfg.LayerTypes == nil {
		return badConfig("sliding_window_pattern %d must be positive", pattern)
	}
	if err := layerWindows(cfg, a, gemmaWindow(cfg), func(i int) bool { return (i+1)%pattern != 0 }); err != nil {
		return err
	}
	global := *cfg
	if global.RopeTheta == 0 {
		global.RopeTheta = 1_000_000 // Gemma3TextConfig's rope_theta
	}
	full, err := rotaryOf(&global)
	if err != nil {
		return err
	}
	local := global
	local.RopeTheta = 10_000
	if cfg.RopeLocalBaseFreq != nil {
		if !(*cfg.RopeLocalBaseFreq > 0) {
			return badConfig("rope_local_base_freq %g must be positive", *cfg.RopeLocalBaseFreq)
		}
		local.RopeTheta = *cfg.RopeLocalBaseFreq
	}
	local.RopeScaling = nil
	sliding, err := rotaryOf(&local)
	if err != nil {
		return err
	}
	for i := range a.rotary {
		a.rotary[i] = &full
		if a.window[i] > 0 {
			a.rotary[i] = &sliding
		}
	}
	return nil
}
