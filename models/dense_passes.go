package models

import (
	"cmp"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// A Forward's rows are padded to the batch's longest past (maxPast) and longest new-token
// count (maxNew), so one ONNX Runtime pass over rows of very different shapes computes
// mostly padding: a step that prefills a 384-token prompt chunk next to 60 decoding
// sequences would run 61 x 384 positions through every layer instead of 384 + 60. The
// runner therefore plans each Forward as one pass or a few passes over groups of rows
// whose shapes are alike, choosing the grouping that minimises an estimate of the work
// (passCost), and never lets a pass span more key positions than the context window.
// Rows do not depend on the other rows of their pass, so the results are those of a
// single pass. Decode-only steps of similar lengths stay one pass; the per-pass
// overhead in the estimate keeps them from being split for small savings.

// costModel estimates a pass's work in floating-point-operation equivalents.
type costModel struct {
	perToken float64 // per computed position: about 2 x the parameter count
	perAttn  float64 // per (query position, key position) pair
	perKey   float64 // per (row, key position): copying the dense past in and present out
	perPass  float64 // per ONNX Runtime call: reading the weights, launching the kernels
}

// newCostModel derives the estimate from the model's size on disk (its weights dominate
// it) and its key/value shape. The coefficients were fitted to decode and prefill steps
// of the default model on a 2-core AVX2 machine; only their ratios matter.
func newCostModel(sp Spec, weightBytes int64) costModel {
	params := float64(max(weightBytes, 1<<20)) / 4 // float32 weights
	kvBytes := float64(sp.KVBytesPerToken())
	return costModel{
		perToken: 2 * params,
		perAttn:  float64(4 * sp.NumLayers * sp.NumKVHeads * sp.HeadDim),
		perKey:   3 * kvBytes,
		perPass:  6*params + 1e7,
	}
}

// passCost estimates one pass over rows rows padded to past + news positions.
func (c costModel) passCost(rows, past, news int) float64 {
	keys := float64(past + news)
	perRow := float64(news)*(c.perToken+c.perAttn*keys) + c.perKey*keys
	return c.perPass + float64(rows)*perRow
}

// modelWeightBytes returns the size of dir's model.onnx plus its external data files.
func modelWeightBytes(dir string) int64 {
	var n int64
	matches, _ := filepath.Glob(filepath.Join(dir, "model.onnx*"))
	for _, m := range matches {
		if st, err := os.Stat(m); err == nil && !st.IsDir() {
			n += st.Size()
		}
	}
	return n
}

// maxCandidates bounds the cut points planPasses considers (see there).
const maxCandidates = 32

// planPasses groups b's rows into the passes a Forward runs. Rows are ordered by new-token
// count, then past length, and cut into contiguous groups by dynamic programming: the
// grouping with the least estimated cost in which every group's padded length
// (longest past + longest new-token count) is at most maxPositions. Every row fits on
// its own (checkBatch), so a grouping always exists. The result is nil when the whole
// batch is best run as one pass.
func planPasses(b *Batch, cost costModel, maxPositions int) [][]int {
	n := len(b.Seqs)
	if n == 1 {
		return nil
	}
	// Any grouping into two or more passes costs at least every row's unpadded work plus
	// two passes' overhead; when one pass costs no more than that, it is the best plan and
	// the search below (quadratic in the rows) is skipped. Alike rows, as in most decode
	// steps, end here.
	maxPast, maxNew, unpadded := 0, 0, 0.0
	for _, s := range b.Seqs {
		maxPast, maxNew = max(maxPast, s.PastLen), max(maxNew, len(s.Tokens))
		unpadded += cost.passCost(1, s.PastLen, len(s.Tokens)) - cost.perPass
	}
	if maxPast+maxNew <= maxPositions && cost.passCost(n, maxPast, maxNew) <= unpadded+2*cost.perPass {
		return nil
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int {
		sx, sy := b.Seqs[x], b.Seqs[y]
		return cmp.Or(cmp.Compare(len(sx.Tokens), len(sy.Tokens)), cmp.Compare(sx.PastLen, sy.PastLen))
	})
	// Groups start and end only at candidate cuts: where the new-token count changes and
	// every step rows in between, which keeps the search at O(candidates x rows) for big
	// batches. Rows between two adjacent candidates share a new-token count and are sorted
	// by past length, so each such run fits the context on its own (its last row does).
	step := max(1, (n+maxCandidates-1)/maxCandidates)
	cands := []int{0}
	for p := 1; p < n; p++ {
		if p%step == 0 || len(b.Seqs[order[p-1]].Tokens) != len(b.Seqs[order[p]].Tokens) {
			cands = append(cands, p)
		}
	}
	cands = append(cands, n)
	// best[k] is the least cost of running order[:cands[k]]; cut[k] the candidate where
	// its last group starts.
	best := make([]float64, len(cands))
	cut := make([]int, len(cands))
	for k := 1; k < len(cands); k++ {
		best[k] = math.Inf(1)
		past, news := 0, 0
		for m := k - 1; m >= 0; m-- {
			for _, row := range order[cands[m]:cands[m+1]] {
				s := b.Seqs[row]
				past, news = max(past, s.PastLen), max(news, len(s.Tokens))
			}
			if past+news > maxPositions {
				break // a longer group only grows
			}
			if c := best[m] + cost.passCost(cands[k]-cands[m], past, news); c < best[k] {
				best[k], cut[k] = c, m
			}
		}
	}
	last := len(cands) - 1
	if cut[last] == 0 {
		return nil
	}
	var groups [][]int
	for k := last; k > 0; k = cut[k] {
		g := slices.Clone(order[cands[cut[k]]:cands[k]])
		slices.Sort(g)
		groups = append(groups, g)
	}
	slices.Reverse(groups)
	return groups
}

// forwardGroups runs a batch as several passes, one per group of rows: each pass is a
// batch of its own over the same cache, holding the group's rows, so it gathers and
// scatters only their blocks. A row reads only its own past and writes only its own new
// positions, and no row reads or writes the blocks another row's new tokens go to, so the
// passes give what one pass would.
func (r *DenseRunner) forwardGroups(b *Batch, groups [][]int) (*Output, error) {
	need := 0
	for _, s := range b.Seqs {
		need += logitPositions(s) * r.spec.VocabSize
	}
	r.groupLogits = grow(r.groupLogits, need)
	r.groupRows = grow(r.groupRows, len(b.Seqs)) // forward reuses r.rows for each group
	logits := r.groupRows
	seqs := r.groupSeqs
	off := 0
	for _, g := range groups {
		seqs = seqs[:0]
		subPast, subNew := 0, 0
		for _, row := range g {
			seqs = append(seqs, b.Seqs[row])
			subPast = max(subPast, b.Seqs[row].PastLen)
			subNew = max(subNew, len(b.Seqs[row].Tokens))
		}
		r.groupSeqs = seqs
		out, err := r.forward(&Batch{Seqs: seqs, Cache: b.Cache}, subPast, subNew)
		if err != nil {
			return nil, err
		}
		for i, row := range g {
			n := len(out.Logits[i])
			logits[row] = r.groupLogits[off : off+n : off+n]
			copy(logits[row], out.Logits[i])
			off += n
		}
	}
	return &Output{Logits: logits}, nil
}
