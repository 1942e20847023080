package openai

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/conveyor-llm/conveyor/engine"
)

// CompletionRequest is the wire schema of POST /v1/completions.
type CompletionRequest struct {
	generationRequest
	Prompt   opt[promptUnion] `json:"prompt"`
	Echo     opt[bool]        `json:"echo"`
	Logprobs opt[jsonInt]     `json:"logprobs"`
	BestOf   opt[jsonInt]     `json:"best_of"`
	Suffix   opt[string]      `json:"suffix"` // refused unless empty
}

// promptUnion is prompt: a string, an array of strings, an array of token ids, or an
// array of token-id arrays. Decoding never fails; a value of another shape is kept as
// the error validation reports.
type promptUnion struct {
	texts  []string    // a string (one prompt) or an array of strings
	ids    [][]jsonInt // an array of token ids (one prompt) or an array of token-id arrays
	nested bool        // ids came as an array of token-id arrays
	err    error
}

// UnmarshalJSON implements json.Unmarshaler; it never fails.
func (p *promptUnion) UnmarshalJSON(b []byte) error {
	*p = promptUnion{}
	p.err = p.decode(b)
	return nil
}

func (p *promptUnion) decode(b []byte) error {
	switch jsonKind(b) {
	case "a string":
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return InvalidParam("prompt", "prompt is not a valid string")
		}
		p.texts = []string{s}
		return nil
	case "an array":
	default:
		return InvalidParam("prompt", "prompt must be a string, an array of strings, an array of token ids or an array of token-id arrays, got %s", jsonKind(b))
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(b, &elems); err != nil {
		return InvalidParam("prompt", "prompt is not a valid array")
	}
	if len(elems) == 0 {
		return InvalidParam("prompt", "prompt must not be empty")
	}
	switch jsonKind(elems[0]) {
	case "a string":
		p.texts = make([]string, len(elems))
		for i, e := range elems {
			if jsonKind(e) != "a string" || json.Unmarshal(e, &p.texts[i]) != nil {
				return InvalidParam("prompt", "prompt[%d] must be a string like the first element, got %s", i, jsonKind(e))
			}
		}
	case "a number":
		var ids []jsonInt
		if err := json.Unmarshal(b, &ids); err != nil {
			return InvalidParam("prompt", "prompt is not a valid array")
		}
		p.ids = [][]jsonInt{ids}
	case "an array":
		p.nested = true
		p.ids = make([][]jsonInt, len(elems))
		for i, e := range elems {
			if jsonKind(e) != "an array" || json.Unmarshal(e, &p.ids[i]) != nil {
				return InvalidParam("prompt", "prompt[%d] must be an array of token ids like the first element, got %s", i, jsonKind(e))
			}
			if len(p.ids[i]) == 0 {
				return InvalidParam("prompt", "prompt[%d] must not be empty", i)
			}
		}
	default:
		return InvalidParam("prompt", "prompt[0] must be a string, a token id or an array of token ids, got %s", jsonKind(elems[0]))
	}
	return nil
}

// Prompt is one parsed prompt: its token ids and the text echo returns.
type Prompt struct {
	Tokens []int32
	Text   string
}

// ParsedCompletion is a validated /v1/completions request.
type ParsedCompletion struct {
	Generation
	Prompts []Prompt
	N       int // choices per prompt returned
	BestOf  int // sequences per prompt generated (>= N)
	Echo    bool
	// PromptOnly is echo with max_tokens 0: the prompt (and its logprobs) come back and
	// nothing is generated. The engine always generates, so one token is asked for and dropped.
	PromptOnly bool
}

