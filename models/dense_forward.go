package models

import (
	"fmt"
	"unsafe"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/ort"
)

// Indexes into DenseRunner.kvMem and DenseRunner.kvViews.
const (
	pastKeys = iota
	pastValues
	presentKeys
	presentValues
)

// Forward runs one forward pass over the whole batch in a single ONNX Runtime call.
//
// Rows may mix prefill and decode: input_ids are right-padded to the longest row, the
// past is dense over maxPast = max PastLen, and attention_mask is 1 on [0, PastLen_b)
// and [maxPast, maxPast+n_b). Before the run the runner gathers every row's past from
// its blocks in b.Cache into the past tensors (Storage.Gather); after it, it stores the
// new keys and values from the present tensors (column maxPast on) in the rows' blocks
// (Storage.Scatter). With a nil Cache nothing is gathered or stored.
//
// Rows of very different shapes (a prompt chunk next to decoding sequences) would be
// mostly padding in one pass, and one pass must never span more key positions than the
// context window: planPasses may therefore run the rows as a few passes over groups of
// alike rows, each a batch of its own over the same cache (see dense_passes.go).
//
// Bad input is an error wrapping ErrBatch; a failed run, gather or scatter wraps
// ErrRun. The returned logits are valid until the next Forward.
func (r *DenseRunner) Forward(b *Batch) (*Output, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.session == nil {
		return nil, fmt.Errorf("%w: runner is closed", ErrRun)
	}
	maxPast, maxNew, err := checkBatch(b, r.spec)
	if err != nil {
		return nil, err
	}
	if r.io.logitsLastOnly {
		for i, s := range b.Seqs {
			if len(s.Tokens) != maxNew || (s.AllLogits && maxNew > 1) {
				return nil, fmt.Errorf("%w: row %d: this model returns only the last position's logits, so rows "+
					"must have equal token counts and cannot ask for all logits", ErrBatch, i)
			}
		}
	}
	if groups := planPasses(b, r.cost, r.spec.MaxPositions); groups != nil {
		return r.forwardGroups(b, groups)
	}
	return r.forward(b, maxPast, maxNew)
}

// forward runs one checked batch in one ONNX Runtime call.
func (r *DenseRunner) forward(b *Batch, maxPast, maxNew int) (*Output, error) {
	rows := len(b.Seqs)
	total := maxPast + maxNew
	r.fillTokenInputs(b, maxPast, maxNew)
	r.layoutKV(rows, maxPast, total)
	if b.Cache != nil {
		r.fillRowLists(b)
		if maxPast > 0 {
			err := b.Cache.GatherGroups(r.tables, r.pastLens, maxPast, r.kvViews[pastKeys], r.kvViews[pastValues])
			if err != nil {
				return nil, fmt.Errorf("%w: gather past: %w", ErrRun, err)
			}
		}
	}

	defer r.releaseTensors()
	if err := r.makeTensors(rows, maxPast, maxNew); err != nil {
		return nil, err
	}
	if err := r.session.Run(r.io.inNames, r.inputs, r.io.outNames, r.outputs); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrRun, oneLine(err.Error()))
	}
	if b.Cache != nil {
		err := b.Cache.ScatterGroups(r.tables, r.pastLens, r.counts, total, maxPast, r.kvViews[presentKeys], r.kvViews[presentValues])
		if err != nil {
			return nil, fmt.Errorf("%w: scatter new: %w", ErrRun, err)
		}
	}
	return r.collectLogits(b, maxNew)
}

// fillRowLists collects the rows' block tables (per layer group), past lengths and
// new-token counts in the form Storage.GatherGroups and ScatterGroups take them.
func (r *DenseRunner) fillRowLists(b *Batch) {
	groups := b.Cache.NumGroups()
	for len(r.tables) < groups {
		r.tables = append(r.tables, nil)
	}
	r.tables = r.tables[:groups]
	for g := range r.tables {
		r.tables[g] = r.tables[g][:0]
	}
	r.pastLens, r.counts = r.pastLens[:0], r.counts[:0]
	for i := range b.Seqs {
		s := &b.Seqs[i]
		for g := range r.tables {
			r.tables[g] = append(r.tables[g], s.table(g))
		}
		r.pastLens = append(r.pastLens, s.PastLen)
		r.counts = append(r.counts, len(s.Tokens))
	}
}

// fillTokenInputs writes input_ids (right-padded with 0), position_ids (0 on padding)
// and attention_mask.
func (r *DenseRunner) fillTokenInputs(b *Batch, maxPast, maxNew int) {
	rows, total := len(b.Seqs), maxPast+maxNew
	r.ids = grow(r.ids, rows*maxNew)
	r.pos = grow(r.pos, rows*maxNew)
	r.mask = grow(r.mask, rows*total)
	clear(r.ids)
	clear(r.pos)
	clear(r.mask)
	for i, s := range b.Seqs {
		ids, pos := r.ids[i*maxNew:(i+1)*maxNew], r.pos[i*maxNew:(i+1)*maxNew]
		for j, t := range s.Tokens {
			ids[j] = int64(t)
			pos[j] = int64(s.PastLen + j)
		}
		mask := r.mask[i*total : (i+1)*total]
		for j := 0; j < s.PastLen; j++ {
			mask[j] = 1
		}
		for j := range s.Tokens {
			mask[maxPast+j] = 1
		}
	}
}

