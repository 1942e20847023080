package scheduler

import (
	"errors"
	"slices"
	"testing"
)

// TestProposeLookup: prompt lookup proposes what followed the latest earlier occurrence
// (with k tokens after it, if any has) of the longest suffix of LookupMin to LookupMax
// tokens that occurred before, at most k tokens, and nothing when no suffix occurred.
func TestProposeLookup(t *testing.T) {
	for _, tc := range []struct {
		toks      []int32
		k, lo, hi int
		want      []int32
	}{
		{[]int32{1, 2, 3, 4, 1, 2}, 3, 1, 3, []int32{3, 4, 1}},
		{[]int32{1, 2, 3, 4, 1, 2}, 1, 1, 3, []int32{3}},
		{[]int32{5, 2, 9, 7, 2, 8, 1, 2}, 2, 1, 3, []int32{8, 1}}, // the latest occurrence of [2]
		{[]int32{1, 2, 9, 5, 2, 8, 1, 2}, 2, 1, 3, []int32{9, 5}}, // the longest suffix [1 2] wins
		{[]int32{1, 2, 3, 4}, 3, 1, 3, nil},                       // nothing occurred before
		{[]int32{7, 7}, 3, 1, 3, []int32{7}},                      // up to the end of the sequence
		{[]int32{1, 2, 3, 1, 2, 3}, 2, 2, 2, []int32{1, 2}},       // only 2-grams
		{[]int32{4, 1, 9, 1}, 2, 2, 3, nil},                       // [1] occurs, but 2-grams only
		{[]int32{1, 2, 1, 2}, 0, 1, 3, nil},                       // k 0
	} {
		if got := proposeLookup(nil, tc.toks, tc.k, tc.lo, tc.hi); !slices.Equal(got, tc.want) {
			t.Errorf("proposeLookup(%v, k %d, %d..%d) = %v, want %v", tc.toks, tc.k, tc.lo, tc.hi, got, tc.want)
		}
	}
}

// TestSpeculationConfig: the configuration's bounds.
func TestSpeculationConfig(t *testing.T) {
	for _, c := range []Speculation{{NumTokens: -1}, {NumTokens: 65, LookupMin: 1, LookupMax: 2},
		{NumTokens: 4}, {NumTokens: 4, LookupMin: 3, LookupMax: 2}, {NumTokens: 4, LookupMin: 1, LookupMax: 2, MaxBatch: -1}} {
		cfg := DefaultConfig()
		cfg.Speculation = c
		if err := cfg.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", c, err)
		}
	}
	cfg := DefaultConfig()
	cfg.Speculation = Speculation{NumTokens: 4, LookupMin: 1, LookupMax: 4, MaxBatch: 8}
	if err := cfg.Validate(); err != nil {
		t.Error(err)
	}
}
