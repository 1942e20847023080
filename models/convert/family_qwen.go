package convert

// Qwen2 and Qwen2.5 (q, k and v biases) and Qwen3 (per-head q_norm and k_norm before
// rotary). With use_sliding_window, the layers from max_window_layers on (or those
// layer_types calls sliding) attend to the last sliding_window keys, as transformers'
// Qwen2Config and Qwen3Config read it; without it, sliding_window is ignored.
func init() {
	registerFamily(&family{
		modelTypes: []string{"qwen2"},
		resolve: func(cfg *Config, a *arch) error {
			a.qkvBias = true
			return qwenWindows(cfg, a)
		},
		tensors: func(cfg *Config, s map[string][]int) {
			D, NH, KV := cfg.HeadDimOrDefault(), cfg.NumAttentionHeads, cfg.KVHeads()
			for i := 0; i < cfg.NumHiddenLayers; i++ {
				p := layerPrefix(i)
				s[p+"self_attn.q_proj.bias"] = []int{NH * D}
				s[p+"self_attn.k_proj.bias"] = []int{KV * D}
				s[p+"self_attn.v_proj.bias"] = []int{KV * D}
			}
		},
	})
	registerFamily(&family{
		modelTypes: []string{"qwen3"},
		resolve: func(cfg *Config, a *arch) error {
			a.qkNorm = true
			return qwenWindows(cfg, a)
		},
		tensors: addQKNorms,
	})
}

// qwenDefaultMaxWindowLayers is Qwen2Config's and Qwen3Config's max_window_layers.
const qwenDefaultMaxWindowLayers = 28

// qwenWindows sets the sliding layers of a Qwen2 or Qwen3 config.
func qwenWindows(cfg *Config, a *arch) error {
	if cfg.UseSlidingWindow == nil || !*cfg.UseSlidingWindow || cfg.SlidingWindow == nil {
		return nil // transformers sets sliding_window to None then
	}
	first := qwenDefaultMaxWindowLayers
	if cfg.MaxWindowLayers != nil {
		first = *cfg.MaxWindowLayers
	}
	if *cfg.SlidingWindow <= 0 {
		return badConfig("sliding_window %d must be positive with use_sliding_window", *cfg.SlidingWindow)
	}
	return layerWindows(cfg, a, *cfg.SlidingWindow, func(i int) bool { return i >= first })
}
