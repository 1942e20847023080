package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/scheduler"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// Model runs one forward pass for a batch of sequences; the runners of package models
// implement it.
type Model interface {
	// Spec describes the model's shape, context and eos ids.
	Spec() models.Spec
	// Forward computes the batch, reading each row's past keys and values from the
	// batch's cache (b.Cache, the rows' Blocks) and writing the new ones into it.
	Forward(b *models.Batch) (*models.Output, error)
	// Close releases the model. The engine calls it only when it restarts the runner
	// (Config.ReopenModel): on the runner it replaces and on those it opened.
	Close() error
}

// recentSteps bounds the per-step history kept in Stats.
const recentSteps = 64

// Engine runs generation requests through one model with continuous batching. One
// goroutine (Start's) owns the scheduler, the KV cache and every sequence's state; Submit,
// Abort, Stats and Shutdown are safe for concurrent use and never wait for a step.
type Engine struct {
	cfg         Config
	log         *slog.Logger
	model       Model
	spec        models.Spec
	text        textSource // nil: token ids only
	eos         []int32
	maxModelLen int // tokens per sequence at most
	numBlocks   int
	cacheTokens int // the longest sequence the KV cache holds alone; 0: no limit
	blockSize   int
	maxSeqsReq  int // sequences one request may have

	// Owned by the engine goroutine.
	pool    *kvcache.Pool
	storage *kvcache.Storage
	copier  models.BlockCopier // copies blocks on the model's device; nil: in storage
	drafter *drafter           // the draft model's side of speculative decoding; nil: none
	sched   *scheduler.Scheduler
	batch   models.Batch // its Cache is storage
	// groupBuf backs the batch rows' GroupBlocks (layer groups 1, 2, ...).
	groupBuf [][]kvcache.BlockID
	// draftToks holds the step's speculating rows' tokens (last token and proposals).
	draftToks []int32
	// sampledToks holds the tokens sampled from the step's speculating rows (Result.Tokens).
	sampledToks []int32
	results     []scheduler.Result
	scratch     sampleScratch
	// pre, preRows and preScratch are presample's: the step's presampled tokens by row,
	// the rows it samples and each of its goroutines' buffers.
	pre        []presampled
	preRows    []int
	preScratch []*sampleScratch
	// phases times the running step's parts for StepInfo (engine goroutine only).
	phases  StepInfo
	nextSeq kvcache.SeqID
	live    map[*request]struct{}
	dequeue []*request
	counts  counters
	// failStreak counts the forward passes that failed in a row; unhealthy is
	// Stats.Unhealthy; reopened is set once model came from Config.ReopenModel.
	failStreak int
	unhealthy  string
	reopened   bool
	// faults are test-only fault-injection points (faults.go); nil outside tests.
	faults *faultHooks

	// Shared with Submit, Abort and Shutdown; guarded by mu.
	mu     sync.Mutex
	inbox  []*request
	aborts []*request
	ids    map[string]*request
	// queued counts the requests accepted and not yet admitted, queuedSeqs their
	// sequences, and queuedFit those among them that were accepted into free batch slots;
	// MaxQueue caps the rest (queued - queuedFit), the requests that have to wait.
	// runningSeqs counts the sequences of admitted requests that have not ended.
	queued      int
	queuedSeqs  int
	queuedFit   int
	runningSeqs int
	closed      bool // Submit refuses new requests
	draining    bool // finish the live requests, then stop
	stopNow     bool // abort everything and stop
	started     bool

	wake chan struct{} // capacity 1: "look at the inbox"
	done chan struct{} // closed when the loop has stopped

	statsMu sync.Mutex
	stats   Stats
}

// counters are the engine goroutine's running totals for Stats.
type counters struct {
	promptTokens     int64
	generationTokens int64
	steps            int64
	fedTokens        int64
	batchSizes       []int
	stepTokens       []int
	stepDurations    []time.Duration
	droppedEvents    int64
	schedulerErrors  int64 // scheduler.Update errors (bookkeeping bugs), logged
	failedSteps      int64
	restarts         int64
	panics           int64
}

