package convert

import "math"

// Gemma: embeddings times sqrt(hidden_size), RMSNorm times (1 + weight) and a tanh
// GELU MLP.
func init() {
	registerFamily(&family{
		modelTypes: []string{"gemma"},
		resolve: func(cfg *Config, a *arch) error {
			gemmaCommon(cfg, a)
			return nil
		},
	})
}

// gemmaCommon sets what every Gemma generation shares: the embedding scale, the
// (1 + weight) norms and the MLP activation. As transformers' Gemma MLPs do,
// hidden_activation wins; without it the checkpoints (whose hidden_act says "gelu")
// were trained with the tanh approximation.
func gemmaCommon(cfg *Config, a *arch) {
	a.normOffset = 1
	a.embedScale = float32(math.Sqrt(float64(cfg.HiddenSize)))
	a.act = cfg.HiddenActivation
	if a.act == "" {
		a.act = actGeluTanh
	}
}
