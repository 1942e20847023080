package convert

// Llama (1, 2, 3.x): the shape every other family departs from. archOf's defaults are
// its reading: rope_scaling default, linear or llama3; hidden_act silu or gelu.
func init() {
	registerFamily(&family{
		modelTypes: []string{"llama"},
		resolve:    func(cfg *Config, a *arch) error { return nil },
	})
}
