// Package api is Conveyor's OpenAI-compatible HTTP front end: request parsing and
// validation, the OpenAI wire types, Server-Sent Events, the one table that maps errors
// to HTTP statuses, Prometheus metrics, API-key auth and graceful shutdown. gin is used
// here and nowhere else.
//
// # Routes
//
//	POST /v1/completions        prompt as a string, strings, token ids or token-id arrays
//	POST /v1/chat/completions   messages rendered through the model's chat template
//	POST /v1/responses          OpenAI's Responses API on the chat path (responses.go);
//	                            GET, DELETE /v1/responses/{id}, GET .../input_items,
//	                            POST .../cancel read the store (package api/respstore)
//	GET  /v1/models, /v1/models/{id}
//	POST /tokenize              {"prompt"} or {"messages"} -> {"tokens","count","max_model_len"}
//	POST /detokenize            {"tokens"} -> {"prompt"}
//	GET  /health                200 {"status":"ok"}; 503 while loading or draining, and
//	                            {"status":"unhealthy","reason"} while the engine's forward
//	                            passes keep failing (engine.Stats.Unhealthy)
//	GET  /metrics               Prometheus text format
//	GET  /, /v1/engine/stats    the built-in chat page and its live engine view (Config.EnableWebUI)
//
// With Config.APIKey set, /v1/*, /tokenize and /detokenize require
// "Authorization: Bearer <key>"; /health, /metrics and the page's static files stay open
// so that probes and scrapers need no secret.
//
// # Requests
//
// Each endpoint's body has a wire struct mirroring the OpenAI schema (completionRequest,
// chatRequest, tokenizeRequest, detokenizeRequest; the members both generation endpoints
// share are generationRequest). The body is decoded into it once, member names matched
// exactly (OpenAI's names are case-sensitive) and unknown members ignored; the union
// members (prompt, stop, content) have their own types. No member's type fails the
// decoding: a value of the wrong type is kept, and parseCompletion / parseChat, which
// read the struct in one fixed order into the engine request, report it as a 400 that
// names the parameter (`"max_tokens":"ten"` -> param "max_tokens"). null counts as
// omitted and the OpenAI defaults apply to everything omitted (max_tokens 16,
// temperature 1, top_p 1, n 1). Ranges are checked before anything reaches the engine; a
// prompt that leaves no room for one completion token is a 400 stating the context length
// and the prompt's size. A longer max_tokens is clipped by the engine to the room left.
// Several prompts become one engine request each (choice index = prompt_index*n + j);
// best_of > n generates best_of sequences and returns the n with the highest cumulative
// logprob.
//
// Every OpenAI parameter the server accepts is one it acts on. One it does not implement
// is a 400 naming it, code unsupported_parameter (functions, audio, prediction,
// web_search_options, moderation, suffix) or unsupported_value where other values are
// served (a JSON Schema keyword the structured-output compiler does not implement under
// strict, modalities with audio, store true, reasoning_effort other than "none",
// verbosity other than "medium"). response_format json_object and json_schema constrain
// decoding (package engine/structured); tools, tool_choice and parallel_tool_calls call
// tools in the model's format (tools.go, package api/toolcall). Members that change
// nothing in what is generated or returned are accepted: user, safety_identifier,
// metadata, service_tier, the prompt-cache hints, stream_options.include_obfuscation,
// empty functions.
//
// The handlers talk to the engine and the tokenizer through two small interfaces,
// Engine (Submit, Abort, Stats) and Tokenizer, so handler tests run on fakes.
//
// # Streaming
//
// The server writes SSE itself: `data: <json>` and a blank line per chunk, flushed at
// once, no `event:` names, `data: [DONE]` last. The 200 and the SSE headers go out with
// the first chunk or the first keep-alive comment (`: keep-alive`, every
// Config.KeepAliveInterval while nothing else is sent, so long queue waits and
// prefills do not trip client or proxy timeouts). Everything decided before that — a full
// queue (429 with Retry-After), a prompt too long, an engine failure on the first step —
// is a plain JSON error with its status; after it, an error is sent in-band as
// `data: {"error":{...}}` followed by [DONE]. Normal chunks never carry an "error" key.
// With stream_options.include_usage every chunk carries "usage": null and one last
// chunk has "choices": [] and the usage. A client that goes away cancels the request's
// context; the handler aborts its engine requests, which free their KV blocks at the
// next step.
//
// /v1/responses streams as OpenAI's Responses API does instead: each event is named
// (`event: response.output_text.delta`) and numbered (sequence_number), a failure is an
// error event and response.failed, and no [DONE] follows (responses.go).
//
// One loop, runGeneration, serves both endpoints, streamed or not; a converter per
// endpoint says what an engine event becomes in a stream and what the finished sequences
// become as one body. The events of a request's engine requests arrive merged on one
// channel: a goroutine per engine request records each event (usage, metrics) and
// forwards it, and once the handler stops listening only drains it until the engine
// closes the channel, so no goroutine outlives the engine request it reads.
//
// # Errors
//
// Requests are decoded here and checked for wire types only: every limit on a value is
// the engine's (engine.Limits.Check), and an engine.ParamError it returns is reported
// with the parameter renamed to the endpoint's member (wireError).
//
// Every error body is {"error":{"message","type","param","code"}}. statusTable maps
// errors (errors.Is) to a status: engine.ErrInvalidRequest and engine.ErrPromptTooLong
// 400, a bad API key 401, an unknown model or route 404, a wrong method 405, a body over
// Config.MaxBodyBytes 413, a body with a Content-Encoding 415, engine.ErrOverloaded 429,
// engine.ErrModel and engine.ErrInternal (a recovered panic) 500 (the server keeps serving),
// engine.ErrClosed and "still loading" 503.
// A body over the limit is refused from its Content-Length before it is read, or at the
// limit while it is read (chunked); the 413 carries "Connection: close", and the server
// then reads and discards up to 64 MiB more of the body, so that a client that writes
// its whole body before reading the answer gets the 413 rather than a connection reset.
// Bodies being read and parsed share Config.MaxBodyBytesInFlight (64 MiB): a body takes
// its Content-Length of it before it is read (a chunked one the whole body limit) and
// gives it back once its request is parsed and tokenized, so a storm of large requests
// waits its turn instead of growing the heap by several times each body; a body has
// Config.BodyReadTimeout to arrive once its turn comes (400 after it).
//
// # Shutdown
//
// Server.Shutdown turns /health to 503, refuses new generation requests, closes the
// listener and lets in-flight requests finish until its context ends; then it cancels
// every remaining request (streams get an in-band 503 error, sequences are aborted) and
// closes the connections. The caller shuts the engine down afterwards. Open connections
// are capped by Config.MaxConnections (further clients wait in the accept backlog);
// ReadHeaderTimeout and IdleTimeout bound slow and idle clients.
//
// # Metrics
//
// Metrics lives on a private Prometheus registry. The engine's gauges and counters
// (conveyor_num_requests_running, conveyor_num_requests_waiting,
// conveyor_kv_cache_usage_perc — a 0..1 fraction like vLLM's —,
// conveyor_num_preemptions_total, conveyor_prompt_tokens_total,
// conveyor_generation_tokens_total, conveyor_prefix_cache_queries_total,
// conveyor_prefix_cache_hits_total, conveyor_cache_config_info{block_size,num_blocks})
// are read from engine.Stats at scrape time. The handlers record
// conveyor_request_success_total{finished_reason} and the histograms
// conveyor_time_to_first_token_seconds, conveyor_inter_token_latency_seconds,
// conveyor_e2e_request_latency_seconds and conveyor_request_queue_time_seconds;
// Metrics.OnStep, wired to the engine's Config.OnStep, records conveyor_batch_size and
// conveyor_step_duration_seconds.
//
// Running replicas behind the Kubernetes Gateway API Inference Extension, whose endpoint
// picker routes on the queue, running and KV-cache gauges above, is described in
// docs/deploy.md (manifests in deploy/kubernetes).
//
// # Example
//
//	srv, err := api.New(cfg) // cfg := api.DefaultConfig(); cfg.ModelName = "tiny"
//	if err != nil { ... }
//	ln, _ := net.Listen("tcp", "127.0.0.1:8000")
//	go srv.Serve(ln)              // /health answers 503 while the model loads
//	eng, _ := engine.New(ecfg, runner, tok) // ecfg.OnStep = srv.Metrics().OnStep
//	eng.Start(ctx)
//	srv.SetBackend(api.Backend{Engine: eng, Tokenizer: api.NewTokenizer(tok), MaxModelLen: eng.MaxModelLen()})
//	...
//	srv.Shutdown(drainCtx) // then eng.Shutdown(ctx)
package api
