package scheduler

import (
	"errors"
	"slices"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
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
	for _, c := range []Speculation{{NumTokens: 4, LookupMin: 1, LookupMax: 4, MaxBatch: 8}, {NumTokens: 4, External: true}} {
		cfg.Speculation = c
		if err := cfg.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// TestExternalProposals: with External speculation a decoding row's Draft holds
// NumTokens placeholders whose slots are reserved; the engine may overwrite them or
// shorten Draft, and Update gives back every reserved slot that was not kept, whether
// the row then verified some proposals or none.
func TestExternalProposals(t *testing.T) {
	pool, err := kvcache.NewPool(kvcache.PoolConfig{NumBlocks: 16, BlockSizeTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.MaxModelLen = 64
	cfg.Speculation = Speculation{NumTokens: 3, External: true}
	s, err := New(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	q := &Sequence{ID: 1, Tokens: []int32{5, 6, 7}, Speculate: true}
	if err := s.Add(q); err != nil {
		t.Fatal(err)
	}
	step := func(edit func(it *Item) Result) *Item {
		t.Helper()
		plan := s.Schedule()
		if len(plan.Items) != 1 {
			t.Fatalf("%d items", len(plan.Items))
		}
		it := &plan.Items[0]
		r := edit(it)
		if _, err := s.Update(plan, []Result{r}); err != nil {
			t.Fatal(err)
		}
		if err := pool.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		if got := pool.NumTokens(q.ID); got != q.NumComputed() {
			t.Fatalf("the pool holds %d slots, %d tokens computed", got, q.NumComputed())
		}
		return it
	}
	step(func(it *Item) Result { // the prompt: no proposals
		if len(it.Draft) != 0 {
			t.Fatalf("a prompt row with draft %v", it.Draft)
		}
		return Result{Token: 8}
	})
	step(func(it *Item) Result { // proposals dropped by the engine
		if !slices.Equal(it.Draft, []int32{0, 0, 0}) || pool.NumTokens(q.ID) != it.StartPos+4 {
			t.Fatalf("draft %v with %d slots at %d; want 3 placeholders and their slots", it.Draft, pool.NumTokens(q.ID), it.StartPos)
		}
		it.Draft = it.Draft[:0]
		return Result{Token: 9}
	})
	step(func(it *Item) Result { // two proposals, the first accepted
		it.Draft = append(it.Draft[:0], 10, 11)
		return Result{Tokens: []int32{10, 12}}
	})
	if want := []int32{5, 6, 7, 8, 9, 10, 12}; !slices.Equal(q.Tokens, want) || q.NumComputed() != 6 {
		t.Fatalf("tokens %v with %d computed, want %v with 6", q.Tokens, q.NumComputed(), want)
	}
	if st := s.Stats(); st.DraftTokens != 2 || st.AcceptedTokens != 1 {
		t.Fatalf("%d proposed, %d accepted; want 2 and 1", st.DraftTokens, st.AcceptedTokens)
	}
}
