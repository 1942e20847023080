package convert

// Mistral: Llama with an optional sliding_window on every layer.
func init() {
	registerFamily(&family{
		modelTypes: []string{"mistral"},
		resolve:    optionalWindow,
	})
}