// ParseCompletion validates a /v1/completions request and tokenizes its prompts.
func ParseCompletion(w *CompletionRequest, m *Model) (*ParsedCompletion, error) {
	c := &check{}
	g := w.parse(c, m, maxTokensParam{"max_tokens", w.MaxTokens})
	r := &ParsedCompletion{Generation: g}
	r.Echo = c.boolean("echo", w.Echo, false)
	// A negative logprobs goes to the engine as sent: its rule refuses it.
	lp := c.integer("logprobs", w.Logprobs, engine.NoLogprobs, minInt32, maxInt32)
	if s, ok := c.str("suffix", w.Suffix); ok && s != "" {
		c.fail(UnsupportedParam("suffix", "suffix is not supported"))
	}
	r.N = r.Params.N
	r.BestOf = int(c.integer("best_of", w.BestOf, int64(r.N), minInt32, maxInt32))
	if w.BestOf.Set && r.BestOf == 0 && !c.failed() { // the engine's 0 means "n"; a request's is a count
		c.fail(InvalidParam("best_of", "best_of must be at least n (%d), got 0", r.N))
	}
	if c.err != nil {
		return nil, c.err
	}
	if r.Stream && r.BestOf > r.N {
		return nil, InvalidParam("best_of", "best_of > n cannot be streamed")
	}
	if r.Params.MaxTokens == 0 && r.Echo {
		r.PromptOnly = true
		r.Params.MaxTokens = 1
		r.Params.MinTokens = 0
		r.Params.Stop = nil
	}
	r.Params.Logprobs = int(lp)
	if r.Echo && lp >= 0 {
		r.Params.PromptLogprobs = int(lp)
	}
	// best_of has one owner, the engine: it generates best_of sequences and sends back
	// the n with the highest cumulative logprob, best first, as indexes 0..n-1.
	r.Params.N, r.Params.BestOf = r.N, r.BestOf
	prompts, err := parsePrompt(w.Prompt, m)
	if err != nil {
		return nil, err
	}
	if len(prompts)*max(r.BestOf, 1) > MaxTotalSeqs {
		return nil, InvalidParam("prompt", "%d prompts × %d sequences exceeds the limit of %d sequences per request", len(prompts), r.BestOf, MaxTotalSeqs)
	}
	r.Prompts = prompts
	return r, nil
}

// parsePrompt tokenizes the prompts (or checks their token ids).
func parsePrompt(o opt[promptUnion], m *Model) ([]Prompt, error) {
	if !o.Set {
		return nil, InvalidParam("prompt", "prompt is required")
	}
	u := o.V
	if u.err != nil {
		return nil, u.err
	}
	var out []Prompt
	for i, s := range u.texts {
		if s == "" {
			return nil, InvalidParam("prompt", "prompt must not be empty")
		}
		ids, err := m.Tokenizer.Encode(s, true)
		if err != nil {
			return nil, InvalidParam("prompt", "prompt %d could not be tokenized: %v", i, err)
		}
		if len(ids) == 0 {
			return nil, InvalidParam("prompt", "prompt %d has no tokens", i)
		}
		out = append(out, Prompt{Tokens: ids, Text: s})
	}
	for i, list := range u.ids {
		name := "prompt"
		if u.nested {
			name = fmt.Sprintf("prompt[%d]", i)
		}
		ids, err := tokenIDs("prompt", name, list)
		if err != nil {
			return nil, err
		}
		out = append(out, Prompt{Tokens: ids, Text: m.Tokenizer.Decode(ids, false)})
	}
	return out, nil
}

// CompletionChoice is one choice of a completion response or chunk.
type CompletionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *CompletionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// CompletionResponse is a completion response or stream chunk (object text_completion).
type CompletionResponse = envelope[CompletionChoice]

// seqAcc accumulates one sequence's output.
type seqAcc struct {
	text     strings.Builder
	logprobs *CompletionLogprobs
	offset   int    // characters of text so far (logprobs text_offset)
	partial  []byte // bytes of a character not yet complete (logprobs text_offset)
	finish   engine.FinishReason
	started  bool
}

