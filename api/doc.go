// Package api is Conveyor's OpenAI-compatible HTTP server: the routes and their handlers,
// the middleware (request ids and logs, panic recovery, API-key auth, body limits), the one
// table that maps errors to HTTP statuses, Server-Sent Events, Prometheus metrics, health
// and graceful shutdown. gin is used here and nowhere else.
//
// The HTTP layer is three packages, by job, the way Ollama's server and openai packages
// and vLLM's entrypoints/openai read. Imports point one way, down:
//
//	api             server, routes, handlers, middleware, statuses, SSE, metrics, health
//	api/responses   the Responses API's state: stored responses, background runs (over api/respstore)
//	api/openai      the OpenAI wire types and their pure converters (no gin, no I/O)
//
// api/openai decodes and validates each endpoint's body into an engine request and turns
// engine events into response JSON; api/responses keeps what /v1/responses remembers; this
// package owns everything that touches the connection: reading the body, submitting to the
// engine, waiting, writing, aborting.
//
// # Routes
//
//	POST /v1/completions        prompt as a string, strings, token ids or token-id arrays
//	POST /v1/chat/completions   messages rendered through the model's chat template
//	POST /v1/responses          OpenAI's Responses API on the chat path (responses.go);
//	                            GET, DELETE /v1/responses/{id}, GET .../input_items,
//	                            POST .../cancel read the store (package api/responses)
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
// # Handlers
//
// Every handler that takes a body opens the same way (openRequest): the model must be
// loaded and the server not draining (503 otherwise), the body is read once (413 over
// Config.MaxBodyBytes, 415 compressed) and decoded into the endpoint's wire struct, and
// the endpoint's parser in package openai validates it into the engine request; any
// failure is written as the OpenAI error object with its status. A generation handler
// then checks the model, submits one engine request per prompt (engine.Submit) and hands
// the events to one loop, readEvents (merging, keep-alives, aborts, shutdown), which
// serves every generation endpoint: runGeneration writes completions and chat, streamed or
// not, through the endpoint's openai.Converter, and generateResponse builds a Responses
// API response, streamed, plain or in the background. The handlers talk to the engine and the
// tokenizer through two small interfaces, Engine (Submit, Abort, Stats) and
// openai.Tokenizer, so handler tests run on fakes.
//
// The events of a request's engine requests arrive merged on one channel: a goroutine per
// engine request records each event (usage, metrics) and forwards it, and once the handler
// stops listening only drains it until the engine closes the channel, so no goroutine
// outlives the engine request it reads.
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
// A client that goes away cancels the request's context; the handler aborts its engine
// requests, which free their KV blocks at the next step.
//
// /v1/responses streams as OpenAI's Responses API does instead: each event is named
// (`event: response.output_text.delta`) and numbered (sequence_number), a failure is an
// error event and response.failed, and no [DONE] follows (responseStream).
//
// # Errors
//
// Every error body is {"error":{"message","type","param","code"}}. statusTable maps
// errors (errors.Is) to a status: engine.ErrInvalidRequest and engine.ErrPromptTooLong
// 400, openai.ErrUnsupported and openai.ErrUnsupportedValue 400, a bad API key 401,
// openai.ErrModelNotFound and openai.ErrNotFound (a route, a stored response) 404, a wrong
// method 405, a body over Config.MaxBodyBytes 413, a body with a Content-Encoding 415,
// engine.ErrOverloaded 429, engine.ErrModel and engine.ErrInternal (a recovered panic) 500
// (the server keeps serving), engine.ErrClosed and "still loading" 503. The parameter is
// the one an openai.ParamError or an engine.ParamError names.
//
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
// closes the connections. Background responses get the same deadline (see package
// api/responses). The caller shuts the engine down afterwards. Open connections are capped
// by Config.MaxConnections (further clients wait in the accept backlog);
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
// conveyor_e2e_request_latency_seconds and conveyor_request_queue_time_seconds, and the
// chat converter reports conveyor_tool_calls_rejected_total{reason};
// Metrics.OnStep, wired to the engine's Config.OnStep, records conveyor_batch_size and
// conveyor_step_duration_seconds.
//
// Running replicas behind the Kubernetes Gateway API Inference Extension, whose endpoint
// picker routes on the queue, running and KV-cache gauges above, is described in
// docs/deploy.md (manifests in deploy/kubernetes).
//
// # Example
//
//	srv, err := api.New(cfg) // cfg := api.DefaultConfig(); cfg.ModelName = "tiny"; cfg.Metrics = api.NewMetrics()
//	if err != nil { ... }
//	ln, _ := net.Listen("tcp", "127.0.0.1:8000")
//	go srv.Serve(ln)              // /health answers 503 while the model loads
//	eng, _ := engine.New(ecfg, runner, tok) // ecfg.OnStep = cfg.Metrics.OnStep
//	eng.Start(ctx)
//	srv.SetBackend(api.Backend{Engine: eng, Tokenizer: openai.NewTokenizer(tok), MaxModelLen: eng.MaxModelLen()})
//	...
//	srv.Shutdown(drainCtx) // then eng.Shutdown(ctx)
package api
