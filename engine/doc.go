// Package engine runs generation requests through one model with iteration-level
// ("continuous") batching over a paged KV cache.
//
// # The face
//
// The HTTP layer sees three calls (api.Engine): Submit(ctx, req) returns a channel of
// Events (or fails fast with ErrInvalidRequest, ErrPromptTooLong, ErrOverloaded or
// ErrClosed, before any response header is written); Abort(id) ends a request; Stats() is a
// cheap snapshot for metrics. Whoever started the engine calls Shutdown(ctx), which drains.
// Events carry token ids, a UTF-8-safe text delta, logprobs, the finish reason, usage and
// timings — no wire format.
//
// # One owner
//
// A single goroutine (the loop Start runs) owns everything mutable: the scheduler, the block
// pool, the K/V storage and every sequence's sampler, detokenizer and stop checker. Submit
// and Abort only append to a mutex-guarded inbox and poke a one-slot wake channel, so they
// never wait for a step; Submit checks the request against the request rules (rules.go:
// one table, the only place a limit on a request is written; a broken rule is a
// *ParamError naming the parameter) and the queue bound there and then, which is what
// lets the API answer 429 before sending headers. A request whose context is done is
// aborted through context.AfterFunc (no goroutine until it fires).
// When nothing is running the loop blocks on the wake channel: no polling.
//
// # The step loop
//
// Each iteration:
//
//  1. take the inbox: queue new requests in the scheduler (all n or best_of sequences
//     of a request as one group; the scheduler computes the prompt once and forks its
//     blocks to the other sequences), apply aborts (their blocks are freed at once);
//  2. scheduler.Schedule() plans ONE forward pass: running sequences' decode tokens
//     first, then waiting prompts (chunked under the token budget, prefix-cache hits
//     skipped), preempting the newest sequence when blocks run out;
//  3. apply the plan's copy-on-write block copies to the storage; with a draft model
//     (Config.DraftModel, draft.go), run its own batched passes over the speculating rows
//     and write its greedy tokens over the proposal slots the plan reserved;
//  4. build a models.Batch: the K/V storage, and for each sequence its new tokens, past
//     length and the block table its plan item carries, plus, for a model whose layers
//     have sliding windows, its tables of the other layer groups (models.Spec.CacheLayout:
//     the sliding groups give back the blocks their window has passed). The batch is plain
//     data that each attention path uses its own way:
//     the step graph binds the arenas and reads each row's block tables, attending over
//     the blocks in place and writing the new keys and values into them; the dense path gathers
//     each row's past out of its blocks into the runner's past_key_values and scatters
//     the new keys and values back;
//  5. run model.Forward once for the whole batch, timing it for the scheduler's step-cost
//     model (Scheduler.ObserveStep), which sizes prompt chunks so that a step with
//     decoding rows stays within Config.TargetStepTime;
//  6. for every sequence that computed its last known token, sample the next token
//     (a structured-output constraint's token mask first — SamplingParams.Constraint,
//     package structured — then logit bias, min_tokens, repetition/presence/frequency
//     penalties, temperature,
//     top_k, top_p, min_p, a per-sequence seeded random stream) and run the stop checks
//     (eos, stop token ids, max_tokens, stop strings matched across token boundaries
//     with held-back text, and a constrained value that is complete);
//  7. scheduler.Update commits the computed tokens to the pool (registering full blocks
//     for prefix caching), appends the sampled tokens and frees finished sequences; an
//     error there ends no request but is logged (Config.Logger) and counted;
//  8. send each sequence's event on its request's channel without blocking: the buffer
//     holds 64 events plus a slot for each sequence's final one, and a reader that falls
//     behind gets a sequence's later events merged into one, so a slow reader never
//     stalls the loop and memory does not grow with max_tokens; publish Stats and call
//     Config.OnStep.
//
// A sequence preempted under KV pressure is recomputed later from its prompt and
// generated tokens, producing the same greedy output.
//
// # Faults
//
// A failed forward pass ends every request in that batch with FinishError (Err wraps
// ErrModel), which frees their blocks, and the loop goes on with the rest. After
// Config.MaxStepFailures failed passes in a row (3 by default) the engine reports itself
// unhealthy (Stats.Unhealthy, the reason; /health answers 503 with it) and restarts its
// runner: Config.ReopenModel, given at construction, opens a fresh one, which the engine
// swaps in between two steps and serves on with; it closes the model it replaced. The KV
// cache is the engine's, not the runner's, so waiting and preempted sequences keep their
// blocks. A successful restart or pass makes the engine healthy again; a failed restart
// is tried again after the next failed pass; without ReopenModel the engine stays
// unhealthy until a pass succeeds. A panic while one sequence's logits are handled
// (prompt logprobs, sampling, stop checks, its events) is recovered: that request ends
// with FinishError (Err wraps ErrInternal) and nothing else notices (health.go).
//
// Faults are injected in tests only: a failing or slow runner is a test's Model, and
// faultHooks (faults.go), an unexported per-engine field that only this package's
// _test.go files set, makes a request's sampling panic; the shipped binary has no switch
// for either.
//
// # Example
//
//	runner, _ := models.Open(dir, models.RunnerOptions{}) // the step graph when the model has it
//	tok, _ := tokenizer.Load(dir)
//	eng, err := engine.New(engine.DefaultConfig(), runner, tok)
//	if err != nil { ... }
//	eng.Start(ctx)
//	defer eng.Shutdown(context.Background())
//
//	prompt, _ := tok.Encode("Once upon a time", true)
//	p := engine.DefaultSamplingParams()
//	p.MaxTokens, p.Temperature = 64, 0
//	events, err := eng.Submit(ctx, &engine.Request{ID: "req-1", Prompt: prompt, Params: p})
//	if err != nil { ... } // errors.Is(err, engine.ErrOverloaded) -> 429, ...
//	for ev := range events {
//		fmt.Print(ev.Text)
//		if ev.FinishReason != "" { fmt.Println("\n", ev.FinishReason, ev.Usage) }
//	}
package engine