// layoutKV sizes the key/value memory for this pass and points the per-layer views at
// it: [rows, kvHeads, maxPast, headDim] for the past, [rows, kvHeads, total, headDim]
// for the present.
func (r *DenseRunner) layoutKV(rows, maxPast, total int) {
	sp := r.spec
	for kind := range r.kvMem {
		layerBytes := rows * sp.NumKVHeads * kvTokens(kind, maxPast, total) * sp.HeadDim * sp.KVDType.Size()
		r.kvMem[kind] = growBytes(r.kvMem[kind], sp.NumLayers*layerBytes)
		for l := range r.kvViews[kind] {
			r.kvViews[kind][l] = r.kvMem[kind][l*layerBytes : (l+1)*layerBytes : (l+1)*layerBytes]
		}
	}
}

// kvTokens returns the token length of a key/value tensor of the given kind.
func kvTokens(kind, maxPast, total int) int {
	if kind >= presentKeys {
		return total
	}
	return maxPast
}

// makeTensors wraps the Go buffers in ONNX Runtime tensors (no copies).
func (r *DenseRunner) makeTensors(rows, maxPast, maxNew int) error {
	fail := func(what string, err error) error {
		return fmt.Errorf("%w: create %s tensor: %s", ErrRun, what, oneLine(err.Error()))
	}
	var err error
	b, s, t := int64(rows), int64(maxNew), int64(maxPast+maxNew)
	if r.inputs[r.io.ids], err = hostTensor(ort.Int64, []int64{b, s}, r.ids); err != nil {
		return fail("input_ids", err)
	}
	if r.io.pos >= 0 {
		if r.inputs[r.io.pos], err = hostTensor(ort.Int64, []int64{b, s}, r.pos); err != nil {
			return fail("position_ids", err)
		}
	}
	if r.io.mask >= 0 {
		if r.inputs[r.io.mask], err = hostTensor(ort.Int64, []int64{b, t}, r.mask); err != nil {
			return fail("attention_mask", err)
		}
	}
	if r.io.useCache >= 0 {
		r.useCache[0] = maxPast > 0
		if r.inputs[r.io.useCache], err = hostTensor(ort.Bool, []int64{1}, r.useCache); err != nil {
			return fail("use_cache_branch", err)
		}
	}
	kvType := ort.Float32
	if r.spec.KVDType == Float16 {
		kvType = ort.Float16
	}
	for kind, idx := range [4][]int{r.io.pastK, r.io.pastV, r.io.presK, r.io.presV} {
		dst := r.inputs
		if kind >= presentKeys {
			dst = r.outputs
		}
		shape := []int64{b, int64(r.spec.NumKVHeads), int64(kvTokens(kind, maxPast, maxPast+maxNew)), int64(r.spec.HeadDim)}
		for l, data := range r.kvViews[kind] {
			if dst[idx[l]], err = hostTensor(kvType, shape, data); err != nil {
				return fail(fmt.Sprintf("layer %d key/value", l), err)
			}
		}
	}
	// Logits are [B, maxNew, V], or [B, 1, V] for graphs that return only the last
	// position; either way ONNX Runtime writes them straight into Go memory.
	if r.io.logitsLastOnly {
		s = 1
	}
	shape := []int64{b, s, int64(r.spec.VocabSize)}
	n := rows * int(s) * r.spec.VocabSize
	if r.io.logitsF16 {
		r.logits16 = growBytes(r.logits16, 2*n)
		r.outputs[r.io.logits], err = hostTensor(ort.Float16, shape, r.logits16)
	} else {
		r.logits = grow(r.logits, n)
		r.outputs[r.io.logits], err = hostTensor(ort.Float32, shape, r.logits)
	}
	if err != nil {
		return fail("logits", err)
	}
	return nil
}

// releaseTensors releases the per-call ONNX Runtime tensors (the Go memory stays).
func (r *DenseRunner) releaseTensors() {
	for _, vals := range [][]*ort.Value{r.inputs, r.outputs} {
		for i, v := range vals {
			if v != nil {
				v.Release()
				vals[i] = nil
			}
		}
	}
}

// collectLogits slices each row's logits out of the pass's output.
func (r *DenseRunner) collectLogits(b *Batch, maxNew int) (*Output, error) {
	vocab := r.spec.VocabSize
	r.rows = grow(r.rows, len(b.Seqs))
	seqOut := maxNew // positions per row in the logits output
	if r.io.logitsLastOnly {
		seqOut = 1
	}
	if r.io.logitsF16 {
		// Convert only the positions that are returned.
		need := 0
		for _, s := range b.Seqs {
			need += logitPositions(s) * vocab
		}
		r.logitsOut = grow(r.logitsOut, need)
		half := unsafe.Slice((*uint16)(unsafe.Pointer(&r.logits16[0])), len(r.logits16)/2)
		off := 0
		for i, s := range b.Seqs {
			lo, hi := logitRange(s, i, seqOut, vocab)
			dst := r.logitsOut[off : off+hi-lo : off+hi-lo]
			for j, h := range half[lo:hi] {
				dst[j] = kvcache.Float16ToFloat32(h)
			}
			r.rows[i] = dst
			off += hi - lo
		}
		return &Output{Logits: r.rows}, nil
	}
	for i, s := range b.Seqs {
		lo, hi := logitRange(s, i, seqOut, vocab)
		r.rows[i] = r.logits[lo:hi:hi]
	}
	return &Output{Logits: r.rows}, nil
}

// logitRange returns where row i's returned logits sit in a [rows, seqOut, vocab]
// output: the last real position, or all of them when AllLogits.
func logitRange(s SeqInput, i, seqOut, vocab int) (lo, hi int) {
	n := logitPositions(s)
	first := len(s.Tokens) - n
	if seqOut == 1 {
		first = 0
	}
	return (i*seqOut + first) * vocab, (i*seqOut + first + n) * vocab
}

// logitPositions returns how many positions' logits row s gets back.
func logitPositions(s SeqInput) int {
	if s.AllLogits {
		return len(s.Tokens)
	}
	return 1
}