// completionOutput is the Converter of /v1/completions: choice index prompt_index*n + j,
// echo puts the prompt (and its logprobs) before a sequence's first text, and a
// prompt-only echo (max_tokens 0) drops the one token the engine generated.
type completionOutput struct {
	req  *ParsedCompletion
	tok  Tokenizer
	base CompletionResponse
	accs [][]seqAcc // [prompt][sequence]
}

// NewCompletionOutput is the converter of a /v1/completions request answered as the
// text_completion id, created and served under model.
func NewCompletionOutput(req *ParsedCompletion, tok Tokenizer, id string, created int64, model string) Converter {
	return newCompletionOutput(req, tok, id, created, model)
}

func newCompletionOutput(req *ParsedCompletion, tok Tokenizer, id string, created int64, model string) *completionOutput {
	base := newEnvelope[CompletionChoice](id, "text_completion", created, model, req.Stream && req.IncludeUsage)
	o := &completionOutput{req: req, tok: tok, base: base, accs: make([][]seqAcc, len(req.Prompts))}
	for i := range o.accs {
		o.accs[i] = make([]seqAcc, req.N)
	}
	return o
}

func (o *completionOutput) Add(pi int, ev *engine.Event) []any {
	acc := &o.accs[pi][ev.Index]
	text, lp := o.apply(acc, ev, o.req.Prompts[pi])
	if !o.req.Stream {
		acc.text.WriteString(text)
		if lp != nil {
			if acc.logprobs == nil {
				acc.logprobs = newCompletionLogprobs()
			}
			acc.logprobs.appendAll(lp)
		}
		return nil
	}
	if text == "" && ev.FinishReason == "" && (lp == nil || len(lp.Tokens) == 0) {
		return nil
	}
	return []any{o.base.chunk(CompletionChoice{Index: pi*o.req.N + ev.Index, Text: text, Logprobs: lp, FinishReason: finishReason(ev.FinishReason)})}
}

// apply folds one event into a sequence's accumulator and returns the text and
// logprobs this event adds (echo puts the prompt first on the sequence's first event).
func (o *completionOutput) apply(acc *seqAcc, ev *engine.Event, p Prompt) (string, *CompletionLogprobs) {
	var text strings.Builder
	var lp *CompletionLogprobs
	if o.req.Params.Logprobs >= 0 {
		lp = newCompletionLogprobs()
	}
	if !acc.started {
		acc.started = true
		if o.req.Echo {
			text.WriteString(p.Text)
			if lp != nil {
				lp.addPrompt(ev.PromptLogprobs, p.Text)
				acc.offset = utf8.RuneCountInString(p.Text)
			}
		}
	}
	if o.req.PromptOnly && ev.FinishReason != "" {
		ev.FinishReason = engine.FinishLength // the prompt is all that was asked for
	}
	if !o.req.PromptOnly {
		text.WriteString(ev.Text)
		if lp != nil {
			lp.addGenerated(ev.Logprobs, acc, o.tok)
		}
	}
	if ev.FinishReason != "" {
		acc.finish = ev.FinishReason
	}
	return text.String(), lp
}

func (o *completionOutput) Body(u Usage) any {
	var choices []CompletionChoice
	for pi := range o.req.Prompts {
		for j := 0; j < o.req.N; j++ {
			acc := &o.accs[pi][j]
			choices = append(choices, CompletionChoice{
				Index: pi*o.req.N + j, Text: acc.text.String(), Logprobs: acc.logprobs, FinishReason: finishReason(acc.finish),
			})
		}
	}
	return o.base.final(choices, o.usage(u))
}

func (o *completionOutput) UsageChunk(u Usage) any {
	return o.base.final([]CompletionChoice{}, o.usage(u))
}

// usage is the request's usage; a prompt-only echo generated nothing it reports.
func (o *completionOutput) usage(u Usage) Usage {
	if o.req.PromptOnly {
		u.CompletionTokens = 0
		u.TotalTokens = u.PromptTokens
	}
	return u
}
