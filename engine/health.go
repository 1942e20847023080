package engine

import (
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/scheduler"
)

// This file holds what the engine does when something fails that is not a request's
// fault: a forward pass (every request in it fails, and MaxStepFailures in a row
// restart the runner) and a panic while one request's tokens are handled (that request
// fails, nothing else notices).
//
// The runner restart is the simplest design that needs nothing of the runner: a
// function given at construction (Config.ReopenModel) opens a fresh one, and the engine
// swaps it in on its own goroutine between two steps. On the host the KV cache is the
// engine's (the runner only reads and writes the blocks it is handed), so the sequences
// waiting or preempted when the runner is replaced keep their blocks and go on; the
// fresh runner must therefore have the same Spec. On a GPU (Spec.KVOnDevice) the cache's
// memory is the runner's and goes with it: the engine then flushes the prefix cache,
// recomputes every running sequence, and copies blocks through the fresh runner. A Reset method on Model was the alternative: every
// Model (fakes included) would need one, and "reset" means little for a session that is
// broken — reopening it is what resets it.

// maxStepFailures is Config.MaxStepFailures with its default.
func (e *Engine) maxStepFailures() int {
	if e.cfg.MaxStepFailures > 0 {
		return e.cfg.MaxStepFailures
	}
	return DefaultMaxStepFailures
}

// stepSucceeded ends a run of failed forward passes.
func (e *Engine) stepSucceeded() {
	e.failStreak = 0
	e.unhealthy = ""
}

// stepFailed counts a failed forward pass (whose requests were already ended with err).
// After MaxStepFailures in a row the engine is unhealthy and restarts its runner; a
// restart that fails is tried again after the next failed pass.
func (e *Engine) stepFailed(err error) {
	e.counts.failedSteps++
	e.failStreak++
	if e.failStreak < e.maxStepFailures() {
		e.log.Error("engine: forward pass failed", "err", err, "in_a_row", e.failStreak)
		return
	}
	reason := fmt.Sprintf("%d forward passes in a row failed, the last with: %v", e.failStreak, err)
	if e.cfg.ReopenModel == nil {
		e.unhealthy = reason
		e.log.Error("engine: unhealthy", "reason", reason)
		return
	}
	e.unhealthy = reason + "; restarting the runner"
	e.log.Error("engine: restarting the runner", "reason", reason)
	e.publishStats() // /health says so while the runner reopens
	start := time.Now()
	if rerr := e.reopenModel(); rerr != nil {
		e.unhealthy = fmt.Sprintf("%s; restarting the runner failed: %v", reason, rerr)
		e.log.Error("engine: runner restart failed", "err", rerr)
		return
	}
	e.counts.restarts++
	e.stepSucceeded()
	e.log.Warn("engine: runner restarted", "seconds", time.Since(start).Seconds(), "restarts", e.counts.restarts)
}

// reopenModel replaces the model with a fresh one from Config.ReopenModel.
func (e *Engine) reopenModel() (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("ReopenModel panicked: %v", p)
		}
	}()
	m, err := e.cfg.ReopenModel()
	if err != nil {
		return err
	}
	if m == nil {
		return errors.New("ReopenModel returned no model")
	}
	if s := m.Spec(); s.NumLayers != e.spec.NumLayers || s.NumKVHeads != e.spec.NumKVHeads ||
		s.HeadDim != e.spec.HeadDim || s.VocabSize != e.spec.VocabSize || s.KVDType != e.spec.KVDType ||
		s.MaxPositions != e.spec.MaxPositions {
		closeModel(m)
		return fmt.Errorf("the reopened model's spec %+v differs from %+v", s, e.spec)
	}
	if !e.spec.KVOnDevice {
		closeModel(e.model)
		e.model, e.reopened = m, true
		return nil
	}
	// The cache lived in the old runner's device memory and went with it: the fresh
	// runner's is new and holds nothing. Blocks are copied by the live runner, every
	// running sequence is recomputed, and no cached prefix is served from the old memory.
	copier, ok := m.(models.BlockCopier)
	if !ok {
		closeModel(m)
		return errors.New("the reopened model keeps its KV cache on its device but cannot copy blocks there")
	}
	n, err := e.sched.RecomputeAll()
	if err != nil {
		closeModel(m)
		return err
	}
	e.pool.DropPrefixCache()
	closeModel(e.model)
	e.model, e.reopened, e.copier = m, true, copier
	e.log.Warn("engine: the device KV cache went with the old runner: the prefix cache is flushed and running sequences are recomputed",
		"recomputed", n)
	return nil
}

// closeReopened closes the model when the engine opened it itself (ReopenModel); the
// caller closes the one it gave New.
func (e *Engine) closeReopened() {
	if e.reopened {
		closeModel(e.model)
	}
}

func closeModel(m Model) { _ = m.Close() }

// recoverRequest, deferred around the handling of one sequence's logits, turns a panic
// into the end of that sequence's request with ErrInternal: the step, the engine and the
// other requests go on. Item i's result is cleared so that the scheduler appends nothing.
func (e *Engine) recoverRequest(st *seqState, i int) {
	p := recover()
	if p == nil {
		return
	}
	e.counts.panics++
	e.results[i] = scheduler.Result{}
	r := st.req
	e.log.Error("engine: panic while handling a request; the request is ended", "request", r.id,
		"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	if _, live := e.live[r]; live {
		e.endRequest(r, FinishError, fmt.Errorf("%w: request %q: panic: %v", ErrInternal, r.id, p))
		if _, live := e.live[r]; live { // the panic came after its last sequence ended
			e.finishRequest(r)
		}
	}
}
