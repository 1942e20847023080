package engine

import (
	"math"
	"slices"

	"github.com/conveyor-llm/conveyor/models/kernels"
)

// argmax returns the index of the largest value; ties go to the lowest index. NaN
// values are never chosen unless everything is NaN or -Inf.
func argmax(x []float32) int32 {
	if m := kernels.RowMax(x); !math.IsNaN(float64(m)) && !math.IsInf(float64(m), -1) {
		if i := kernels.RowFind(x, m); i >= 0 {
			return int32(i)
		}
	}
	return argmaxSlow(x)
}

// argmaxSlow is argmax without the vectorised passes, for rows holding NaN or only -Inf.
func argmaxSlow(x []float32) int32 {
	// Four independent lanes (each keeps its first maximum) break the compare chain;
	// the lanes are then merged by value, then by lowest index.
	negInf := float32(math.Inf(-1))
	b0, b1, b2, b3 := -1, -1, -1, -1
	v0, v1, v2, v3 := negInf, negInf, negInf, negInf
	n := len(x) &^ 3
	for i := 0; i < n; i += 4 {
		y := x[i : i+4 : i+4]
		if y[0] > v0 {
			b0, v0 = i, y[0]
		}
		if y[1] > v1 {
			b1, v1 = i+1, y[1]
		}
		if y[2] > v2 {
			b2, v2 = i+2, y[2]
		}
		if y[3] > v3 {
			b3, v3 = i+3, y[3]
		}
	}
	best, bv := b0, v0
	for _, c := range [3]struct {
		i int
		v float32
	}{{b1, v1}, {b2, v2}, {b3, v3}} {
		if c.i >= 0 && (best < 0 || c.v > bv || (c.v == bv && c.i < best)) {
			best, bv = c.i, c.v
		}
	}
	for i := n; i < len(x); i++ {
		if x[i] > bv {
			best, bv = i, x[i]
		}
	}
	if best >= 0 {
		return int32(best)
	}
	// Everything is -Inf or NaN: the first -Inf, else the last NaN.
	for i, v := range x {
		if v == negInf {
			return int32(i)
		}
	}
	return int32(max(len(x)-1, 0))
}

// logSumExp returns log(sum(exp(x))), the exponentials vectorised and summed in
// float64 (NaN if any value is NaN).
func logSumExp(x []float32) float64 {
	m := kernels.RowMax(x)
	if math.IsInf(float64(m), 0) || math.IsNaN(float64(m)) {
		return float64(m)
	}
	return float64(m) + math.Log(kernels.RowExp(x, nil, m, 1))
}

// better reports whether token a ranks before token b: higher logit first, then lower id.
func better(x []float32, a, b int32) bool {
	if x[a] != x[b] {
		return x[a] > x[b]
	}
	return a < b
}

// sortBest sorts ids by better: higher logit first, then lower id.
func sortBest(x []float32, ids []int32) {
	slices.SortFunc(ids, func(a, b int32) int {
		if better(x, a, b) {
			return -1
		}
		if better(x, b, a) {
			return 1
		}
		return 0
	})
}

// topK returns the k highest-logit token ids in descending order (ties: lower id
// first). It partially selects with quickselect, then sorts only the k winners, so the
// cost is O(V + k log k) rather than O(V log V). The result aliases sc.idx.
func topK(x []float32, k int, sc *sampleScratch) []int32 {
	v := len(x)
	if k > v {
		k = v
	}
	if k <= 0 {
		return nil
	}
	if k <= 64 && k*16 <= v {
		return topFew(x, k, sc)
	}
	idx := sc.idx[:0]
	for i := range v {
		idx = append(idx, int32(i))
	}
	sc.idx = idx
	if k < v {
		quickselect(x, idx, k)
	}
	top := idx[:k]
	sortBest(x, top)
	return top
}

// topFew is topK for small k: one pass that keeps the k best seen so far in order,
// comparing each value with the worst of them (most values are rejected by that one
// comparison).
func topFew(x []float32, k int, sc *sampleScratch) []int32 {
	top := sc.idx[:0]
	for i := range x {
		if len(top) == k && !(x[i] > x[top[k-1]]) { // a later id loses ties
			continue
		}
		id := int32(i)
		j := len(top)
		if j < k {
			top = append(top, id)
		} else {
			j = k - 1
		}
		for j > 0 && better(x, id, top[j-1]) {
			top[j] = top[j-1]
			j--
		}
		top[j] = id
	}
	sc.idx = top
	return top
}

// quickselect reorders idx so that its first k entries are the k best (by better),
// in no particular order.
func quickselect(x []float32, idx []int32, k int) {
	lo, hi := 0, len(idx)-1
	for lo < hi {
		// Median of three as the pivot.
		mid := lo + (hi-lo)/2
		if better(x, idx[mid], idx[lo]) {
			idx[mid], idx[lo] = idx[lo], idx[mid]
		}
		if better(x, idx[hi], idx[lo]) {
			idx[hi], idx[lo] = idx[lo], idx[hi]
		}
		if better(x, idx[hi], idx[mid]) {
			idx[hi], idx[mid] = idx[mid], idx[hi]
		}
		pivot := idx[mid]
		i, j := lo, hi
		for i <= j {
			for better(x, idx[i], pivot) {
				i++
			}
			for better(x, pivot, idx[j]) {
				j--
			}
			if i <= j {
				idx[i], idx[j] = idx[j], idx[i]
				i++
				j--
			}
		}
		// Now idx[lo..j] rank at or before pivot and idx[i..hi] at or after it.
		switch {
		case k-1 <= j:
			hi = j
		case k-1 >= i:
			lo = i
		default:
			return
		}
	}
}
