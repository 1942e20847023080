package engine

import (
	"errors"
	"math"
	"time"

	"github.com/conveyor-llm/conveyor/engine/structured"
)

// Sentinel errors returned by Submit or carried by error events. The api package maps
// each one to an HTTP status in a single table.
var (
	// ErrOverloaded means the waiting queue is full; the caller should retry later (HTTP 429).
	ErrOverloaded = errors.New("engine: overloaded")
	// ErrPromptTooLong means the prompt does not fit the model's context window (HTTP 400).
	ErrPromptTooLong = errors.New("engine: prompt too long")
	// ErrInvalidRequest means the request's parameters are out of range (HTTP 400).
	ErrInvalidRequest = errors.New("engine: invalid request")
	// ErrClosed means the engine is shutting down or stopped (HTTP 503).
	ErrClosed = errors.New("engine: closed")
	// ErrInvalidConfig means an engine Config is out of range.
	ErrInvalidConfig = errors.New("engine: invalid configuration")
	// ErrModel means the forward pass failed; the request is ended, the engine keeps serving (HTTP 500).
	ErrModel = errors.New("engine: model failure")
	// ErrInternal means a bug ended the request (a panic while its tokens were sampled,
	// checked or sent, recovered by the engine); other requests are not affected (HTTP 500).
	ErrInternal = errors.New("engine: internal error")
)

// FinishReason tells why a sequence ended.
type FinishReason string

// Finish reasons. The empty string means the sequence is still running.
const (
	FinishStop   FinishReason = "stop"   // eos token, stop token id or stop string
	FinishLength FinishReason = "length" // max_tokens or the model's context
	FinishAbort  FinishReason = "abort"  // the client went away or Abort was called
	FinishError  FinishReason = "error"  // the forward pass failed or a bug ended the request; Event.Err says why
)

// SamplingParams control how each next token is chosen and when a sequence stops.
// The zero value is not valid: start from DefaultSamplingParams.
type SamplingParams struct {
	N                 int     // sequences to return per prompt (>= 1)
	BestOf            int     // sequences to generate; the N with the highest cumulative logprob are returned (0 = N)
	MaxTokens         int     // tokens to generate at most; clipped to the context room left
	MinTokens         int     // eos and stop token ids are ignored before this many tokens
	Temperature       float32 // 0 = greedy
	TopP              float32 // 1 = off
	TopK              int     // 0 = off
	MinP              float32 // 0 = off
	RepetitionPenalty float32 // 1 = off
	PresencePenalty   float32
	FrequencyPenalty  float32
	LogitBias         map[int32]float32
	Seed              *int64 // same seed + same prompt => same text, whatever else is in the batch
	IgnoreEOS         bool
	StopTokenIDs      []int32
	Stop              []string // stop strings; not emitted unless IncludeStopStr
	IncludeStopStr    bool     // the stop string that ends a sequence ends its text too (vLLM's include_stop_str_in_output)
	Logprobs          int      // NoLogprobs = none; k >= 0 = chosen token's logprob plus the k most likely alternatives
	PromptLogprobs    int      // NoLogprobs = none; k >= 0 = logprobs of the prompt tokens (echo with logprobs)
	// Constraint, when set, limits every sequence to outputs its grammar accepts
	// (structured output): tokens it does not allow are masked before anything else
	// sees the logits, and the sequence stops once its value is complete.
	Constraint *structured.Constraint
	// LazyConstraint applies only once LazyTrigger (a tool call's opening) appears in
	// the output: from the trigger's first byte on, the rest of the output is
	// constrained as Constraint constrains a whole one (tool_choice auto, as llama.cpp's
	// lazy grammars).
	LazyConstraint *structured.Constraint
	LazyTrigger    structured.Trigger
	// KeepSpecialTokens keeps special (control) tokens in the output text instead of
	// leaving them out (vLLM's skip_special_tokens=false): a tool-call format whose
	// calls open with a control token, as Mistral's [TOOL_CALLS], needs it to be seen.
	KeepSpecialTokens bool
}

// NoLogprobs is the Logprobs and PromptLogprobs of a request that asks for none. It is
// no count a client can send (those are int32), so that a negative count sent, -1
// included, reaches the rules as sent and is refused.
const NoLogprobs = math.MinInt

// DefaultSamplingParams returns the OpenAI defaults: one sequence, 16 tokens, temperature 1.
func DefaultSamplingParams() SamplingParams {
	return SamplingParams{
		N:                 1,
		MaxTokens:         16,
		Temperature:       1,
		TopP:              1,
		RepetitionPenalty: 1,
		Logprobs:          NoLogprobs,
		PromptLogprobs:    NoLogprobs,
	}
}

// Request is one generation request: a tokenized prompt and how to continue it.
type Request struct {
	ID     string  // unique; used by Abort
	Prompt []int32 // token ids, already including BOS when the model wants it
	Params SamplingParams
}

