// Package scheduler decides, one forward pass at a time, which sequences run and how many
// tokens each computes. It is a pure state machine: no goroutines, no I/O, time read from a
// clock. One goroutine (the engine's step loop) owns a Scheduler and the kvcache.Pool it
// manages.
//
// # Model
//
// There is no separate prefill and decode phase (as in vLLM's v1 engine core). A Sequence
// holds its known tokens (prompt, then generated) and knows how many of them are computed,
// that is, have their keys and values in the sequence's KV blocks. Each step gives a
// sequence some of its uncomputed tokens: a whole prompt, a chunk of it, or the one token
// sampled last step. When a step computes the last known token, Item.Sample is set and the
// engine samples the next token from the last position's logits.
//
// # The step contract
//
//	plan := s.Schedule()            // which sequences, how many tokens, block copies
//	// engine: apply plan.Copies to storage; run ONE forward pass over every item's
//	// Tokens(), reading the past [0, StartPos) through item.Blocks and storing the new
//	// K/V at [StartPos, StartPos+NumNewTokens); s.ObserveStep(its duration); sample
//	// where item.Sample; end the sequences in plan.Failed.
//	done, err := s.Update(plan, results) // results[i] belongs to plan.Items[i]
//
// The scheduler owns the pool's bookkeeping: FindPrefix (a pure lookup) and AllocateSlots
// (which takes the cached blocks and new ones all or nothing, and counts the lookup) when a
// sequence is admitted, Allocate (and Fork) for running sequences in Schedule, Commit and
// Free in Update and Abort. A sequence that does not fit leaves the pool untouched, so a
// prompt waiting for blocks is counted in the prefix-cache statistics once, when admitted.
// The engine never asks the pool for anything during a step: each item carries its block
// table, and the engine moves data in kvcache.Storage.
//
// # Policies
//
// All policies share the step: running sequences first (oldest admitted first), each gets
// its next token or prompt chunk while the per-step token budget (MaxNumBatchedTokens)
// lasts; then waiting sequences are admitted in arrival order while the sequence cap
// (MaxNumSeqs), the budget and free KV blocks allow. Admission stops at the first sequence
// that does not fit (first come, first served). Policies differ only in which waiting
// sequences may be admitted:
//
//   - Continuous: any, at every step.
//   - Static: only the members of the current batch. A batch forms when MaxBatchSize
//     sequences wait or the oldest has waited MaxBatchDelay (NextBatchTime tells the engine
//     when to wake); it runs until its last member finishes, and only then does the next
//     batch form. A finished member's slot stays idle.
//   - Sequential: batches of one request.
//
// With chunked prefill (the default) a prompt longer than the remaining budget is computed
// over several steps; without it a prompt is admitted only when it fits whole. With prefix
// caching, admission looks the sequence's tokens up in the pool's prefix cache, and the
// cached tokens count as computed (at least one token is always computed, so there are
// logits to sample from).
//
// # Steps bounded in time
//
// With Continuous and sequences decoding, a step that also carries thousands of prompt
// tokens would stall every stream. StepCost models a step's duration from its shape (new
// tokens, rows, query·key pairs) by ridge regression over the forward times the engine
// reports with ObserveStep. Each step, the decode rows' predicted time sets the target
// (TargetStepTime, or AutoStepTimeFactor times that prediction, at least MinAutoStepTime),
// and prompt chunks get what the target leaves, at least minPrefillChunkTokens for
// progress. The model's word is trusted only up to twice the largest step it has measured
// (StepCost.TrustedTokens), so chunks grow by doubling rather than by extrapolation, and
// until it has seen minCostObservations steps, chunks next to decoding rows are held to
// coldPrefillChunkTokens. With nothing decoding, prompts fill the token budget.
//
// # Preemption
//
// When a running sequence needs a KV block and none is free, the newest running sequence is
// preempted: its blocks are freed, its computed count drops to 0, and it returns to the
// front of the waiting queue; when it is admitted again, its prompt and generated tokens are
// recomputed (prefix caching may serve part of them) and generation continues where it
// stopped. Older sequences are never preempted for newer ones, and no sequence is admitted
// in a step that preempted, so the oldest running sequence always progresses. A sequence
// that cannot fit even with every other sequence gone is ended with FinishNoCapacity and
// reported in Plan.Failed, never retried forever.
//
// # Requests with n > 1
//
// AddGroup queues a request's sequences together. The first computes the prompt, stopping
// one token short; then the others fork from it (kvcache.Pool.Fork shares its blocks) and
// every sequence computes the last prompt token on its own row, so the prompt is computed
// once and each sequence samples its first token from its own logits. A partial last block
// is copied on write (Plan.Copies).
//
// # Endings, aborts and failed passes
//
// A sequence ends in Update (the engine's Result.Finished, or MaxModelLen reached), in
// Schedule (FinishNoCapacity, listed in Plan.Failed), or by Abort, which frees its blocks at
// once and may be called between Schedule and Update. When a forward pass fails, the engine
// aborts the affected sequences and still calls Update with one (ignored) Result per item:
// nothing of an aborted sequence is committed, so no unwritten block enters the prefix
// cache. Update may reallocate Sequence.Tokens when it appends.
//
// After a preemption an item may cover positions computed before (StartPos restarts at the
// cached prefix, usually 0); Sequence.NumPreemptions tells the engine, for example to emit
// prompt logprobs only once.
//
// # Example
//
//	pool, _ := kvcache.NewPool(kvcache.PoolConfig{NumBlocks: 1024, BlockSizeTokens: 16, EnablePrefixCaching: true})
//	s, _ := scheduler.New(scheduler.DefaultConfig(), pool)
//	_ = s.Add(&scheduler.Sequence{ID: 1, Tokens: prompt})
//	for s.HasWork() {
//		plan := s.Schedule()
//		results := make([]scheduler.Result, len(plan.Items))
//		for i, it := range plan.Items {
//			if it.Sample {
//				results[i].Token = model.Next(it.Seq.Tokens) // after a forward pass
//				results[i].Finished = results[i].Token == eos
//			}
//		}
//		done, _ := s.Update(plan, results)
//		for _, q := range done {
//			fmt.Println(q.ID, q.Tokens[q.NumPromptTokens():])
//		}
//	}
package scheduler
