package api

import (
	"encoding/json"
	"math"
	"strconv"

	"github.com/conveyor-llm/conveyor/engine"
)

// jsonFloat is a logprob on the wire: NaN (no value, e.g. the first prompt token) is null,
// and -Inf (a token masked out) is -9999 because JSON has no infinities.
type jsonFloat float64

// MarshalJSON implements json.Marshaler.
func (f jsonFloat) MarshalJSON() ([]byte, error) {
	x := float64(f)
	switch {
	case math.IsNaN(x):
		return []byte("null"), nil
	case math.IsInf(x, -1) || x < -9999:
		return []byte("-9999.0"), nil
	case math.IsInf(x, 1):
		return []byte("0"), nil
	}
	return strconv.AppendFloat(nil, x, 'g', -1, 32), nil
}

// finishReason is the wire value of an engine finish reason (null while running).
func finishReason(r engine.FinishReason) *string {
	var s string
	switch r {
	case "":
		return nil
	case engine.FinishStop:
		s = "stop"
	case engine.FinishLength:
		s = "length"
	default:
		s = string(r)
	}
	return &s
}

// nullJSON is the literal used for "usage": null on stream chunks with include_usage.
var nullJSON = json.RawMessage("null")

// rawJSON marshals v for a json.RawMessage field.
func rawJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		return nullJSON
	}
	return b
}

// modelJSON is one entry of /v1/models.
type modelJSON struct {
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