// TopLogprob is one alternative token at a position.
type TopLogprob struct {
	ID      int32
	Text    string
	Logprob float32
}

// TokenLogprob is the logprob of one chosen (or prompt) token and the most likely alternatives.
type TokenLogprob struct {
	ID      int32
	Text    string
	Logprob float32 // NaN for the first prompt token, which has no logprob
	Top     []TopLogprob
}

// Usage counts tokens for a whole request.
type Usage struct {
	PromptTokens     int
	CompletionTokens int // summed over all sequences
	CachedTokens     int // prompt tokens served from the prefix cache
}

// Timings are wall-clock instants of one sequence's life.
type Timings struct {
	Arrival    time.Time
	Scheduled  time.Time // first admitted into a batch
	FirstToken time.Time
	Finished   time.Time
}

// Event is one update for one sequence of a request. Events of all sequences of a
// request arrive on one channel, which the engine closes after the last sequence ends
// (the last event carries Usage).
type Event struct {
	Index             int     // which sequence of the request (0 .. N-1)
	TokenIDs          []int32 // tokens generated since the previous event of this sequence
	Text              string  // complete UTF-8 text released since the previous event (stop strings held back)
	Logprobs          []TokenLogprob
	PromptLogprobs    []TokenLogprob // on the first event of a sequence, when requested
	FinishReason      FinishReason   // non-empty on the sequence's last event
	CumulativeLogprob float64        // sum of the chosen tokens' raw logprobs so far; computed only when Logprobs >= 0 or BestOf > N
	Usage             *Usage         // set on the request's last event
	Timings           Timings
	Err               error // with FinishError
}

// Stats is a snapshot of the engine for metrics and the live view.
type Stats struct {
	Running, Waiting  int
	KVTotalBlocks     int
	KVFreeBlocks      int
	KVCachedBlocks    int
	KVUsage           float64 // used fraction of the KV pool, 0..1
	BlockSizeTokens   int
	Preemptions       int64
	SchedulerErrors   int64 // scheduler.Update errors (bookkeeping bugs, logged); 0 unless there is a bug
	PrefixQueryTokens int64
	PrefixHitTokens   int64
	PromptTokens      int64 // prompt tokens computed (not served from cache)
	GenerationTokens  int64
	Steps             int64 // forward passes run
	RecentBatchSizes  []int // sequences per step, newest last (bounded)

	FedTokens           int64           // tokens fed to the model over all steps (prompt, recomputation, decode)
	RecentStepTokens    []int           // tokens fed per step, newest last (bounded like RecentBatchSizes)
	RecentStepDurations []time.Duration // wall time per step, newest last (bounded like RecentBatchSizes)
	DroppedEvents       int64           // events that found their channel full (always 0 unless there is a bug)

	// Unhealthy says why the engine cannot serve ("" when it can): MaxStepFailures forward
	// passes in a row failed and the runner is being restarted, or could not be. It is
	// cleared by a successful restart or a successful pass. /health answers 503 with it.
	Unhealthy       string
	FailedSteps     int64 // forward passes that failed (each failed the requests in it)
	RunnerRestarts  int64 // runners reopened after MaxStepFailures failed passes in a row
	RecoveredPanics int64 // requests ended with ErrInternal by a recovered panic

	// Speculative decoding (Config.Speculation): drafts verified, the tokens they
	// proposed, those accepted, and accepted ones by their depth in the draft
	// (SpecAcceptedAt[j]: the (j+1)-th proposal of a step).
	SpecDrafts, SpecDraftTokens, SpecAcceptedTokens int64
	SpecAcceptedAt                                  []int64
}

// StepInfo describes one finished forward pass; Config.OnStep receives it on the engine goroutine.
type StepInfo struct {
	NumSeqs   int           // sequences in the batch
	NumTokens int           // tokens fed to the model
	Duration  time.Duration // the whole step: schedule, gather, forward, scatter, sample
	// PastTokens sums, over the batch's rows, the tokens already in the KV cache that
	// the step's attention reads; MaxPast is the longest row's.
	PastTokens, MaxPast int
	// The step's phases, in order: Schedule (the scheduler's plan), Forward (the model,
	// with the KV copies it needs), Sample (choosing tokens: constraint masks, logit
	// processors, sampling, logprobs) and Emit (everything else after the forward:
	// stop checks, detokenization, events, the scheduler's update). Duration is their
	// sum plus the small bookkeeping between them.
	Schedule, Forward, Sample, Emit time.Duration
	// Draft is the draft model's passes before Forward (speculative decoding with a draft
	// model; 0 without one), counted in Duration.
	Draft time.Duration
	// ParallelSampled counts the rows whose token was drawn on several goroutines at once
	// (rows sampling from their logits, when the step has two or more and GOMAXPROCS > 1).
	ParallelSampled int
}