// New builds an engine for model: a KV cache of cfg.KVCacheBytes, a scheduler, and the
// tokenizer tok for text (tok may be nil: events then carry token ids only). The engine
// does not run until Start.
func New(cfg Config, model Model, tok *tokenizer.Tokenizer) (*Engine, error) {
	var text textSource
	if tok != nil {
		text = tokenizerText{tok}
	}
	return newEngine(cfg, model, text)
}

func newEngine(cfg Config, model Model, text textSource) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if model == nil {
		return nil, fmt.Errorf("%w: nil model", ErrInvalidConfig)
	}
	if ext := cfg.Speculation.External && cfg.Speculation.NumTokens > 0; ext != (cfg.DraftModel != nil) {
		// The draft model is the engine's, not the configuration's: checked here.
		return nil, fmt.Errorf("%w: external speculation (%v) and a draft model (%v) go together", ErrInvalidConfig, ext, cfg.DraftModel != nil)
	}
	spec := model.Spec()
	if spec.NumLayers <= 0 || spec.NumKVHeads <= 0 || spec.HeadDim <= 0 || spec.VocabSize <= 0 || spec.MaxPositions <= 1 {
		return nil, fmt.Errorf("%w: model spec %+v", ErrInvalidConfig, spec)
	}
	dt, err := kvDType(spec.KVDType)
	if err != nil {
		return nil, err
	}
	if cfg.BlockSizeTokens, err = spec.BlockSize(cfg.BlockSizeTokens); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	maxLen := spec.MaxPositions
	if cfg.MaxModelLen > maxLen {
		// As vLLM refuses it: a context the model was not built for is not served in silence
		// at the model's own.
		return nil, fmt.Errorf("%w: --max-model-len %d is more than the model's context of %d positions", ErrInvalidConfig, cfg.MaxModelLen, maxLen)
	}
	if cfg.MaxModelLen > 0 {
		maxLen = cfg.MaxModelLen
	}
	layout := spec.CacheLayout(maxLen)
	numBlocks := kvcache.NumBlocksForBudget(cfg.KVCacheBytes, cfg.BlockSizeTokens, layout.PerBlock, spec.NumKVHeads, spec.HeadDim, dt)
	if numBlocks < len(layout.Windows) {
		return nil, fmt.Errorf("%w: KVCacheBytes %d holds %d %d-token blocks (%d bytes each); the model needs at least %d (a block for each of its attention windows)", ErrInvalidConfig,
			cfg.KVCacheBytes, numBlocks, cfg.BlockSizeTokens,
			kvcache.BlockBytes(cfg.BlockSizeTokens, layout.PerBlock, spec.NumKVHeads, spec.HeadDim, dt), len(layout.Windows))
	}
	// One sequence of the whole context must fit in the cache, else replies would end at
	// "length" far short of the context with nothing said: each full-attention group holds
	// blocks for all of its tokens (a sliding-window group gives back what its window has
	// passed, so only the full groups bound it). An asked-for MaxModelLen is refused, as
	// vLLM refuses it; the model's own context is capped to what fits, and the log says so.
	if fits := fullContextTokens(layout, numBlocks, cfg.BlockSizeTokens); fits < maxLen {
		if cfg.MaxModelLen > 0 || fits < 2 {
			return nil, fmt.Errorf("%w: KVCacheBytes %d holds %d tokens of one sequence, fewer than MaxModelLen %d; give more KVCacheBytes or a smaller MaxModelLen", ErrInvalidConfig,
				cfg.KVCacheBytes, fits, maxLen)
		}
		log.Warn("the KV cache holds less than the model's context: max_model_len is capped to what fits (raise --kv-cache-memory to serve the whole context)",
			"max_model_len", fits, "context", maxLen)
		maxLen = fits
	}
	pool, err := kvcache.NewPool(layout.Pool(kvcache.PoolConfig{
		NumBlocks: numBlocks, BlockSizeTokens: cfg.BlockSizeTokens, EnablePrefixCaching: cfg.EnablePrefixCaching,
	}))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	storage, err := kvcache.NewStorage(layout.Storage(kvcache.StorageConfig{
		NumBlocks: numBlocks, BlockSizeTokens: cfg.BlockSizeTokens, Layers: spec.NumLayers,
		KVHeads: spec.NumKVHeads, HeadDim: spec.HeadDim, DType: dt, Parallelism: cfg.StorageParallelism,
		TokenMajor: spec.KVTokenMajor, NoArenas: spec.KVOnDevice,
	}))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var copier models.BlockCopier // nil: blocks are copied in the host storage
	if spec.KVOnDevice {
		var ok bool
		if copier, ok = model.(models.BlockCopier); !ok {
			storage.Close()
			return nil, fmt.Errorf("%w: the model keeps its KV cache on its device but cannot copy blocks there", ErrInvalidConfig)
		}
	}
	scfg := cfg.schedulerConfig(maxLen)
	sched, err := scheduler.New(scfg, pool)
	if err != nil {
		storage.Close()
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var d *drafter
	if cfg.DraftModel != nil {
		// The draft's cache holds the sequences that speculate at once (at most
		// disable_by_batch_size, else every running one) at full length, and never more
		// tokens than the model's own cache.
		rows := cfg.Speculation.MaxBatch
		if rows <= 0 {
			rows = cfg.MaxNumSeqs
		}
		tokens := min(numBlocks*cfg.BlockSizeTokens, rows*maxLen)
		if d, err = newDrafter(cfg.DraftModel, spec, tokens, maxLen, log); err != nil {
			storage.Close()
			return nil, err
		}
	}
	e := &Engine{
		cfg:         cfg,
		log:         log,
		model:       model,
		spec:        spec,
		text:        text,
		maxModelLen: maxLen,
		numBlocks:   numBlocks,
		cacheTokens: pool.MaxSeqTokens(scfg.MaxNumBatchedTokens),
		blockSize:   cfg.BlockSizeTokens,
		maxSeqsReq:  cfg.MaxNumSeqs,
		pool:        pool,
		storage:     storage,
		copier:      copier,
		drafter:     d,
		sched:       sched,
		nextSeq:     1,
		live:        make(map[*request]struct{}),
		ids:         make(map[string]*request),
		wake:        make(chan struct{}, 1),
		done:        make(chan struct{}),
	}
	if cfg.Policy == PolicyStatic {
		e.maxSeqsReq = cfg.MaxBatchSize
	}
	e.batch.Cache = storage
	e.eos = append(e.eos, spec.EOSTokenIDs...)
	if text != nil {
		for _, id := range text.eos() {
			if !slices.Contains(e.eos, id) {
				e.eos = append(e.eos, id)
			}
		}
	}
	e.publishStats()
	return e, nil
}

