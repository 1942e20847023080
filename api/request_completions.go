package api

import (
	"encoding/json"
	"fmt"

	"github.com/conveyor-llm/conveyor/engine"
)

// completionRequest is the wire schema of POST /v1/completions.
type completionRequest struct {
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
			return invalidParam("prompt", "prompt is not a valid string")
		}
		p.texts = []string{s}
		return nil
	case "an array":
	default:
		return invalidParam("prompt", "prompt must be a string, an array of strings, an array of token ids or an array of token-id arrays, got %s", jsonKind(b))
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(b, &elems); err != nil {
		return invalidParam("prompt", "prompt is not a valid array")
	}
	if len(elems) == 0 {
		return invalidParam("prompt", "prompt must not be empty")
	}
	switch jsonKind(elems[0]) {
	case "a string":
		p.texts = make([]string, len(elems))
		for i, e := range elems {
			if jsonKind(e) != "a string" || json.Unmarshal(e, &p.texts[i]) != nil {
				return invalidParam("prompt", "prompt[%d] must be a string like the first element, got %s", i, jsonKind(e))
			}
		}
	case "a number":
		var ids []jsonInt
		if err := json.Unmarshal(b, &ids); err != nil {
			return invalidParam("prompt", "prompt is not a valid array")
		}
		p.ids = [][]jsonInt{ids}
	case "an array":
		p.nested = true
		p.ids = make([][]jsonInt, len(elems))
		for i, e := range elems {
			if jsonKind(e) != "an array" || json.Unmarshal(e, &p.ids[i]) != nil {
				return invalidParam("prompt", "prompt[%d] must be an array of token ids like the first element, got %s", i, jsonKind(e))
			}
			if len(p.ids[i]) == 0 {
				return invalidParam("prompt", "prompt[%d] must not be empty", i)
			}
		}
	default:
		return invalidParam("prompt", "prompt[0] must be a string, a token id or an array of token ids, got %s", jsonKind(elems[0]))
	}
	return nil
}

// prompt is one parsed prompt: its token ids and the text echo returns.
type prompt struct {
	tokens []int32
	text   string
}

// parsedCompletion is a validated /v1/completions request.
type parsedCompletion struct {
	generation
	prompts []prompt
	n       int // choices per prompt returned
	bestOf  int // sequences per prompt generated (>= n)
	echo    bool
	// promptOnly is echo with max_tokens 0: the prompt (and its logprobs) come back and
	// nothing is generated. The engine always generates, so one token is asked for and dropped.
	promptOnly bool
}

// parseCompletion decodes a /v1/completions request.
func parseCompletion(w *completionRequest, b *Backend) (*parsedCompletion, error) {
	c := &check{}
	g := w.parse(c, b, maxTokensParam{"max_tokens", w.MaxTokens})
	r := &parsedCompletion{generation: g}
	r.echo = c.boolean("echo", w.Echo, false)
	// A negative logprobs goes to the engine as sent: its rule refuses it.
	lp := c.integer("logprobs", w.Logprobs, engine.NoLogprobs, minInt32, maxInt32)
	if s, ok := c.str("suffix", w.Suffix); ok && s != "" {
		c.fail(unsupportedParam("suffix", "suffix is not supported"))
	}
	r.n = r.params.N
	r.bestOf = int(c.integer("best_of", w.BestOf, int64(r.n), minInt32, maxInt32))
	if c.err != nil {
		return nil, c.err
	}
	if r.stream && r.bestOf > r.n {
		return nil, invalidParam("best_of", "best_of > n cannot be streamed")
	}
	if r.params.MaxTokens == 0 && r.echo {
		r.promptOnly = true
		r.params.MaxTokens = 1
		r.params.MinTokens = 0
		r.params.Stop = nil
	}
	r.params.Logprobs = int(lp)
	if r.echo && lp >= 0 {
		r.params.PromptLogprobs = int(lp)
	}
	// best_of has one owner, the engine: it generates best_of sequences and sends back
	// the n with the highest cumulative logprob, best first, as indexes 0..n-1.
	r.params.N, r.params.BestOf = r.n, r.bestOf
	prompts, err := parsePrompt(w.Prompt, b)
	if err != nil {
		return nil, err
	}
	if len(prompts)*max(r.bestOf, 1) > maxTotalSeqs {
		return nil, invalidParam("prompt", "%d prompts × %d sequences exceeds the limit of %d sequences per request", len(prompts), r.bestOf, maxTotalSeqs)
	}
	r.prompts = prompts
	return r, nil
}

// parsePrompt tokenizes the prompts (or checks their token ids).
func parsePrompt(o opt[promptUnion], b *Backend) ([]prompt, error) {
	if !o.Set {
		return nil, invalidParam("prompt", "prompt is required")
	}
	u := o.V
	if u.err != nil {
		return nil, u.err
	}
	var out []prompt
	for i, s := range u.texts {
		if s == "" {
			return nil, invalidParam("prompt", "prompt must not be empty")
		}
		ids, err := b.Tokenizer.Encode(s, true)
		if err != nil {
			return nil, invalidParam("prompt", "prompt %d could not be tokenized: %v", i, err)
		}
		if len(ids) == 0 {
			return nil, invalidParam("prompt", "prompt %d has no tokens", i)
		}
		out = append(out, prompt{tokens: ids, text: s})
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
		out = append(out, prompt{tokens: ids, text: b.Tokenizer.Decode(ids, false)})
	}
	return out, nil
}
