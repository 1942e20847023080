package convert

// Phi-3, Phi-3.5, Phi-4-mini: fused qkv_proj and gate_up_proj (split into views of
// the checkpoint's memory by unfused), partial_rotary_factor, longrope within the
// original context, and an optional sliding_window on every layer.
func init() {
	registerFamily(&family{
		modelTypes: []string{"phi3"},
		resolve: func(cfg *Config, a *arch) error {
			a.fused = true
			return optionalWindow(cfg, a)
		},
		tensors: func(cfg *Config, s map[string][]int) {
			H, I := cfg.HiddenSize, cfg.IntermediateSize
			D, NH, KV := cfg.HeadDimOrDefault(), cfg.NumAttentionHeads, cfg.KVHeads()
			for i := 0; i < cfg.NumHiddenLayers; i++ {
				p := layerPrefix(i)
				for _, n := range []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"} {
					delete(s, p+n+".weight")
				}
				s[p+"self_attn.qkv_proj.weight"] = []int{(NH + 2*KV) * D, H}
				s[p+"mlp.gate_up_proj.weight"] = []int{2 * I, H}
			}
		},
	})
}
