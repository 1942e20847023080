package openai

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/conveyor-llm/conveyor/engine"
)

// MaxTotalSeqs bounds the sequences of one HTTP request: prompts × best_of. (Every other
// limit is the engine's: see engine.Limits.Check.)
const MaxTotalSeqs = 1024

// Wire types of request numbers: counts and token ids are 32-bit integers.
const (
	minInt32 = -1 << 31
	maxInt32 = 1<<31 - 1
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
	samplingExtensions
}

// samplingExtensions are vLLM's sampling members beyond OpenAI's, with vLLM's names,
// which every generation endpoint accepts.
type samplingExtensions struct {
	TopK              opt[jsonInt]   `json:"top_k"`
	MinP              opt[float64]   `json:"min_p"`
	RepetitionPenalty opt[float64]   `json:"repetition_penalty"`
	MinTokens         opt[jsonInt]   `json:"min_tokens"`
	IgnoreEOS         opt[bool]      `json:"ignore_eos"`
	StopTokenIDs      opt[[]jsonInt] `json:"stop_token_ids"`
	IncludeStopStr    opt[bool]      `json:"include_stop_str_in_output"`
	SkipSpecialTokens opt[bool]      `json:"skip_special_tokens"`
	unservedExtensions
}

// unservedExtensions are vLLM's request members that Conveyor does not implement. Each
// is refused with a 400 naming it when it asks for something (any value but null and
// its default), never ignored: a client moving from vLLM learns at once which of its
// requests would be served differently.
type unservedExtensions struct {
	UseBeamSearch           opt[json.RawMessage] `json:"use_beam_search"`
	LengthPenalty           opt[json.RawMessage] `json:"length_penalty"`
	PromptLogprobs          opt[json.RawMessage] `json:"prompt_logprobs"`
	GuidedJSON              opt[json.RawMessage] `json:"guided_json"`
	GuidedRegex             opt[json.RawMessage] `json:"guided_regex"`
	GuidedChoice            opt[json.RawMessage] `json:"guided_choice"`
	GuidedGrammar           opt[json.RawMessage] `json:"guided_grammar"`
	StructuredOutputs       opt[json.RawMessage] `json:"structured_outputs"`
	TruncatePromptTokens    opt[json.RawMessage] `json:"truncate_prompt_tokens"`
	AllowedTokenIDs         opt[json.RawMessage] `json:"allowed_token_ids"`
	BadWords                opt[json.RawMessage] `json:"bad_words"`
	LogitsProcessors        opt[json.RawMessage] `json:"logits_processors"`
	ReturnTokensAsTokenIDs  opt[json.RawMessage] `json:"return_tokens_as_token_ids"`
	SpacesBetweenSpecial    opt[json.RawMessage] `json:"spaces_between_special_tokens"`
	Priority                opt[json.RawMessage] `json:"priority"`
	RepetitionDetection     opt[json.RawMessage] `json:"repetition_detection"`
	ThinkingTokenBudget     opt[json.RawMessage] `json:"thinking_token_budget"`
	KVTransferParams        opt[json.RawMessage] `json:"kv_transfer_params"`
	VLLMExtraArgs           opt[json.RawMessage] `json:"vllm_xargs"`
	GuidedWhitespacePattern opt[json.RawMessage] `json:"guided_whitespace_pattern"`
}

// unserved is one member Conveyor does not implement: refused unless null or one of its
// defaults (its JSON text, without spaces).
type unserved struct {
	name     string
	v        opt[json.RawMessage]
	defaults []string
	why      string
}

// refuseUnserved fails for the first member that asks for something.
func refuseUnserved(c *check, members []unserved) {
	for _, m := range members {
		if c.failed() || !m.v.Set {
			continue
		}
		raw := strings.Join(strings.Fields(string(m.v.V)), "")
		if raw == "null" || slices.Contains(m.defaults, raw) {
			continue
		}
		c.fail(UnsupportedParam(m.name, "%s", m.why))
	}
}

