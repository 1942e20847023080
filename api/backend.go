package api

import (
	"context"

	"github.com/conveyor-llm/conveyor/api/openai"
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

// Backend is the loaded model the server talks to. Until Server.SetBackend is called the
// server answers 503 on every model route and /health.
type Backend struct {
	Engine Engine
	// Tokenizer is the model's tokenizer as the converters see it (openai.NewTokenizer).
	Tokenizer openai.Tokenizer
	// MaxModelLen is the model's context length in tokens (prompt + completion).
	MaxModelLen int
	// Quantization and KVCacheDType describe the served weights ("none", "int8",
	// "int4") and KV cache ("float32", "float16") in /v1/models; empty leaves them out.
	Quantization, KVCacheDType string
	// ToolCallParser names the tool-call format (hermes, llama3_json, mistral, generic);
	// empty chooses it from the chat template.
	ToolCallParser string
	// Formats compiles response_format into structured-output constraints over the
	// model's vocabulary (openai.NewFormats); nil refuses the JSON formats.
	Formats *structured.Cache
	// Defaults replace the OpenAI defaults of the sampling fields a request leaves out.
	Defaults openai.SamplingDefaults
	// MaxPrompts, when set, is how many requests of the given number of sequences the
	// engine can take at once (engine.Engine.MaxPrompts): a completions request with more
	// prompts than that is refused with 400, since waiting would never admit them all.
	MaxPrompts func(seqs int) int

	// model is what the converters read of the above; SetBackend sets it.
	model *openai.Model
}
