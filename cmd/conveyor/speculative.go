package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/scheduler"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// defaultSpecMaxBatch is disable_by_batch_size when --speculative-config does not set it:
// above this many running sequences a step verifies no proposals. Measured on two CPU
// cores (docs/performance.md), speculation always on gave the default model 1.27x the
// tokens/s at 8 greedy streams and 1.07x at 8 sampled ones (little to look up), but 1.05x
// at 16: past 8 the gain is within the noise.
const defaultSpecMaxBatch = 8

// speculativeConfig is --speculative-config read: the scheduler's part and, for the
// draft_model method, the draft model to load.
type speculativeConfig struct {
	scheduler.Speculation
	// draft is the draft model's directory, checkpoint or GGUF file ("": no draft
	// model); draftQuantize builds a checkpoint draft with int8 or int4 weights.
	draft, draftQuantize string
}

// parseSpeculativeConfig reads --speculative-config, vLLM's JSON: {"method": "ngram",
// "num_speculative_tokens": K, "prompt_lookup_min": MIN, "prompt_lookup_max": MAX,
// "disable_by_batch_size": N} or {"method": "draft_model", "model": PATH,
// "num_speculative_tokens": K, "quantization": "int4", "disable_by_batch_size": N}. "" is
// off. Unknown keys, keys of the other method and other methods are refused.
func parseSpeculativeConfig(s string) (speculativeConfig, error) {
	if s == "" {
		return speculativeConfig{}, nil
	}
	var c struct {
		Method    string  `json:"method"`
		NumTokens *int    `json:"num_speculative_tokens"`
		LookupMin *int    `json:"prompt_lookup_min"`
		LookupMax *int    `json:"prompt_lookup_max"`
		MaxBatch  *int    `json:"disable_by_batch_size"`
		Model     *string `json:"model"`
		Quantize  *string `json:"quantization"`
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	err := dec.Decode(&c)
	if err == nil && dec.More() {
		err = errors.New("text after the JSON object")
	}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		if te.Field == "" {
			err = fmt.Errorf("want a JSON object, got a JSON %s", te.Value)
		} else {
			err = fmt.Errorf("%s: got a JSON %s", te.Field, te.Value)
		}
	}
	if err != nil {
		return speculativeConfig{}, fmt.Errorf("--speculative-config: %v", err)
	}
	switch c.Method {
	case "ngram", "draft_model":
	case "eagle", "eagle3", "medusa", "mlp_speculator":
		return speculativeConfig{}, fmt.Errorf("--speculative-config: method %q is not supported (supported: ngram, draft_model)", c.Method)
	default:
		return speculativeConfig{}, fmt.Errorf("--speculative-config: method %q: want ngram or draft_model", c.Method)
	}
	if c.NumTokens == nil {
		return speculativeConfig{}, fmt.Errorf("--speculative-config: num_speculative_tokens is required")
	}
	sc := speculativeConfig{Speculation: scheduler.Speculation{NumTokens: *c.NumTokens, LookupMin: 1, LookupMax: 4, MaxBatch: defaultSpecMaxBatch}}
	switch c.Method {
	case "ngram":
		if c.Model != nil || c.Quantize != nil {
			return speculativeConfig{}, fmt.Errorf("--speculative-config: model and quantization belong to the draft_model method, not ngram")
		}
		if c.LookupMax != nil {
			sc.LookupMax = *c.LookupMax
		}
		if c.LookupMin != nil {
			sc.LookupMin = *c.LookupMin
		}
	case "draft_model":
		if c.LookupMin != nil || c.LookupMax != nil {
			return speculativeConfig{}, fmt.Errorf("--speculative-config: prompt_lookup_min and prompt_lookup_max belong to the ngram method, not draft_model")
		}
		if c.Model == nil || *c.Model == "" {
			return speculativeConfig{}, fmt.Errorf(`--speculative-config: the draft_model method needs "model": the draft model's directory, checkpoint or GGUF file`)
		}
		if _, err := os.Stat(*c.Model); err != nil {
			return speculativeConfig{}, fmt.Errorf("--speculative-config: draft model: %v", err)
		}
		sc.External, sc.draft = true, *c.Model
		if c.Quantize != nil {
			if err := checkQuantize(*c.Quantize); err != nil {
				return speculativeConfig{}, fmt.Errorf("--speculative-config: quantization: %v", err)
			}
			sc.draftQuantize = *c.Quantize
		}
	}
	if c.MaxBatch != nil {
		sc.MaxBatch = *c.MaxBatch
	}
	if sc.NumTokens < 1 {
		return speculativeConfig{}, fmt.Errorf("--speculative-config: num_speculative_tokens %d must be at least 1", sc.NumTokens)
	}
	cfg := scheduler.DefaultConfig()
	cfg.Speculation = sc.Speculation
	if err := cfg.Validate(); err != nil {
		return speculativeConfig{}, fmt.Errorf("--speculative-config: %v", inFlagTerms(err))
	}
	return sc, nil
}

// loadDraft opens the draft model of sc, if any, for the model target loaded with o (the
// same device and runner options; a checkpoint draft is built with sc's quantization).
// A draft whose tokenizer's vocabulary differs from the target's is refused with one
// line (engine.New refuses one whose output differs in size). The caller closes what it
// returns (nil without a draft model).
func (sc speculativeConfig) loadDraft(target *loaded, o loadOptions) (models.Model, error) {
	if sc.draft == "" {
		return nil, nil
	}
	o.quantize = sc.draftQuantize
	d, err := load(sc.draft, o)
	if err != nil {
		return nil, fmt.Errorf("draft model: %w", err)
	}
	if err := sameVocabulary(target.tok, d.tok); err != nil {
		d.model.Close()
		return nil, fmt.Errorf("draft model %s: %w", sc.draft, err)
	}
	return d.model, nil
}

// sameVocabulary reports, as an error naming the first difference, whether tokenizers a
// (the model's) and b (a draft's) differ in their tokens, ids or special tokens.
func sameVocabulary(a, b *tokenizer.Tokenizer) error {
	if a.VocabSize() != b.VocabSize() {
		return fmt.Errorf("its tokenizer has %d tokens, the model's %d: a draft must share the model's tokenizer", b.VocabSize(), a.VocabSize())
	}
	for id := range int32(a.VocabSize()) {
		ta, _ := a.Token(id)
		tb, _ := b.Token(id)
		if ta != tb || a.IsSpecial(id) != b.IsSpecial(id) {
			return fmt.Errorf("its token %d is %q, the model's %q: a draft must share the model's tokenizer", id, tb, ta)
		}
	}
	return nil
}
