package models

import "fmt"

// forwardSplit runs a batch whose padded key length (maxPast + maxNew) exceeds the
// context window as several passes over groups of rows whose own padded length fits.
// Every row fits on its own (checkBatch), so the split always succeeds. Graphs
// exported from Hugging Face models may size their causal mask by the context window
// (GPT-2 slices a [n_positions, n_positions] buffer), so one pass longer than that
// fails in ONNX Runtime even though each row is valid. Rows do not depend on the other
// rows of their pass, so the results are those of a single pass.
//
// The caller's KV sees one GatherPast of the whole batch (Tokens = maxPast) and one
// ScatterNew of the whole batch's new keys and values (Tokens = maxNew, newOffset 0);
// the groups read from and write to those tensors. This path copies the keys and
// values once more and allocates, which is acceptable for a pass that happens only at
// the end of the context window.
func (r *Runner) forwardSplit(b *Batch, kv KV, maxPast, maxNew int) (*Output, error) {
	groups := splitRows(b, r.spec.MaxPositions)
	var split *splitKV
	if kv != nil {
		split = newSplitKV(r.spec, b, maxPast, maxNew)
		if maxPast > 0 {
			if err := kv.GatherPast(split.past[0], split.past[1]); err != nil {
				return nil, fmt.Errorf("%w: gather past: %w", ErrRun, err)
			}
		}
	}
	logits := make([][]float32, len(b.Seqs))
	for _, g := range groups {
		sub := &Batch{Seqs: make([]SeqInput, len(g))}
		subPast, subNew := 0, 0
		for i, row := range g {
			sub.Seqs[i] = b.Seqs[row]
			subPast = max(subPast, b.Seqs[row].PastLen)
			subNew = max(subNew, len(b.Seqs[row].Tokens))
		}
		var subKV KV
		if split != nil {
			split.rows = g
			subKV = split
		}
		out, err := r.forward(sub, subKV, subPast, subNew)
		if err != nil {
			return nil, err
		}
		for i, row := range g {
			logits[row] = append([]float32(nil), out.Logits[i]...)
		}
	}
	if kv != nil {
		if err := kv.ScatterNew(split.new[0], split.new[1], 0); err != nil {
			return nil, fmt.Errorf("%w: scatter new: %w", ErrRun, err)
		}
	}
	return &Output{Logits: logits}, nil
}

// splitRows groups the rows of b (first fit, in order) so that each group's longest
// past plus its longest new-token count is at most maxPositions.
func splitRows(b *Batch, maxPositions int) [][]int {
	var groups [][]int
	var past, news []int
	for i, s := range b.Seqs {
		placed := false
		for g := range groups {
			if max(past[g], s.PastLen)+max(news[g], len(s.Tokens)) <= maxPositions {
				groups[g] = append(groups[g], i)
				past[g] = max(past[g], s.PastLen)
				news[g] = max(news[g], len(s.Tokens))
				placed = true
				break
			}
		}
		if !placed {
			groups = append(groups, []int{i})
			past = append(past, s.PastLen)
			news = append(news, len(s.Tokens))
		}
	}
	return groups
}

// splitKV is the KV of one group's pass inside forwardSplit: it copies the group's
// rows out of the whole batch's gathered past and its new keys and values into the
// whole batch's new tensors.
type splitKV struct {
	past [2][]DenseKV // keys, values: [batch, kvHeads, maxPast, headDim] per layer
	new  [2][]DenseKV // keys, values: [batch, kvHeads, maxNew, headDim] per layer
	b    *Batch
	rows []int // the current group's rows in b
}

func newSplitKV(sp Spec, b *Batch, maxPast, maxNew int) *splitKV {
	s := &splitKV{b: b}
	for kind := range 2 {
		for _, tokens := range []int{maxPast, maxNew} {
			views := make([]DenseKV, sp.NumLayers)
			for l := range views {
				views[l] = DenseKV{
					Data:    make([]byte, len(b.Seqs)*sp.NumKVHeads*tokens*sp.HeadDim*sp.KVDType.Size()),
					Batch:   len(b.Seqs),
					KVHeads: sp.NumKVHeads,
					Tokens:  tokens,
					HeadDim: sp.HeadDim,
					DType:   sp.KVDType,
				}
			}
			if tokens == maxPast {
				s.past[kind] = views
			} else {
				s.new[kind] = views
			}
		}
	}
	return s
}

// GatherPast copies the group's rows' pasts (already zero beyond each row's PastLen)
// from the whole batch's past tensors.
func (s *splitKV) GatherPast(k, v []DenseKV) error {
	for kind, dst := range [2][]DenseKV{k, v} {
		for l, d := range dst {
			src := s.past[kind][l]
			hb := d.HeadDim * d.DType.Size()
			for i, row := range s.rows {
				for h := 0; h < d.KVHeads; h++ {
					from := (row*src.KVHeads + h) * src.Tokens * hb
					to := (i*d.KVHeads + h) * d.Tokens * hb
					copy(d.Data[to:to+d.Tokens*hb], src.Data[from:from+d.Tokens*hb])
				}
			}
		}
	}
	return nil
}

// ScatterNew copies the group's rows' new keys and values into the whole batch's new
// tensors, at columns [0, len(Tokens)).
func (s *splitKV) ScatterNew(k, v []DenseKV, newOffset int) error {
	for kind, src := range [2][]DenseKV{k, v} {
		for l, sv := range src {
			dst := s.new[kind][l]
			hb := sv.HeadDim * sv.DType.Size()
			for i, row := range s.rows {
				n := len(s.b.Seqs[row].Tokens) * hb
				for h := 0; h < sv.KVHeads; h++ {
					from := ((i*sv.KVHeads+h)*sv.Tokens + newOffset) * hb
					to := (row*dst.KVHeads + h) * dst.Tokens * hb
					copy(dst.Data[to:to+n], sv.Data[from:from+n])
				}
			}
		}
	}
	return nil
}
