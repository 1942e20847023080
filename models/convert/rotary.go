package convert

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

// RopeScalingParams is config.json's rope_scaling object.
type RopeScalingParams struct {
	RopeType                      string    `json:"rope_type"`
	Type                          string    `json:"type"` // the older key for rope_type
	Factor                        float64   `json:"factor"`
	LowFreqFactor                 float64   `json:"low_freq_factor"`
	HighFreqFactor                float64   `json:"high_freq_factor"`
	OriginalMaxPositionEmbeddings int       `json:"original_max_position_embeddings"`
	ShortFactor                   []float64 `json:"short_factor"`
	LongFactor                    []float64 `json:"long_factor"`
	AttentionFactor               *float64  `json:"attention_factor"`
}

// rotaryOf returns the rotary embedding cfg describes: head_dim (or its
// partial_rotary_factor share) turned with rope_theta's frequencies, rescaled as
// rope_scaling says: default, linear, llama3, and longrope up to the original context
// (where transformers uses the short factors; beyond it, it switches every position to
// the long factors, which a KV cache cannot follow, so the context is capped there).
func rotaryOf(cfg *Config) (rotaryPlan, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	headDim := cfg.HeadDimOrDefault()
	dims := headDim
	if f := cfg.PartialRotaryFactor; f != 0 {
		if f < 0 || f > 1 {
			return rotaryPlan{}, bad("partial_rotary_factor %g must be in (0, 1]", f)
		}
		dims = int(float64(headDim) * f) // as transformers: int(head_dim * factor)
		if dims%2 != 0 {
			return rotaryPlan{}, bad("partial_rotary_factor %g gives an odd rotary size %d", f, dims)
		}
	}
	// As transformers: 1 / theta ** (arange(0, dims, 2).float() / dims).
	inv := make([]float64, dims/2)
	for j := range inv {
		exp := float32(2*j) / float32(dims)
		inv[j] = float64(float32(1 / math.Pow(cfg.Theta(), float64(exp))))
	}
	raw := strings.TrimSpace(string(cfg.RopeScaling))
	if raw != "" && raw != "null" {
		var s RopeScalingParams
		if err := json.Unmarshal(cfg.RopeScaling, &s); err != nil {
			return rotaryPlan{}, bad("rope_scaling %s: %v", truncateForError(cfg.RopeScaling), err)
		}
		kind := s.RopeType
		if kind == "" {
			kind = s.Type
		}
		switch kind {
		case "default":
		case "linear":
			if s.Factor <= 0 {
				return rotaryPlan{}, bad("rope_scaling factor %g must be positive", s.Factor)
			}
			for j := range inv {
				inv[j] = float64(float32(inv[j]) / float32(s.Factor))
			}
		case "llama3":
			if err := llama3Frequencies(inv, s); err != nil {
				return rotaryPlan{}, err
			}
		case "longrope":
			return longRope(cfg, dims, s)
		default:
			return rotaryPlan{}, bad("rope_scaling rope_type %q is not supported (supported: default, linear, llama3, longrope)", kind)
		}
	}
	if f := cfg.ropeFreqFactors; f != nil {
		if len(f) != len(inv) {
			return rotaryPlan{}, bad("%d rope frequency factors for %d frequencies", len(f), len(inv))
		}
		for j := range inv {
			if !(f[j] > 0) {
				return rotaryPlan{}, bad("rope frequency factor %d is %g, not positive", j, f[j])
			}
			// As llama.cpp applies them: theta_j / factor_j, in float32.
			inv[j] = float64(float32(inv[j]) / f[j])
		}
	}
	r := rotaryPlan{dims: dims, invFreq: make([]float32, len(inv)), factor: 1}
	for j, f := range inv {
		r.invFreq[j] = float32(f)
	}
	return r, nil
}

// longRope is transformers' _compute_longrope_parameters for sequences within the
// original context: inverse frequencies 1 / (short_factor[j] * theta^(2j/dims)) and
// the attention factor sqrt(1 + ln(factor) / ln(original)), factor being
// max_position_embeddings / original_max_position_embeddings (Phi-3's top-level field)
// or rope_scaling's factor. The context is capped at the original one.
func longRope(cfg *Config, dims int, s RopeScalingParams) (rotaryPlan, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: rope_scaling (longrope): %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	if len(s.ShortFactor) != dims/2 || len(s.LongFactor) != dims/2 {
		return rotaryPlan{}, bad("short_factor and long_factor have %d and %d values, want %d (rotary dims / 2)", len(s.ShortFactor), len(s.LongFactor), dims/2)
	}
	factor := s.Factor
	orig := cfg.OriginalMaxPositionEmbeddings
	if orig > 0 {
		factor = float64(cfg.MaxPositionEmbeddings) / float64(orig)
	} else {
		orig = s.OriginalMaxPositionEmbeddings
		if orig <= 0 {
			orig = cfg.MaxPositionEmbeddings
		}
	}
	if orig <= 1 {
		return rotaryPlan{}, bad("original_max_position_embeddings %d must be above 1", orig)
	}
	att := 1.0
	switch {
	case s.AttentionFactor != nil:
		att = *s.AttentionFactor
	case factor > 1:
		att = math.Sqrt(1 + math.Log(factor)/math.Log(float64(orig)))
	}
	r := rotaryPlan{dims: dims, invFreq: make([]float32, dims/2), factor: float32(att)}
	for j, f := range s.ShortFactor {
		if f <= 0 {
			return rotaryPlan{}, bad("short_factor[%d] = %g must be positive", j, f)
		}
		shape := float32(2*j) / float32(dims)
		r.invFreq[j] = 1 / (float32(f) * float32(math.Pow(cfg.Theta(), float64(shape))))
	}
	if cfg.MaxPositionEmbeddings > orig {
		r.maxPositions = orig
	}
	return r, nil
}

// llama3Frequencies rescales inv in place as transformers'
// _compute_llama3_parameters does: wavelengths above original/low_freq_factor are
// divided by factor, those below original/high_freq_factor kept, and the band between
// interpolated smoothly. The arithmetic is float32, as there.
func llama3Frequencies(inv []float64, s RopeScalingParams) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: rope_scaling (llama3): %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case s.Factor <= 0:
		return bad("factor %g must be positive", s.Factor)
	case s.LowFreqFactor <= 0 || s.HighFreqFactor <= s.LowFreqFactor:
		return bad("low_freq_factor %g and high_freq_factor %g must satisfy 0 < low < high", s.LowFreqFactor, s.HighFreqFactor)
	case s.OriginalMaxPositionEmbeddings <= 0:
		return bad("original_max_position_embeddings %d must be positive", s.OriginalMaxPositionEmbeddings)
	}
	factor, low, high := float32(s.Factor), float32(s.LowFreqFactor), float32(s.HighFreqFactor)
	old := float32(s.OriginalMaxPositionEmbeddings)
	lowWavelen, highWavelen := old/low, old/high
	for j, f64 := range inv {
		f := float32(f64)
		wavelen := float32(2*math.Pi) / f
		scaled := f
		if wavelen > lowWavelen {
			scaled = f / factor
		}
		if !(wavelen < highWavelen) && !(wavelen > lowWavelen) {
			smooth := (old/wavelen - low) / (high - low)
			scaled = (1-smooth)*scaled/factor + smooth*scaled
		}
		inv[j] = float64(scaled)
	}
	return nil
}
