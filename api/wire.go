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

// envelope is the object both generation endpoints answer with, whole or as one chunk of
// a stream, around their own choices (completionResponse, chatResponse).
type envelope[C any] struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Choices []C             `json:"choices"`
	Usage   json.RawMessage `json:"usage,omitempty"`
}

// newEnvelope returns the envelope of one answer. A stream with
// stream_options.include_usage carries "usage": null on every chunk (nullUsage).
func newEnvelope[C any](id, object string, created int64, model string, nullUsage bool) envelope[C] {
	e := envelope[C]{ID: id, Object: object, Created: created, Model: model}
	if nullUsage {
		e.Usage = nullJSON
	}
	return e
}

// chunk is a stream chunk carrying one choice.
func (e envelope[C]) chunk(choice C) envelope[C] {
	e.Choices = []C{choice}
	return e
}

// final is the whole answer (choices and usage), or with no choices a stream's usage
// chunk.
func (e envelope[C]) final(choices []C, u usageJSON) envelope[C] {
	e.Choices, e.Usage = choices, rawJSON(u)
	return e
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
