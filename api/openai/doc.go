// Package openai is the OpenAI API's wire format and its pure converters: each endpoint's
// request schema decoded and validated into an engine request, and engine events turned
// into the endpoint's response JSON, whole or as stream chunks. It does no I/O and knows
// no HTTP framework: package api reads the body, calls the parser, submits to the engine
// and writes what the converter returns; api/responses stores what /v1/responses keeps.
// It imports the engine (its request, events and rules), engine/structured (the
// constraints response_format and tool calls compile to), api/toolcall (the tool-call
// formats) and the tokenizer, and nothing of the server.
//
// One file per endpoint holds its wire types, its parser and its converter:
//
//	completions.go           /v1/completions: CompletionRequest -> ParsedCompletion; completionOutput
//	chat.go, chat_output.go  /v1/chat/completions: ChatRequest -> ParsedChat; chatOutput
//	responses_*.go           /v1/responses: ResponsesRequest -> ParsedResponses (request), the
//	                         Response object and its items and events (wire), ResponseBuilder (output)
//	tokenize.go, models.go   /tokenize, /detokenize and /v1/models
//
// and the pieces they share: generation.go (the sampling members both generation
// endpoints take, and vLLM's extensions), features.go (response_format and the chat
// members beyond sampling), toolplan.go (a request's tool plan, for chat and responses
// alike) and callstream.go (tool calls streamed as they are generated), logprobs.go,
// envelope.go (the answers' envelope, usage, the Converter contract), errors.go (the
// kinds of failure and the OpenAI error object), decode.go and values.go (decoding and
// the typed checks), model.go (what the converters read of the served model).
//
// # Requests
//
// Each endpoint's body has a wire struct mirroring the OpenAI schema. DecodeBody decodes
// it once, member names matched exactly (OpenAI's names are case-sensitive) and unknown
// members ignored; the union members (prompt, stop, content) have their own types. No
// member's type fails the decoding: a value of the wrong type is kept, and the endpoint's
// parser (ParseCompletion, ParseChat, ParseResponses, ParseTokenize, ParseDetokenize),
// which reads the struct in one fixed order into the engine request, reports it as a 400
// that names the parameter (`"max_tokens":"ten"` -> param "max_tokens"). null counts as
// omitted and the OpenAI defaults apply to everything omitted (max_tokens 16,
// temperature 1, top_p 1, n 1), or the model's own (Model.Defaults). Only wire types
// are checked here: every limit on a value is the engine's (engine.Limits.Check), and an
// engine.ParamError it returns is reported with the parameter renamed to the endpoint's
// member (WireError). A prompt that leaves no room for one completion token is a 400
// stating the context length and the prompt's size. Several prompts become one engine
// request each (choice index = prompt_index*n + j); best_of > n generates best_of
// sequences and returns the n with the highest cumulative logprob.
//
// Every OpenAI parameter the server accepts is one it acts on. One it does not implement
// is a 400 naming it, code unsupported_parameter (functions, audio, prediction,
// web_search_options, moderation, suffix) or unsupported_value where other values are
// served (a JSON Schema keyword the structured-output compiler does not implement under
// strict, modalities with audio, store true on chat, reasoning_effort other than "none",
// verbosity other than "medium"). response_format json_object and json_schema constrain
// decoding (package engine/structured); tools, tool_choice and parallel_tool_calls call
// tools in the model's format (toolplan.go, package api/toolcall). Members that change
// nothing in what is generated or returned are accepted: user, metadata,
// stream_options.include_obfuscation, empty functions, and the platform's hints
// (service_tier, safety_identifier, the prompt-cache hints: one list, platformHints, for
// chat and responses).
//
// # Answers
//
// A Converter per request turns engine events into the endpoint's answer: streamed, the
// chunks to send for each event; otherwise one body once every sequence ended. Chat and
// completions answer in one envelope (id, object, created, model, choices, usage); with
// stream_options.include_usage every chunk carries "usage": null and one last chunk has
// "choices": [] and the usage. A chat reply under tools is read by its tool plan: the
// calls it holds in the model's format become tool_calls only when each names an offered
// tool and its arguments validate against that tool's parameters; a call the reply's end
// cut short is neither a call nor content. The Responses API's output is built from the
// chat converter's deltas (ResponseBuilder), so both endpoints read replies alike.
//
// # Example
//
//	var w openai.ChatRequest
//	if err := openai.DecodeBody(body, &w); err != nil { ... } // a 400 naming no parameter
//	req, err := openai.ParseChat(&w, model)                   // a 400 naming the parameter
//	if err != nil { ... }
//	events, _ := eng.Submit(ctx, &engine.Request{ID: id, Prompt: req.Prompt, Params: req.Params})
//	conv := openai.NewChatOutput(req, model.Tokenizer, id, time.Now().Unix(), "tiny", nil)
//	for ev := range events { conv.Add(0, &ev) }
//	body := conv.Body(usage)
package openai