// check refuses every member that asks for something.
func (u *unservedExtensions) check(c *check) {
	refuseUnserved(c, []unserved{
		{"use_beam_search", u.UseBeamSearch, []string{"false"}, "beam search is not supported"},
		{"length_penalty", u.LengthPenalty, []string{"1", "1.0"}, "length_penalty (beam search) is not supported"},
		{"prompt_logprobs", u.PromptLogprobs, nil, "prompt_logprobs is not supported; completions give the prompt's logprobs with echo and logprobs"},
		{"guided_json", u.GuidedJSON, nil, "guided_json is not supported; use response_format {\"type\": \"json_schema\"}"},
		{"guided_regex", u.GuidedRegex, nil, "guided_regex is not supported"},
		{"guided_choice", u.GuidedChoice, nil, "guided_choice is not supported; use response_format with an enum schema"},
		{"guided_grammar", u.GuidedGrammar, nil, "guided_grammar is not supported"},
		{"guided_whitespace_pattern", u.GuidedWhitespacePattern, nil, "guided_whitespace_pattern is not supported"},
		{"structured_outputs", u.StructuredOutputs, nil, "structured_outputs is not supported; use response_format"},
		{"truncate_prompt_tokens", u.TruncatePromptTokens, nil, "truncate_prompt_tokens is not supported: a prompt too long for the context is refused"},
		{"allowed_token_ids", u.AllowedTokenIDs, nil, "allowed_token_ids is not supported; logit_bias can exclude tokens"},
		{"bad_words", u.BadWords, []string{"[]"}, "bad_words is not supported"},
		{"logits_processors", u.LogitsProcessors, []string{"[]"}, "logits_processors are not supported"},
		{"return_tokens_as_token_ids", u.ReturnTokensAsTokenIDs, []string{"false"}, "return_tokens_as_token_ids is not supported"},
		{"spaces_between_special_tokens", u.SpacesBetweenSpecial, []string{"true"}, "spaces_between_special_tokens false is not supported"},
		{"priority", u.Priority, []string{"0"}, "priority is not supported: requests are served first come, first served"},
		{"repetition_detection", u.RepetitionDetection, nil, "repetition_detection is not supported"},
		{"thinking_token_budget", u.ThinkingTokenBudget, nil, "thinking_token_budget is not supported"},
		{"kv_transfer_params", u.KVTransferParams, nil, "kv_transfer_params (disaggregated serving) is not supported"},
		{"vllm_xargs", u.VLLMExtraArgs, []string{"{}"}, "vllm_xargs is not supported"},
	})
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
	var items []json.RawMessage
	if err := json.Unmarshal(b, &items); err != nil {
		return err
	}
	many := make([]string, len(items))
	for i, it := range items {
		// json.Unmarshal would take a null as "": a stop string is a string.
		if jsonKind(it) != "a string" || json.Unmarshal(it, &many[i]) != nil {
			return errors.New("a stop string is not a string") // parseStop says which
		}
	}
	*s = many
	return nil
}

// Generation is what a decoded request of any generation endpoint asks of the engine.
type Generation struct {
	// Model is the model the request names.
	Model        string
	Stream       bool
	IncludeUsage bool // stream_options.include_usage
	Params       engine.SamplingParams
	// Names renames the engine's parameters in its errors to the endpoint's (chat's
	// messages, top_logprobs and max_completion_tokens): see WireError.
	Names map[string]string
}

// maxTokensParam is one member that may carry max_tokens (chat has two names for it).
type maxTokensParam struct {
	name string
	v    opt[jsonInt]
}