// closeCaches gives back the memory of the KV cache and of the draft model's.
func (e *Engine) closeCaches() {
	e.storage.Close()
	if e.drafter != nil {
		e.drafter.reset()
		e.drafter.close()
	}
}

// MaxModelLen returns the longest sequence (prompt + generated tokens) the engine runs.
func (e *Engine) MaxModelLen() int { return e.maxModelLen }

// NumKVBlocks returns the number of blocks in the KV cache.
func (e *Engine) NumKVBlocks() int { return e.numBlocks }

// EOSTokenIDs returns the ids that end a sequence (the model's and the tokenizer's).
func (e *Engine) EOSTokenIDs() []int32 { return append([]int32(nil), e.eos...) }

// Submit validates req and queues it. The returned channel receives the request's events
// and is closed after the last one (which carries Usage). The engine never waits for a
// slow reader: when the channel's buffer is full, a sequence's events are merged into one
// (token ids, text and logprobs concatenated) until there is room again. When ctx is done
// the request is aborted (its last event has FinishAbort) and its KV blocks are free by
// the next step.
//
// Submit decides synchronously: ErrInvalidRequest or ErrPromptTooLong for bad input,
// ErrOverloaded when MaxQueue requests already wait for a batch slot, ErrClosed after
// Shutdown. Under the continuous policy a request whose sequences fit in the batch's free
// slots (MaxNumSeqs less the sequences running or accepted before it) does not wait, so it
// never counts against MaxQueue: a burst on an idle server is not refused. The caller may
// reuse req once Submit returns.
func (e *Engine) Submit(ctx context.Context, req *Request) (<-chan Event, error) {
	if req == nil {
		return nil, fmt.Errorf("%w: nil request", ErrInvalidRequest)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := e.Limits().Check(req)
	if err != nil {
		return nil, err
	}
	r := &request{
		id:      req.ID,
		params:  p,
		prompt:  append([]int32(nil), req.Prompt...),
		arrival: time.Now(),
		bestOf:  p.BestOf > p.N,
	}
	// A bounded buffer: up to eventBuffer events in flight plus a reserved slot for each
	// sequence's final event. A reader that falls behind gets its sequences' later
	// events merged (see send), so memory does not grow with max_tokens × n.
	r.reserve = p.N + 1
	capacity := min(p.N*(p.MaxTokens+1)+1, eventBuffer+r.reserve)
	if p.BestOf > p.N {
		capacity = p.N + 1 // the N results, sent at the end
	}
	r.ch = make(chan Event, capacity)
	r.nseq = max(p.N, p.BestOf)

	e.mu.Lock()
	fit := e.fitsLocked(r.nseq)
	switch {
	case e.closed:
		e.mu.Unlock()
		return nil, ErrClosed
	case !fit && e.queued-e.queuedFit >= e.cfg.MaxQueue:
		n := e.queued - e.queuedFit
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: %d requests waiting", ErrOverloaded, n)
	case r.id != "" && e.ids[r.id] != nil:
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: request id %q is already running", ErrInvalidRequest, r.id)
	}
	if r.id != "" {
		e.ids[r.id] = r
	}
	e.queued++
	e.queuedSeqs += r.nseq
	r.queued = true
	if fit {
		e.queuedFit++
		r.fit = true
	}
	r.accepted = true
	e.inbox = append(e.inbox, r)
	// Registered under mu so the engine, which ends requests under mu too, sees it set.
	r.stopWatch = context.AfterFunc(ctx, func() { e.abortRequest(r) })
	e.mu.Unlock()
	e.signal()
	return r.ch, nil
}

// fullContextTokens is the longest sequence whose full-attention groups' blocks fit in
// numBlocks; math.MaxInt when every group has a sliding window.
func fullContextTokens(layout kvcache.Layout, numBlocks, blockSize int) int {
	full := 0
	for _, w := range layout.Windows {
		if w == 0 {
			full++
		}
	}
	if full == 0 {
		return math.MaxInt
	}
	return numBlocks / full * blockSize
}

// fitsLocked reports whether n more sequences fit in the batch's free slots, counting the
// sequences running and those of every request still queued. Only the continuous policy
// admits a request as soon as it fits; under the static and sequential policies every
// request not yet admitted waits. Called with mu held.
func (e *Engine) fitsLocked(n int) bool {
	return e.cfg.Policy == PolicyContinuous && e.runningSeqs+e.queuedSeqs+n <= e.cfg.MaxNumSeqs
}

// MaxPrompts is how many requests of seqs sequences each Submit can accept at once on an
// idle engine: as many as fit in a batch, plus MaxQueue waiting. A caller that submits
// several requests together (a completions request with a list of prompts) can refuse
// more than this as a bad request, since no amount of waiting would admit them all.
func (e *Engine) MaxPrompts(seqs int) int {
	if e.cfg.Policy != PolicyContinuous {
		return e.cfg.MaxQueue
	}
	return e.cfg.MaxNumSeqs/max(seqs, 1) + e.cfg.MaxQueue
}

// Abort ends the request with the given id, if it is still running: its sequences end
// with FinishAbort and their KV blocks are free by the next step.
func (e *Engine) Abort(id string) {
	e.mu.Lock()
	r := e.ids[id]
	if r != nil {
		e.aborts = append(e.aborts, r)
	}
	e.mu.Unlock()
	if r != nil {
		e.signal()
	}
}

// abortRequest is Abort for a request whose context is done.
func (e *Engine) abortRequest(r *request) {
	e.mu.Lock()
	ok := r.accepted && !r.ended
	if ok {
		e.aborts = append(e.aborts, r)
	}
	e.mu.Unlock()
	if ok {
		e.signal()
	}
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Stats returns a snapshot of the engine, updated after every step.
func (e *Engine) Stats() Stats {
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	s := e.stats
	s.RecentBatchSizes = append([]int(nil), s.RecentBatchSizes...)
	s.RecentStepTokens = append([]int(nil), s.RecentStepTokens...)
	s.RecentStepDurations = append([]time.Duration(nil), s.RecentStepDurations...)
	s.SpecAcceptedAt = append([]int64(nil), s.SpecAcceptedAt...)
	return s
}

// Start runs the engine loop in a new goroutine until ctx is done (every live request is
// then aborted) or Shutdown completes. It does nothing if the engine already ran or was
// shut down.
func (e *Engine) Start(ctx context.Context) {
	e.mu.Lock()
	first := !e.started
	e.started = true
	e.mu.Unlock()
	if first {
		go e.run(ctx)
	}
}

func (e *Engine) run(ctx context.Context) {
	defer close(e.done)
	defer e.closeCaches() // the caches' memory goes back as the engine stops
	defer e.closeReopened()
	defer func() {
		e.mu.Lock()
		e.closed = true
		e.mu.Unlock()
	}()

	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		draining, stopNow := e.takeInbox()
		if ctx.Err() != nil || stopNow {
			e.abortAll()
			e.publishStats()
			return
		}
		if draining && len(e.live) == 0 {
			e.publishStats()
			return
		}
		if !e.sched.HasWork() {
			if e.drafter != nil {
				e.drafter.reset() // no sequence left: the draft's cache is empty too
			}
			e.publishStats()
			select {
			case <-e.wake:
			case <-ctx.Done():
			}
			continue
		}
		start := time.Now() // a step's duration includes its scheduling
		plan := e.sched.Schedule()
		e.failNoCapacity(plan.Failed)
		if len(plan.Items) == 0 {
			// Nothing can run yet (a static batch is forming): sleep until it may form
			// or something arrives.
			e.publishStats()
			wait := 50 * time.Millisecond
			if t, ok := e.sched.NextBatchTime(); ok {
				wait = max(time.Until(t), 0)
			}
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-e.wake:
			case <-timer.C:
			case <-ctx.Done():
			}
			timer.Stop()
			continue
		}
		e.step(plan, start)
	}
}

// Shutdown stops accepting requests (Submit returns ErrClosed), lets the live ones finish
// until ctx is done, then aborts the rest, and returns once the engine loop has stopped.
// It returns ctx.Err() when requests had to be aborted. If the engine never ran, the
// queued requests are aborted at once.
func (e *Engine) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	e.closed = true
	e.draining = true
	started := e.started
	e.started = true
	e.mu.Unlock()
	if !started {
		e.takeInbox()
		e.abortAll()
		e.publishStats()
		e.closeCaches()
		close(e.done)
		return nil
	}
	e.signal()
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
	}
	e.mu.Lock()
	e.stopNow = true
	e.mu.Unlock()
	e.signal()
	<-e.done
	return ctx.Err()
}

// Close aborts every live request and stops the engine (Shutdown without a grace
// period).
func (e *Engine) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
