package api

import (
	"encoding/json"
	"slices"
	"sort"
	"strconv"

	"github.com/conveyor-llm/conveyor/engine"
)

// Limits on request fields that OpenAI leaves open.
const (
	maxN          = 128  // n and best_of
	maxStopWords  = 4    // stop strings
	maxLogprobs   = 5    // completions logprobs
	maxTopLogprob = 20   // chat top_logprobs
	maxTotalSeqs  = 1024 // prompts × best_of in one request
)

// generationRequest is the wire schema both generation endpoints share: the OpenAI
// sampling members, stream and stream_options, response_format, the no-op user, and
// vLLM's sampling extensions. Each endpoint embeds it in its own request struct.
type generationRequest struct {
	Model            opt[string]                  `json:"model"`
	MaxTokens        opt[jsonInt]                 `json:"max_tokens"`
	Temperature      opt[float64]                 `json:"temperature"`
	TopP             opt[float64]                 `json:"top_p"`
	N                opt[jsonInt]                 `json:"n"`
	Stream           opt[bool]                    `json:"stream"`
	StreamOptions    opt[streamOptions]           `json:"stream_options"`
	Stop             opt[stopList]                `json:"stop"`
	PresencePenalty  opt[float64]                 `json:"presence_penalty"`
	FrequencyPenalty opt[float64]                 `json:"frequency_penalty"`
	LogitBias        opt[map[string]opt[float64]] `json:"logit_bias"`
	Seed             opt[jsonInt]                 `json:"seed"`
	User             opt[string]                  `json:"user"` // accepted, not used
	ResponseFormat   opt[responseFormat]          `json:"response_format"`

	// Extensions, with vLLM's names.
	TopK              opt[jsonInt]   `json:"top_k"`
	MinP              opt[float64]   `json:"min_p"`
	RepetitionPenalty opt[float64]   `json:"repetition_penalty"`
	MinTokens         opt[jsonInt]   `json:"min_tokens"`
	IgnoreEOS         opt[bool]      `json:"ignore_eos"`
	StopTokenIDs      opt[[]jsonInt] `json:"stop_token_ids"`
}

// streamOptions is stream_options.
type streamOptions struct {
	IncludeUsage       opt[bool] `json:"include_usage"`
	IncludeObfuscation opt[bool] `json:"include_obfuscation"` // accepted, not used: chunks carry no padding
}

// stopList is stop: a string or an array of strings.
type stopList []string