// parse decodes the shared members into engine sampling parameters; errors are left in
// c. Only wire types are checked here: the engine owns every limit on the values (its
// errors are renamed to the endpoint's members by names). Of the members in maxTokens,
// the last one present wins.
func (w *generationRequest) parse(c *check, m *Model, maxTokens ...maxTokensParam) Generation {
	g := Generation{Names: map[string]string{}}
	p := engine.DefaultSamplingParams()
	m.Defaults.apply(&p)

	model, ok := c.str("model", w.Model)
	if !c.failed() && (!ok || model == "") {
		c.fail(InvalidParam("model", "model is required"))
	}
	g.Model = model

	for _, m := range maxTokens {
		if m.v.Set {
			p.MaxTokens = int(c.integer(m.name, m.v, int64(p.MaxTokens), minInt32, maxInt32))
			g.Names["max_tokens"] = m.name
		}
	}
	p.Temperature = float32(c.number("temperature", w.Temperature, float64(p.Temperature)))
	p.TopP = float32(c.number("top_p", w.TopP, float64(p.TopP)))
	p.N = int(c.integer("n", w.N, 1, minInt32, maxInt32))
	g.Stream = c.boolean("stream", w.Stream, false)
	if shape(c, "stream_options", "an object", w.StreamOptions) {
		g.IncludeUsage = c.boolean("stream_options.include_usage", w.StreamOptions.V.IncludeUsage, false)
		c.boolean("stream_options.include_obfuscation", w.StreamOptions.V.IncludeObfuscation, false)
		if !c.failed() && !g.Stream {
			c.fail(InvalidParam("stream_options", "stream_options is only allowed when stream is true"))
		}
	}
	p.Stop = parseStop(c, w.Stop)
	p.PresencePenalty = float32(c.number("presence_penalty", w.PresencePenalty, 0))
	p.FrequencyPenalty = float32(c.number("frequency_penalty", w.FrequencyPenalty, 0))
	p.LogitBias = parseLogitBias(c, w.LogitBias)
	if w.Seed.Set {
		seed := c.integer("seed", w.Seed, 0, -1<<63, 1<<63-1)
		p.Seed = &seed
	}
	c.str("user", w.User)

	p.TopK = int(c.integer("top_k", w.TopK, int64(p.TopK), minInt32, maxInt32))
	p.MinP = float32(c.number("min_p", w.MinP, float64(p.MinP)))
	p.RepetitionPenalty = float32(c.number("repetition_penalty", w.RepetitionPenalty, float64(p.RepetitionPenalty)))
	p.MinTokens = int(c.integer("min_tokens", w.MinTokens, 0, minInt32, maxInt32))
	p.IgnoreEOS = c.boolean("ignore_eos", w.IgnoreEOS, false)
	p.StopTokenIDs = c.tokenIDList("stop_token_ids", w.StopTokenIDs)
	p.IncludeStopStr = c.boolean("include_stop_str_in_output", w.IncludeStopStr, false)
	p.KeepSpecialTokens = !c.boolean("skip_special_tokens", w.SkipSpecialTokens, true)
	w.unservedExtensions.check(c)
	p.Constraint = responseConstraint(c, m, w.ResponseFormat)
	g.Params = p
	return g
}

// parseStop returns stop's strings.
func parseStop(c *check, o opt[stopList]) []string {
	if c.failed() || !o.Set {
		return nil
	}
	if !o.OK {
		var items []json.RawMessage
		if json.Unmarshal(o.bad, &items) == nil {
			for i, it := range items {
				if jsonKind(it) != "a string" {
					c.fail(InvalidParam("stop", "stop[%d] must be a string, got %s", i, jsonKind(it)))
					return nil
				}
			}
		}
		c.fail(InvalidParam("stop", "stop must be a string or an array of strings, got %s", o.kind()))
		return nil
	}
	return o.V
}

// parseLogitBias returns logit_bias: {"token id": bias}.
func parseLogitBias(c *check, o opt[map[string]opt[float64]]) map[int32]float32 {
	if c.failed() || !o.Set {
		return nil
	}
	if !o.OK {
		c.fail(InvalidParam("logit_bias", "logit_bias must be an object mapping token ids to numbers, got %s", o.kind()))
		return nil
	}
	keys := slices.Sorted(maps.Keys(o.V)) // the first bad entry is the same one every time
	out := make(map[int32]float32, len(o.V))
	for _, k := range keys {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil {
			c.fail(InvalidParam("logit_bias", "logit_bias key %q is not a token id", k))
			return nil
		}
		v := o.V[k]
		if !v.Set || !v.OK {
			kind := "null"
			if v.Set {
				kind = v.kind()
			}
			c.fail(InvalidParam("logit_bias", "logit_bias value for %q must be a number, got %s", k, kind))
			return nil
		}
		out[int32(id)] = float32(v.V)
	}
	return out
}
