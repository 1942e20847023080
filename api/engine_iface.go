package api

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/engine/structured"
)

// Engine is what the server needs from the generation engine. *engine.Engine satisfies it;
// handler tests use a fake.
type Engine interface {
	// Submit queues a request and returns the channel its events arrive on. It fails fast
	// (before any HTTP header is written) with engine.ErrOverloaded, engine.ErrPromptTooLong,
	// engine.ErrInvalidRequest or engine.ErrClosed.
	Submit(ctx context.Context, req *engine.Request) (<-chan engine.Event, error)
	// Abort ends the request with the given id; its events channel is closed soon after.
	Abort(id string)
	// Stats returns a snapshot for /metrics.
	Stats() engine.Stats
}

// Message is one chat message after parsing: a role and its text, and what else the chat
// template is given of it.
type Message struct {
	Role    string
	Content string // the text (the text parts joined when content was an array)
	// Parts is the content as sent when it was an array of text parts (nil for a
	// string); templates that iterate over a message's content get it as such.
	Parts      []ContentPart
	Name       string     // name, when set
	ToolCallID string     // tool_call_id of a tool message, when set
	ToolCalls  []ToolCall // tool_calls of an assistant message
}

// ContentPart is one text content part of a message.
type ContentPart struct{ Type, Text string }

// ToolCall is one tool call of an assistant message in the history. Arguments is the
// JSON text of the arguments, as the OpenAI API carries it.
type ToolCall struct {
	ID, Type        string
	Name, Arguments string
}

// Tokenizer is what the server needs from the model's tokenizer. NewTokenizer adapts
// *tokenizer.Tokenizer to it; handler tests use a fake.
type Tokenizer interface {
	// Encode turns text into token ids; addSpecial prepends BOS when the model wants it.
	Encode(text string, addSpecial bool) ([]int32, error)
	// Decode turns token ids back into text.
	Decode(ids []int32, skipSpecial bool) string
	// TokenText is the display text of one token (for logprobs).
	TokenText(id int32) string
	// VocabSize is the number of token ids; valid ids are 0 .. VocabSize-1.
	VocabSize() int
	// EncodeChat renders messages through the model's chat template (ending with the
	// assistant turn's opening when addGenerationPrompt is true) and tokenizes the result.
	EncodeChat(msgs []Message, addGenerationPrompt bool) ([]int32, error)
}

// ToolTemplater is an optional Tokenizer capability: rendering a chat with the request's
// tools passed to the template (as vLLM passes request.tools), and the template's text,
// from which the tool-call format is chosen.
type ToolTemplater interface {
	EncodeChatTools(msgs []Message, addGenerationPrompt bool, tools []json.RawMessage) ([]int32, error)
	ChatTemplateSource() string
}

// TokenByter is an optional Tokenizer capability: the raw bytes of one token and whether
// it is a special token (left out of generated text). The chat logprobs' "bytes" field
// then carries a token's own bytes even when it holds only part of a multi-byte character
// (whose TokenText is U+FFFD), and completion logprobs' text_offset counts characters of
// the text; without it both follow TokenText.
type TokenByter interface {
	TokenBytes(id int32) []byte
	IsSpecial(id int32) bool
}

// Backend is the loaded model the server talks to. Until Server.SetBackend is called the
// server answers 503 on every model route and /health.
type Backend struct {
	Engine    Engine
	Tokenizer Tokenizer
	// MaxModelLen is the model's context length in tokens (prompt + completion).
	MaxModelLen int
	// Quantization and KVCacheDType describe the served weights ("none", "int8",
	// "int4") and KV cache ("float32", "float16") in /v1/models; empty leaves them out.
	Quantization, KVCacheDType string
	// ToolCallParser names the tool-call format (hermes, llama3_json, mistral, generic);
	// empty chooses it from the chat template.
	ToolCallParser string
	// Formats compiles response_format into structured-output constraints over the
	// model's vocabulary; nil refuses the JSON formats.
	Formats *structured.Cache
	// Defaults replace the OpenAI defaults of the sampling fields a request leaves out.
	Defaults SamplingDefaults
}

// SamplingDefaults are a model's own defaults for sampling fields a request leaves out,
// as vLLM takes them from generation_config.json (its --generation-config auto). A nil
// field keeps the OpenAI default (temperature 1, top_p 1, no top_k, min_p 0, no
// repetition penalty). They are used as they are: whoever sets them keeps only values the
// engine's rules accept (see Checked).
type SamplingDefaults struct {
	Temperature, TopP, MinP, RepetitionPenalty *float64
	TopK                                       *int
}

// apply sets the defaults that are set in p.
func (d SamplingDefaults) apply(p *engine.SamplingParams) {
	set := func(dst *float32, v *float64) {
		if v != nil {
			*dst = float32(*v)
		}
	}
	set(&p.Temperature, d.Temperature)
	set(&p.TopP, d.TopP)
	set(&p.MinP, d.MinP)
	set(&p.RepetitionPenalty, d.RepetitionPenalty)
	if d.TopK != nil {
		p.TopK = *d.TopK
	}
}

// Checked returns d without the defaults the engine's rules refuse, and why each was
// dropped: a generation_config.json with temperature 5 leaves requests at OpenAI's 1.
func (d SamplingDefaults) Checked(l engine.Limits) (SamplingDefaults, []error) {
	var dropped []error
	for {
		p := engine.DefaultSamplingParams()
		d.apply(&p)
		_, err := l.Check(&engine.Request{Prompt: []int32{0}, Params: p})
		var pe *engine.ParamError
		if !errors.As(err, &pe) {
			return d, dropped
		}
		switch pe.Param {
		case "temperature":
			d.Temperature = nil
		case "top_p":
			d.TopP = nil
		case "min_p":
			d.MinP = nil
		case "repetition_penalty":
			d.RepetitionPenalty = nil
		case "top_k":
			d.TopK = nil
		default: // not a default's rule
			return d, append(dropped, err)
		}
		dropped = append(dropped, err)
	}
}
