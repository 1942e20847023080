package convert

import "slices"

// SmolLM3: Llama with layers that have no position embeddings at all (no_rope_layers:
// 1 for a layer with rotary, 0 for one without; without the list, every
// no_rope_layer_interval-th layer, 4 by default, has none). With use_sliding_window,
// the layers without rotary slide, as SmolLM3Config sets layer_types, unless
// layer_types names them.
func init() {
	registerFamily(&family{
		modelTypes: []string{"smollm3"},
		resolve: func(cfg *Config, a *arch) error {
			n := cfg.NumHiddenLayers
			ropeLayers := cfg.NoRopeLayers
			if len(ropeLayers) == 0 {
				interval := 4
				if cfg.NoRopeLayerInterval != nil {
					interval = *cfg.NoRopeLayerInterval
				}
				if interval <= 0 {
					return badConfig("no_rope_layer_interval %d must be positive", interval)
				}
				ropeLayers = make([]int, n)
				for i := range ropeLayers {
					if (i+1)%interval != 0 {
						ropeLayers[i] = 1
					}
				}
			}
			if len(ropeLayers) < n {
				return badConfig("no_rope_layers has %d entries for %d layers", len(ropeLayers), n)
			}
			for i := 0; i < n; i++ {
				switch ropeLayers[i] {
				case 0:
					a.rotary[i] = noRotary
				case 1:
				default:
					return badConfig("no_rope_layers[%d] %d must be 0 (no rotary) or 1", i, ropeLayers[i])
				}
			}
			window := 0
			useWindow := cfg.UseSlidingWindow != nil && *cfg.UseSlidingWindow && cfg.SlidingWindow != nil
			if useWindow {
				window = *cfg.SlidingWindow
			} else if i := slices.Index(cfg.LayerTypes, "sliding_attention"); i >= 0 {
				return badConfig("layer_types[%d] sliding_attention without use_sliding_window and sliding_window is not supported", i)
			}
			return layerWindows(cfg, a, window, func(i int) bool { return useWindow && ropeLayers[i] == 0 })
		},
	})
}
