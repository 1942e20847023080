package attention

import (
	"errors"
	"fmt"
)

// ErrBadInput marks a call whose lengths, block tables or parameters do not fit
// together. The kernel is never entered with such input.
var ErrBadInput = errors.New("attention: bad input")

// Params describe one layer's attention. They are stored in a model's paged manifest,
// so the JSON names are part of the model-directory format.
type Params struct {
	NumHeads   int `json:"num_heads"`
	NumKVHeads int `json:"num_kv_heads"`
	HeadDim    int `json:"head_dim"`
	// Scale multiplies q·k; 1 when the graph folds 1/sqrt(head_dim) into the query
	// projection.
	Scale float32 `json:"scale"`
	// Rotary is applied to the new queries and keys before the keys are stored.
	Rotary Rotary `json:"rotary"`
	// SlidingWindow limits each query to the last SlidingWindow positions, its own
	// included (Mistral, Gemma 2/3 local layers); 0 attends to the whole past.
	SlidingWindow int `json:"sliding_window,omitempty"`
	// Softcap bounds the scores: s = Softcap * tanh(s / Softcap) (Gemma 2); 0 = none.
	Softcap float32 `json:"softcap,omitempty"`
}

// Rotary is rotate-half rotary position embedding over the first Dims dimensions of
// every query and key head: pairs (i, i+Dims/2) turn by position * InvFreq[i]. Dims
// below HeadDim is partial rotary (Phi); Dims 0 is a layer without rotary.
type Rotary struct {
	Dims    int       `json:"dims"`
	InvFreq []float32 `json:"inv_freq,omitempty"`
	// AttentionFactor multiplies cos and sin (YaRN, LongRoPE); 0 means 1.
	AttentionFactor float32 `json:"attention_factor,omitempty"`
}

// Group returns the query heads per KV head.
func (p Params) Group() int { return p.NumHeads / p.NumKVHeads }

// QKVCols returns the floats of one token's packed q|k|v row.
func (p Params) QKVCols() int { return (p.NumHeads + 2*p.NumKVHeads) * p.HeadDim }

// OutCols returns the floats of one token's attention output row.
func (p Params) OutCols() int { return p.NumHeads * p.HeadDim }

// Validate checks that the parameters describe an attention this package computes.
func (p Params) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
	}
	switch {
	case p.NumHeads <= 0 || p.NumKVHeads <= 0 || p.HeadDim <= 0:
		return bad("num_heads %d, num_kv_heads %d and head_dim %d must be positive", p.NumHeads, p.NumKVHeads, p.HeadDim)
	case p.NumHeads%p.NumKVHeads != 0:
		return bad("num_heads %d is not a multiple of num_kv_heads %d", p.NumHeads, p.NumKVHeads)
	case p.HeadDim > 1024:
		return bad("head_dim %d is above 1024", p.HeadDim)
	case !(p.Scale > 0):
		return bad("scale %v must be positive", p.Scale)
	case p.SlidingWindow < 0:
		return bad("sliding_window %d is negative", p.SlidingWindow)
	case p.Softcap < 0:
		return bad("softcap %v is negative", p.Softcap)
	case p.Rotary.Dims < 0 || p.Rotary.Dims%2 != 0 || p.Rotary.Dims > p.HeadDim:
		return bad("rotary dims %d must be even and within head_dim %d", p.Rotary.Dims, p.HeadDim)
	case len(p.Rotary.InvFreq) != p.Rotary.Dims/2:
		return bad("rotary has %d inverse frequencies for %d dims, want %d", len(p.Rotary.InvFreq), p.Rotary.Dims, p.Rotary.Dims/2)
	case p.Rotary.AttentionFactor < 0:
		return bad("rotary attention_factor %v is negative", p.Rotary.AttentionFactor)
	}
	return nil
}
