package api

import (
	"encoding/json"
	"strconv"

	"github.com/conveyor-llm/conveyor/engine"
)

// Limits on request fields that OpenAI leaves open.
const (
	maxN          = 128 // n and best_of
	maxStopWords  = 4   // stop strings
	maxLogprobs   = 5   // completions logprobs
	maxTopLogprob = 20  // chat top_logprobs
)

// common is what completions and chat requests share.
type common struct {
	model        string
	stream       bool
	includeUsage bool
	params       engine.SamplingParams
}

// parseCommon reads the fields both endpoints share into engine sampling parameters.
// maxTokensNames lists the members that may carry max_tokens (the last present wins).
// Errors are left in f.err.
func parseCommon(f *fields, b *Backend, maxTokensNames ...string) common {
	var c common
	p := engine.DefaultSamplingParams()

	model, ok := f.string("model")
	if f.err == nil && (!ok || model == "") {
		f.fail(invalidParam("model", "model is required"))
	}
	c.model = model

	maxLen := int64(b.MaxModelLen)
	if maxLen <= 0 {
		maxLen = 1 << 30
	}
	p.MaxTokens = 16
	for _, name := range maxTokensNames {
		if f.has(name) {
			p.MaxTokens = int(f.int(name, 16, 0, maxLen))
		}
	}
	d := b.Defaults
	p.Temperature = float32(f.float("temperature", orDefault(d.Temperature, 1, 0, 2), 0, 2))
	p.TopP = float32(f.float("top_p", orDefault(d.TopP, 1, 0, 1), 0, 1))
	if p.TopP == 0 {
		p.TopP = 1e-6 // only the most likely token survives
	}
	p.N = int(f.int("n", 1, 1, maxN))
	c.stream = f.bool("stream", false)
	if so := f.sub("stream_options"); so != nil {
		c.includeUsage = so.bool("include_usage", false)
		f.absorb(so)
		if f.err == nil && !c.stream {
			f.fail(invalidParam("stream_options", "stream_options is only allowed when stream is true"))
		}
	}
	p.Stop = parseStop(f)
	p.PresencePenalty = float32(f.float("presence_penalty", 0, -2, 2))
	p.FrequencyPenalty = float32(f.float("frequency_penalty", 0, -2, 2))
	p.LogitBias = parseLogitBias(f, b.vocab())
	if f.has("seed") {
		seed := f.int("seed", 0, -1<<63, 1<<63-1)
		p.Seed = &seed
	}
	f.string("user")

	// Extensions (vLLM names).
	defTopK := int64(0)
	if d.TopK != nil && *d.TopK > 0 && *d.TopK <= b.vocab() {
		defTopK = int64(*d.TopK)
	}
	topK := f.int("top_k", defTopK, -1, int64(b.vocab()))
	if topK < 0 {
		topK = 0
	}
	p.TopK = int(topK)
	p.MinP = float32(f.float("min_p", orDefault(d.MinP, 0, 0, 1), 0, 1))
	p.RepetitionPenalty = float32(f.float("repetition_penalty", orDefault(d.RepetitionPenalty, 1, 1e-6, 2), 0, 2))
	if f.err == nil && p.RepetitionPenalty == 0 {
		f.fail(invalidParam("repetition_penalty", "repetition_penalty must be greater than 0"))
	}
	p.MinTokens = int(f.int("min_tokens", 0, 0, maxLen))
	if f.err == nil && p.MinTokens > p.MaxTokens {
		f.fail(invalidParam("min_tokens", "min_tokens (%d) must not exceed max_tokens (%d)", p.MinTokens, p.MaxTokens))
	}
	p.IgnoreEOS = f.bool("ignore_eos", false)
	p.StopTokenIDs = parseTokenIDs(f, "stop_token_ids", b.vocab(), true)
	c.params = p
	return c
}

// parseStop reads stop: a string or an array of up to four strings. Empty strings are dropped.
func parseStop(f *fields) []string {
	v := f.raw("stop")
	if v == nil {
		return nil
	}
	var one string
	if jsonKind(v) == "a string" && json.Unmarshal(v, &one) == nil {
		if one == "" {
			return nil
		}
		return []string{one}
	}
	var many []string
	if jsonKind(v) != "an array" || json.Unmarshal(v, &many) != nil {
		f.fail(invalidParam("stop", "stop must be a string or an array of strings, got %s", jsonKind(v)))
		return nil
	}
	if len(many) > maxStopWords {
		f.fail(invalidParam("stop", "stop may hold at most %d strings, got %d", maxStopWords, len(many)))
		return nil
	}
	out := many[:0]
	for _, s := range many {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// parseLogitBias reads logit_bias: {"token id": bias in -100..100}.
func parseLogitBias(f *fields, vocab int) map[int32]float32 {
	v := f.raw("logit_bias")
	if v == nil {
		return nil
	}
	var m map[string]json.RawMessage
	if jsonKind(v) != "an object" || json.Unmarshal(v, &m) != nil {
		f.fail(invalidParam("logit_bias", "logit_bias must be an object mapping token ids to numbers, got %s", jsonKind(v)))
		return nil
	}
	out := make(map[int32]float32, len(m))
	for k, raw := range m {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 || int(id) >= vocab {
			f.fail(invalidParam("logit_bias", "logit_bias key %q is not a token id in 0..%d", k, vocab-1))
			return nil
		}
		var x float64
		if jsonKind(raw) != "a number" || json.Unmarshal(raw, &x) != nil {
			f.fail(invalidParam("logit_bias", "logit_bias value for %q must be a number, got %s", k, jsonKind(raw)))
			return nil
		}
		if x < -100 || x > 100 {
			f.fail(invalidParam("logit_bias", "logit_bias value for %q must be between -100 and 100, got %g", k, x))
			return nil
		}
		out[int32(id)] = float32(x)
	}
	return out
}

// parseTokenIDs reads an array of token ids, each in 0..vocab-1.
func parseTokenIDs(f *fields, name string, vocab int, allowEmpty bool) []int32 {
	elems, ok := f.array(name)
	if !ok {
		return nil
	}
	ids, err := tokenIDs(name, elems, vocab)
	if err != nil {
		f.fail(err)
		return nil
	}
	if len(ids) == 0 && !allowEmpty {
		f.fail(invalidParam(name, "%s must not be empty", name))
	}
	return ids
}

// tokenIDs converts JSON numbers to token ids, checking each against the vocabulary.
func tokenIDs(name string, elems []json.RawMessage, vocab int) ([]int32, error) {
	ids := make([]int32, len(elems))
	for i, e := range elems {
		n, ok := parseInt(e)
		if !ok {
			return nil, invalidParam(name, "%s[%d] must be an integer token id, got %s", name, i, jsonKind(e))
		}
		if n < 0 || n >= int64(vocab) {
			return nil, invalidParam(name, "%s[%d] = %d is not a token id (the vocabulary has ids 0..%d)", name, i, n, vocab-1)
		}
		ids[i] = int32(n)
	}
	return ids, nil
}

// vocab is the tokenizer's vocabulary size.
func (b *Backend) vocab() int { return b.Tokenizer.VocabSize() }
