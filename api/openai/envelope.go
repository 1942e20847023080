package openai

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"

	"github.com/conveyor-llm/conveyor/engine"
)

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
// a stream, around their own choices (CompletionResponse, chatResponse).
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
func (e envelope[C]) final(choices []C, u Usage) envelope[C] {
	e.Choices, e.Usage = choices, rawJSON(u)
	return e
}

// Converter is one endpoint's answer: what an engine event becomes in a stream, and what
// the finished sequences become as one body. The HTTP layer's loop owns everything else
// (waiting, keep-alives, errors, aborts, usage).
type Converter interface {
	// Add takes one event of sequence ev.Index of prompt pi (the caller checks the index).
	// Streaming, it returns the chunks to send for it; otherwise it accumulates and
	// returns nil.
	Add(pi int, ev *engine.Event) []any
	// Body is the response of a request that is not streamed, once every sequence ended.
	Body(u Usage) any
	// UsageChunk is a stream's last chunk with stream_options.include_usage.
	UsageChunk(u Usage) any
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

// Usage is the OpenAI usage object.
type Usage struct {
	PromptTokens     int            `json:"prompt_tokens"`
	CompletionTokens int            `json:"completion_tokens"`
	TotalTokens      int            `json:"total_tokens"`
	Details          *PromptDetails `json:"prompt_tokens_details,omitempty"`
	cached           int
}

// PromptDetails is usage.prompt_tokens_details.
type PromptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// NewUsage is the usage of a request's prompt and completion tokens, of which cached
// prompt tokens were served from the prefix cache.
func NewUsage(prompt, completion, cached int) Usage {
	u := Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion, cached: cached}
	if cached > 0 {
		u.Details = &PromptDetails{CachedTokens: cached}
	}
	return u
}

// NewID returns a random hex id with a prefix ("cmpl-3f2a…").
func NewID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
