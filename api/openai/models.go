package openai

// ModelCard is one served model as /v1/models lists it.
type ModelCard struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
	// Quantization is how the served weights are stored: "none", "int8" or "int4".
	Quantization string `json:"quantization,omitempty"`
	// KVCacheDType is the KV cache's element type.
	KVCacheDType string `json:"kv_cache_dtype,omitempty"`
}

// ModelList is GET /v1/models: {"data": [...], "object": "list"}.
type ModelList struct {
	Data   []ModelCard `json:"data"`
	Object string      `json:"object"`
}
