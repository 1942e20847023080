package api

import (
	"strings"
	"unicode/utf8"

	"github.com/conveyor-llm/conveyor/engine"
)

// completionChoice is one choice of a completion response or chunk.
type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// completionResponse is a completion response or stream chunk (object text_completion).
type completionResponse = envelope[completionChoice]

// seqAcc accumulates one sequence's output.
type seqAcc struct {
	text     strings.Builder
	logprobs *completionLogprobs
	offset   int    // characters of text so far (logprobs text_offset)
	partial  []byte // bytes of a character not yet complete (logprobs text_offset)
	finish   engine.FinishReason
	started  bool
}

// completionOutput is the converter of /v1/completions: choice index prompt_index*n + j,
// echo puts the prompt (and its logprobs) before a sequence's first text, and a
// prompt-only echo (max_tokens 0) drops the one token the engine generated.
type completionOutput struct {
	req  *parsedCompletion
	tok  Tokenizer
	base completionResponse
	accs [][]seqAcc // [prompt][sequence]
}

func newCompletionOutput(req *parsedCompletion, tok Tokenizer, id string, created int64, model string) *completionOutput {
	base := newEnvelope[completionChoice](id, "text_completion", created, model, req.stream && req.includeUsage)
	o := &completionOutput{req: req, tok: tok, base: base, accs: make([][]seqAcc, len(req.prompts))}
	for i := range o.accs {
		o.accs[i] = make([]seqAcc, req.n)
	}
	return o
}

func (o *completionOutput) add(pi int, ev *engine.Event) []any {
	acc := &o.accs[pi][ev.Index]
	text, lp := o.apply(acc, ev, o.req.prompts[pi])
	if !o.req.stream {
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
	return []any{o.base.chunk(completionChoice{Index: pi*o.req.n + ev.Index, Text: text, Logprobs: lp, FinishReason: finishReason(ev.FinishReason)})}
}

// apply folds one event into a sequence's accumulator and returns the text and
// logprobs this event adds (echo puts the prompt first on the sequence's first event).
func (o *completionOutput) apply(acc *seqAcc, ev *engine.Event, p prompt) (string, *completionLogprobs) {
	var text strings.Builder
	var lp *completionLogprobs
	if o.req.params.Logprobs >= 0 {
		lp = newCompletionLogprobs()
	}
	if !acc.started {
		acc.started = true
		if o.req.echo {
			text.WriteString(p.text)
			if lp != nil {
				lp.addPrompt(ev.PromptLogprobs, p.text)
				acc.offset = utf8.RuneCountInString(p.text)
			}
		}
	}
	if o.req.promptOnly && ev.FinishReason != "" {
		ev.FinishReason = engine.FinishLength // the prompt is all that was asked for
	}
	if !o.req.promptOnly {
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

func (o *completionOutput) body(u usageJSON) any {
	var choices []completionChoice
	for pi := range o.req.prompts {
		for j := 0; j < o.req.n; j++ {
			acc := &o.accs[pi][j]
			choices = append(choices, completionChoice{
				Index: pi*o.req.n + j, Text: acc.text.String(), Logprobs: acc.logprobs, FinishReason: finishReason(acc.finish),
			})
		}
	}
	return o.base.final(choices, o.usage(u))
}

func (o *completionOutput) usageChunk(u usageJSON) any {
	return o.base.final([]completionChoice{}, o.usage(u))
}

// usage is the request's usage; a prompt-only echo generated nothing it reports.
func (o *completionOutput) usage(u usageJSON) usageJSON {
	if o.req.promptOnly {
		u.CompletionTokens = 0
		u.TotalTokens = u.PromptTokens
	}
	return u
}
