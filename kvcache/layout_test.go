package kvcache

import (
	"slices"
	"testing"
)

func TestPlanLayout(t *testing.T) {
	gemma3 := make([]int, 26) // every 6th layer full, the rest a 512-token window
	for l := range gemma3 {
		if (l+1)%6 != 0 {
			gemma3[l] = 512
		}
	}
	lay := PlanLayout(gemma3, 26, 32768)
	if lay.PerBlock != 2 || len(lay.Windows) != 13 || len(lay.LayerGroups) != 26 {
		t.Fatalf("gemma3: %+v, want 13 groups of 2 layers", lay)
	}
	full := 0
	for _, w := range lay.Windows {
		if w == 0 {
			full++
		} else if w != 512 {
			t.Fatalf("gemma3 group window %d", w)
		}
	}
	if full != 2 {
		t.Fatalf("gemma3: %d full groups, want 2 (4 full layers)", full)
	}
	count := make([]int, len(lay.Windows))
	for l, g := range lay.LayerGroups {
		count[g]++
		if (lay.Windows[g] == 0) != (gemma3[l] == 0) {
			t.Fatalf("layer %d (window %d) in group %d of window %d", l, gemma3[l], g, lay.Windows[g])
		}
	}
	for g, n := range count {
		if n != 2 {
			t.Fatalf("group %d has %d layers", g, n)
		}
	}
	// A 32,768-token conversation decoding: the 2 full groups hold 2,048 blocks each, the 11
	// window groups 33 (511 positions behind the query and its own, in 16-token blocks):
	// 4,459 blocks of 2 layers, against 26 layers x 2,048 blocks kept whole (17%).
	pool, err := NewPool(lay.Pool(PoolConfig{NumBlocks: 1 << 20, BlockSizeTokens: 16}))
	if err != nil {
		t.Fatal(err)
	}
	if got := pool.SeqBlocks(32768, 1); got != 2*2048+11*33 {
		t.Fatalf("a 32k-token sequence holds %d blocks, want %d", got, 2*2048+11*33)
	}
	if _, err := NewStorage(lay.Storage(StorageConfig{NumBlocks: 4, BlockSizeTokens: 16, Layers: 26, KVHeads: 1, HeadDim: 8, DType: Float16})); err != nil {
		t.Fatalf("gemma3's layout does not make a storage: %v", err)
	}

	for _, tc := range []struct {
		name    string
		windows []int
		maxLen  int
		groups  []int // windows per group; nil: one full group, no layer groups
	}{
		{"all full", []int{0, 0, 0}, 100, nil},
		{"no windows known", nil, 100, nil},
		{"windows at least the context", []int{100, 0, 200}, 100, nil},
		{"alternating", []int{4, 0, 4, 0}, 100, []int{4, 0}},
		{"all one window", []int{8, 8, 8}, 100, []int{8}},
		{"two windows and full", []int{4, 8, 0, 4, 8, 0}, 100, []int{4, 8, 0}},
	} {
		layers := len(tc.windows)
		if tc.windows == nil {
			layers = 3
		}
		lay := PlanLayout(tc.windows, layers, tc.maxLen)
		if tc.groups == nil {
			if lay.LayerGroups != nil || !slices.Equal(lay.Windows, []int{0}) {
				t.Errorf("%s: %+v, want one full group", tc.name, lay)
			}
			continue
		}
		if !slices.Equal(lay.Windows, tc.groups) {
			t.Errorf("%s: group windows %v, want %v", tc.name, lay.Windows, tc.groups)
		}
	}
}
