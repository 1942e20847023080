package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/conveyor-llm/conveyor/scheduler"
)

// defaultSpecMaxBatch is disable_by_batch_size when --speculative-config does not set it:
// above this many running sequences a step verifies no proposals. Measured on two CPU
// cores (docs/performance.md), speculation always on gave the default model 1.27x the
// tokens/s at 8 greedy streams and 1.07x at 8 sampled ones (little to look up), but 1.05x
// at 16: past 8 the gain is within the noise.
const defaultSpecMaxBatch = 8

// parseSpeculativeConfig reads --speculative-config, vLLM's JSON: {"method": "ngram",
// "num_speculative_tokens": K, "prompt_lookup_min": MIN, "prompt_lookup_max": MAX,
// "disable_by_batch_size": N}. "" is off. Unknown keys and other methods are refused.
func parseSpeculativeConfig(s string) (scheduler.Speculation, error) {
	if s == "" {
		return scheduler.Speculation{}, nil
	}
	var c struct {
		Method    string `json:"method"`
		NumTokens *int   `json:"num_speculative_tokens"`
		LookupMin *int   `json:"prompt_lookup_min"`
		LookupMax *int   `json:"prompt_lookup_max"`
		MaxBatch  *int   `json:"disable_by_batch_size"`
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return scheduler.Speculation{}, fmt.Errorf("--speculative-config: %v", err)
	}
	switch c.Method {
	case "ngram":
	case "draft_model", "eagle", "eagle3", "medusa", "mlp_speculator":
		return scheduler.Speculation{}, fmt.Errorf("--speculative-config: method %q is not supported yet (supported: ngram)", c.Method)
	default:
		return scheduler.Speculation{}, fmt.Errorf("--speculative-config: method %q: want ngram", c.Method)
	}
	if c.NumTokens == nil {
		return scheduler.Speculation{}, fmt.Errorf("--speculative-config: num_speculative_tokens is required")
	}
	sp := scheduler.Speculation{NumTokens: *c.NumTokens, LookupMin: 1, LookupMax: 4, MaxBatch: defaultSpecMaxBatch}
	if c.LookupMax != nil {
		sp.LookupMax = *c.LookupMax
	}
	if c.LookupMin != nil {
		sp.LookupMin = *c.LookupMin
	}
	if c.MaxBatch != nil {
		sp.MaxBatch = *c.MaxBatch
	}
	cfg := scheduler.DefaultConfig()
	cfg.Speculation = sp
	if sp.NumTokens < 1 {
		return scheduler.Speculation{}, fmt.Errorf("--speculative-config: num_speculative_tokens %d must be at least 1", sp.NumTokens)
	}
	if err := cfg.Validate(); err != nil {
		return scheduler.Speculation{}, fmt.Errorf("--speculative-config: %v", err)
	}
	return sp, nil
}
