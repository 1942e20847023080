package scheduler

import "fmt"

// Speculative decoding: a decoding sequence brings its last token plus up to NumTokens
// proposed ones into the step (Item.Draft), next to the other rows' prompt chunks and
// single decodes; the engine gets logits at each of those positions, samples the
// sequence's tokens from them one by one exactly as it would have without proposals,
// and stops at the first sampled token that differs from its proposal (or at a stop).
// Update then keeps the KV of the accepted proposals and gives back the slots of the
// rejected ones (kvcache.Pool.Truncate): the prefix cache never holds a rejected token,
// since only committed tokens reach it.
//
// Proposals come from prompt lookup (vLLM's ngram method): the sequence's last n tokens,
// for n from LookupMax down to LookupMin, are looked for earlier in the sequence (prompt
// and output); the tokens that followed an earlier occurrence are proposed. With
// Speculation.External they come from the engine instead (a draft model): the plan
// reserves NumTokens slots for each speculating row, Item.Draft holds that many
// placeholders, and the engine writes its proposals over them, or shortens Draft, before
// the pass; Update gives back the slots of what was not kept.

// Speculation configures speculative decoding; the zero value is off.
type Speculation struct {
	// NumTokens is the most tokens proposed per sequence and step; 0 turns speculation off.
	NumTokens int
	// LookupMin and LookupMax bound the n-gram sizes prompt lookup matches (1 <= min <= max).
	LookupMin, LookupMax int
	// External leaves the proposals to the engine (a draft model): a speculating row's
	// Draft holds NumTokens placeholders for it to overwrite or shorten. LookupMin and
	// LookupMax are then unused.
	External bool
	// MaxBatch turns speculation off for a step whose running batch holds more than
	// MaxBatch sequences (vLLM's disable_by_batch_size): verification then costs more than
	// it saves. 0: no limit.
	MaxBatch int
}

// on reports whether speculation is configured.
func (c Speculation) on() bool { return c.NumTokens > 0 }

// validate checks the configuration.
func (c Speculation) validate() error {
	switch {
	case c.NumTokens < 0 || c.NumTokens > 64:
		return fmt.Errorf("%w: Speculation.NumTokens %d must be in [0, 64]", ErrInvalid, c.NumTokens)
	case !c.on():
		return nil
	case c.MaxBatch < 0:
		return fmt.Errorf("%w: Speculation.MaxBatch %d must be >= 0", ErrInvalid, c.MaxBatch)
	case c.External:
		return nil
	case c.LookupMin < 1 || c.LookupMax < c.LookupMin || c.LookupMax > 64:
		return fmt.Errorf("%w: Speculation.LookupMin %d and LookupMax %d must satisfy 1 <= min <= max <= 64", ErrInvalid, c.LookupMin, c.LookupMax)
	}
	return nil
}

// proposeLookup appends to dst up to k tokens that followed an earlier occurrence of toks'
// last n tokens, for the largest n in [lo, hi] that occurs earlier, and returns dst. Of
// the occurrences, the latest one followed by k tokens is taken (a repeated token's
// latest occurrence overlaps the suffix and is followed by one token only), else the one
// followed by the most.
func proposeLookup(dst, toks []int32, k, lo, hi int) []int32 {
	if k <= 0 {
		return dst
	}
	for n := min(hi, len(toks)-1); n >= lo; n-- {
		suffix := toks[len(toks)-n:]
		var best []int32
		for i := len(toks) - n - 1; i >= 0 && len(best) < k; i-- {
			if toks[i] != suffix[0] || !equalTokens(toks[i:i+n], suffix) {
				continue
			}
			if next := toks[i+n : min(i+n+k, len(toks))]; len(next) > len(best) {
				best = next
			}
		}
		if len(best) > 0 {
			return append(dst, best...)
		}
	}
	return dst
}

// proposeSlots appends k placeholder tokens to dst (External proposals) and returns dst.
func proposeSlots(dst []int32, k int) []int32 {
	for range max(k, 0) {
		dst = append(dst, 0)
	}
	return dst
}

func equalTokens(a, b []int32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
