package convert

import "math"

// Gemma 2: Gemma plus four norms per layer (the attention and MLP outputs are
// normalized before their residual adds, post_attention_layernorm and
// post_feedforward_layernorm, and the MLP input by pre_feedforward_layernorm),
// attention scaled by 1/sqrt(query_pre_attn_scalar), scores soft-capped before the
// mask (attn_logit_softcapping) and logits after the head (final_logit_softcapping),
// and sliding and full layers alternating (layer_types; without it the even layers
// slide). Absent fields take Gemma2Config's defaults; a null soft-cap is none.
func init() {
	registerFamily(&family{
		modelTypes: []string{"gemma2"},
		softcaps:   true,
		resolve: func(cfg *Config, a *arch) error {
			if err := gemmaSizes(cfg); err != nil {
				return err
			}
			gemmaCommon(cfg, a)
			a.sandwich = true
			var err error
			if a.queryScale, err = queryPreAttnScale(cfg); err != nil {
				return err
			}
			if a.attnSoftcap, err = softcap(cfg, "attn_logit_softcapping", cfg.AttnLogitSoftcapping, 50); err != nil {
				return err
			}
			if a.finalSoftcap, err = softcap(cfg, "final_logit_softcapping", cfg.FinalLogitSoftcapping, 30); err != nil {
				return err
			}
			return layerWindows(cfg, a, gemmaWindow(cfg), func(i int) bool { return i%2 == 0 })
		},
		tensors: addSandwichNorms,
	})
}

// gemmaSizes refuses a Gemma 2 or 3 config without head_dim: transformers' default
// (256) is not hidden_size / num_attention_heads, which the builder would take.
func gemmaSizes(cfg *Config) error {
	if cfg.HeadDim == 0 {
		return badConfig("head_dim is missing for model_type %q (transformers' default 256 would apply)", cfg.ModelType)
	}
	return nil
}

// queryPreAttnScale is 1/sqrt(query_pre_attn_scalar), Gemma2Config's and
// Gemma3TextConfig's default 256 when absent.
func queryPreAttnScale(cfg *Config) (float32, error) {
	s := 256.0
	if cfg.QueryPreAttnScalar != nil {
		s = *cfg.QueryPreAttnScalar
	}
	if !(s > 0) {
		return 0, badConfig("query_pre_attn_scalar %g must be positive", s)
	}
	return float32(math.Pow(s, -0.5)), nil
}

// softcap reads a soft-cap field: def when absent, none when null.
func softcap(cfg *Config, key string, v *float64, def float64) (float32, error) {
	switch {
	case v != nil && !(*v > 0):
		return 0, badConfig("%s %g must be positive or null", key, *v)
	case v != nil:
		return float32(*v), nil
	case cfg.isNull(key):
		return 0, nil
	}
	return float32(def), nil
}

// gemmaWindow is sliding_window, 4096 when absent (Gemma2Config, Gemma3TextConfig);
// null leaves the sliding layers without a window, which layerWindows refuses.
func gemmaWindow(cfg *Config) int {
	switch {
	case cfg.SlidingWindow != nil:
		return *cfg.SlidingWindow
	case cfg.isNull("sliding_window"):
		return 0
	}
	return 4096
}

// addSandwichNorms adds Gemma 2's and 3's pre_feedforward_layernorm and
// post_feedforward_layernorm to every layer.
func addSandwichNorms(cfg *Config, s map[string][]int) {
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		s[layerPrefix(i)+"pre_feedforward_layernorm.weight"] = []int{cfg.HiddenSize}
		s[layerPrefix(i)+"post_feedforward_layernorm.weight"] = []int{cfg.HiddenSize}
	}
}
