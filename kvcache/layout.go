package kvcache

// Layout is how a model's layers share the KV cache: in groups of equal size, each
// group of one attention kind (full, or one sliding window), every group with its own
// block table per sequence and all of them drawing blocks from one pool, so that memory
// goes wherever it is needed. A block holds one group's layers for BlockSizeTokens
// positions; a sliding group gives its blocks back once its window has passed them, so
// a long sequence holds its whole past only in the full layers. (vLLM's hybrid KV cache
// manager does the same with equal-size groups.)
type Layout struct {
	LayerGroups []int // per layer; nil: one group of every layer
	Windows     []int // per group: the sliding window in tokens, 0 for full attention
	PerBlock    int   // layers one block holds
}

// PlanLayout groups layers by their sliding windows (0: full attention). A window of at
// least maxLen never passes anything and counts as full. The group size is the greatest
// common divisor of the kinds' layer counts, so no group is padded.
func PlanLayout(windows []int, numLayers, maxLen int) Layout {
	one := Layout{PerBlock: numLayers, Windows: []int{0}}
	if len(windows) != numLayers {
		return one
	}
	var kinds []int        // distinct windows, in order of first appearance
	count := map[int]int{} // layers per window
	for _, w := range windows {
		if w <= 0 || w >= maxLen {
			w = 0
		}
		if count[w] == 0 {
			kinds = append(kinds, w)
		}
		count[w]++
	}
	if len(kinds) == 1 && kinds[0] == 0 {
		return one
	}
	size := 0
	for _, k := range kinds {
		size = gcd(size, count[k])
	}
	lay := Layout{PerBlock: size, LayerGroups: make([]int, numLayers)}
	first := map[int]int{} // a kind's first group
	for _, k := range kinds {
		first[k] = len(lay.Windows)
		for range count[k] / size {
			lay.Windows = append(lay.Windows, k)
		}
	}
	seen := map[int]int{}
	for l, w := range windows {
		if w <= 0 || w >= maxLen {
			w = 0
		}
		lay.LayerGroups[l] = first[w] + seen[w]/size
		seen[w]++
	}
	return lay
}

// LayoutOf returns the layout of the given layer groups (one per layer, groups 0..G-1
// of as many layers each), each group's window that of its layers (windows per layer;
// nil: all full).
func LayoutOf(layerGroups, windows []int) Layout {
	n := 0
	for _, g := range layerGroups {
		n = max(n, g+1)
	}
	lay := Layout{LayerGroups: layerGroups, Windows: make([]int, n), PerBlock: len(layerGroups) / max(n, 1)}
	for l, g := range layerGroups {
		if windows != nil && windows[l] > 0 {
			lay.Windows[g] = windows[l]
		}
	}
	return lay
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Pool and Storage complete a pool's and a storage's configurations with the layout.
func (k Layout) Pool(c PoolConfig) PoolConfig {
	if k.LayerGroups != nil {
		c.Windows = k.Windows
	}
	return c
}

func (k Layout) Storage(c StorageConfig) StorageConfig {
	c.LayerGroups = k.LayerGroups
	return c
}