// UnmarshalJSON implements json.Unmarshaler.
func (s *stopList) UnmarshalJSON(b []byte) error {
	var one string
	if jsonKind(b) == "a string" && json.Unmarshal(b, &one) == nil {
		*s = stopList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*s = many
	return nil
}

// generation is what a validated request of either endpoint asks of the engine.
type generation struct {
	model        string
	stream       bool
	includeUsage bool
	params       engine.SamplingParams
}

// maxTokensParam is one member that may carry max_tokens (chat has two names for it).
type maxTokensParam struct {
	name string
	v    opt[jsonInt]
}

// parse validates the shared members into engine sampling parameters; errors are left
// in c. Of the members in maxTokens, the last one present wins, and its name is
// returned for the endpoint's own checks of the value.
func (w *generationRequest) parse(c *check, b *Backend, maxTokens ...maxTokensParam) (generation, string) {
	var g generation
	p := engine.DefaultSamplingParams()

	model, ok := c.str("model", w.Model)
	if !c.failed() && (!ok || model == "") {
		c.fail(invalidParam("model", "model is required"))
	}
	g.model = model

	maxLen := int64(b.MaxModelLen)
	if maxLen <= 0 {
		maxLen = 1 << 30
	}
	p.MaxTokens = 16
	maxTokensName := "max_tokens"
	for _, m := range maxTokens {
		if m.v.Set {
			p.MaxTokens = int(c.integer(m.name, m.v, 16, 0, maxLen))
			maxTokensName = m.name
		}
	}
	d := b.Defaults
	p.Temperature = float32(c.number("temperature", w.Temperature, orDefault(d.Temperature, 1, 0, 2), 0, 2))
	p.TopP = float32(c.number("top_p", w.TopP, orDefault(d.TopP, 1, 0, 1), 0, 1))
	if p.TopP == 0 {
		p.TopP = 1e-6 // only the most likely token survives
	}
	p.N = int(c.integer("n", w.N, 1, 1, maxN))
	g.stream = c.boolean("stream", w.Stream, false)
	if shape(c, "stream_options", "an object", w.StreamOptions) {
		g.includeUsage = c.boolean("stream_options.include_usage", w.StreamOptions.V.IncludeUsage, false)
		c.boolean("stream_options.include_obfuscation", w.StreamOptions.V.IncludeObfuscation, false)
		if !c.failed() && !g.stream {
			c.fail(invalidParam("stream_options", "stream_options is only allowed when stream is true"))
		}
	}
	p.Stop = parseStop(c, w.Stop)
	p.PresencePenalty = float32(c.number("presence_penalty", w.PresencePenalty, 0, -2, 2))
	p.FrequencyPenalty = float32(c.number("frequency_penalty", w.FrequencyPenalty, 0, -2, 2))
	p.LogitBias = parseLogitBias(c, w.LogitBias, b.vocab())
	if w.Seed.Set {
		seed := c.integer("seed", w.Seed, 0, -1<<63, 1<<63-1)
		p.Seed = &seed
	}
	c.str("user", w.User)

	defTopK := int64(0)
	if d.TopK != nil && *d.TopK > 0 && *d.TopK <= b.vocab() {
		defTopK = int64(*d.TopK)
	}
	topK := c.integer("top_k", w.TopK, defTopK, -1, int64(b.vocab()))
	if topK < 0 {
		topK = 0
	}
	p.TopK = int(topK)
	p.MinP = float32(c.number("min_p", w.MinP, orDefault(d.MinP, 0, 0, 1), 0, 1))
	p.RepetitionPenalty = float32(c.number("repetition_penalty", w.RepetitionPenalty, orDefault(d.RepetitionPenalty, 1, 1e-6, 2), 0, 2))
	if !c.failed() && p.RepetitionPenalty == 0 {
		c.fail(invalidParam("repetition_penalty", "repetition_penalty must be greater than 0"))
	}
	p.MinTokens = int(c.integer("min_tokens", w.MinTokens, 0, 0, maxLen))
	if !c.failed() && p.MinTokens > p.MaxTokens {
		c.fail(invalidParam("min_tokens", "min_tokens (%d) must not exceed max_tokens (%d)", p.MinTokens, p.MaxTokens))
	}
	p.IgnoreEOS = c.boolean("ignore_eos", w.IgnoreEOS, false)
	p.StopTokenIDs = c.tokenIDList("stop_token_ids", w.StopTokenIDs, b.vocab())
	p.Constraint = responseConstraint(c, b, w.ResponseFormat)
	g.params = p
	return g, maxTokensName
}

// parseStop returns stop's strings, at most four; empty strings are dropped.
func parseStop(c *check, o opt[stopList]) []string {
	if c.failed() || !o.Set {
		return nil
	}
	if !o.OK {
		c.fail(invalidParam("stop", "stop must be a string or an array of strings, got %s", o.kind()))
		return nil
	}
	if len(o.V) > maxStopWords {
		c.fail(invalidParam("stop", "stop may hold at most %d strings, got %d", maxStopWords, len(o.V)))
		return nil
	}
	out := slices.DeleteFunc(slices.Clone(o.V), func(s string) bool { return s == "" })
	if len(out) == 0 {
		return nil
	}
	return out
}

// parseLogitBias returns logit_bias: {"token id": bias in -100..100}.
func parseLogitBias(c *check, o opt[map[string]opt[float64]], vocab int) map[int32]float32 {
	if c.failed() || !o.Set {
		return nil
	}
	if !o.OK {
		c.fail(invalidParam("logit_bias", "logit_bias must be an object mapping token ids to numbers, got %s", o.kind()))
		return nil
	}
	keys := make([]string, 0, len(o.V))
	for k := range o.V {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first bad entry is the same one every time
	out := make(map[int32]float32, len(o.V))
	for _, k := range keys {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 || int(id) >= vocab {
			c.fail(invalidParam("logit_bias", "logit_bias key %q is not a token id in 0..%d", k, vocab-1))
			return nil
		}
		v := o.V[k]
		if !v.Set || !v.OK {
			kind := "null"
			if v.Set {
				kind = v.kind()
			}
			c.fail(invalidParam("logit_bias", "logit_bias value for %q must be a number, got %s", k, kind))
			return nil
		}
		if v.V < -100 || v.V > 100 {
			c.fail(invalidParam("logit_bias", "logit_bias value for %q must be between -100 and 100, got %g", k, v.V))
			return nil
		}
		out[int32(id)] = float32(v.V)
	}
	return out
}

// vocab is the tokenizer's vocabulary size.
func (b *Backend) vocab() int { return b.Tokenizer.VocabSize() }
