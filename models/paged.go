package models

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"unsafe"

	"github.com/conveyor-llm/conveyor/models/attention"
	"github.com/conveyor-llm/conveyor/models/modeldir"
	"github.com/conveyor-llm/conveyor/models/ort"
)

// PagedRunner runs a model through its paged layout (modeldir.PagedManifest): one ONNX
// Runtime segment per layer with the native attention kernel between segments. The
// step's tokens are packed row after row (no padding), so a prompt chunk next to
// decoding sequences costs only its own tokens, and no step copies the past.
type PagedRunner struct {
	mu       sync.Mutex
	spec     Spec
	manifest *modeldir.PagedManifest
	layers   []pagedLayer
	head     *segment
	embed    []float32 // [vocab][hidden], mapped from the manifest's embedding file
	embedMap []byte    // the mapping behind embed (nil when read into memory)

	// Per-step buffers, reused.
	hidden, hiddenOut []float32 // [T][hidden]
	qkv               []float32 // [T][(heads+2*kvHeads)*headDim]
	att               []float32 // [T][heads*headDim]
	logitRows         []int64   // rows of [T] whose logits are returned
	logits            []float32 // [R][vocab]
	rows              [][]float32
	seqs              [][]attention.Seq // per layer group: every row's table, past and new tokens
	tableIDs          []int32           // every row's block table, packed, as the kernel reads them
}

type pagedLayer struct {
	session *segment
	attn    *attention.Layer
	qkvCols int // (heads+2*kvHeads)*headDim
	attCols int // heads*headDim
}

// OpenPaged loads dir's paged layout. A directory without one is an error wrapping
// ErrModelDir and modeldir.ErrNoPaged.
func OpenPaged(dir string, opts RunnerOptions) (*PagedRunner, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	man, err := modeldir.LoadPaged(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrModelDir, err)
	}
	opts = pagedOpenOptions(man, opts)
	if err := ort.InitWithPool(opts.ORTLib, opts.pool()); err != nil {
		return nil, err
	}
	meta, err := readModelMeta(dir)
	if err != nil {
		return nil, err
	}
	first := man.Layers[0].Attention
	for i, l := range man.Layers {
		if l.Attention.NumKVHeads != first.NumKVHeads || l.Attention.HeadDim != first.HeadDim {
			return nil, fmt.Errorf("%w: paged layer %d has %d KV heads of %d, unlike layer 0 (%d of %d): "+
				"the KV cache needs one shape for every layer", ErrModelDir, i, l.Attention.NumKVHeads,
				l.Attention.HeadDim, first.NumKVHeads, first.HeadDim)
		}
	}
	r := &PagedRunner{
		manifest: man,
		spec: Spec{
			NumLayers:    len(man.Layers),
			NumKVHeads:   first.NumKVHeads,
			HeadDim:      first.HeadDim,
			VocabSize:    man.VocabSize,
			MaxPositions: man.MaxPositions,
			KVDType:      kvDTypeOption(opts.KVCacheDType),
			BOSTokenID:   meta.bos,
			EOSTokenIDs:  meta.eos,
			LayerWindows: man.LayerWindows(),
		},
	}
	ok := false
	defer func() {
		if !ok {
			_ = r.Close()
		}
	}()
	pagedDir := filepath.Join(dir, modeldir.PagedDir)
	open := func(name string, ins, outs []string) (*segment, error) {
		s, err := openSession(filepath.Join(pagedDir, name), opts)
		if err != nil {
			return nil, err
		}
		return &segment{s: s, ins: ins, outs: outs}, nil
	}
	for i, l := range man.Layers {
		ins, outs := []string{modeldir.SegHidden}, []string{modeldir.SegQKV}
		if i > 0 {
			ins = append(ins, modeldir.SegAttention)
			outs = append(outs, modeldir.SegHiddenOut)
		}
		sess, err := open(l.Segment, ins, outs)
		if err != nil {
			return nil, err
		}
		attn, err := attention.NewLayer(l.Attention, man.MaxPositions)
		if err != nil {
			_ = sess.s.Close()
			return nil, fmt.Errorf("%w: paged layer %d: %w", ErrModelDir, i, err)
		}
		p := l.Attention
		r.layers = append(r.layers, pagedLayer{
			session: sess,
			attn:    attn,
			qkvCols: (p.NumHeads + 2*p.NumKVHeads) * p.HeadDim,
			attCols: p.NumHeads * p.HeadDim,
		})
	}
	if r.head, err = open(man.Head, []string{modeldir.SegHidden, modeldir.SegAttention, modeldir.SegLogitRows},
		[]string{modeldir.SegLogits}); err != nil {
		return nil, err
	}
	if err := r.mapEmbedding(filepath.Join(pagedDir, man.Embedding.File)); err != nil {
		return nil, err
	}
	ok = true
	return r, nil
}

// kvDTypeOption is the paged path's KV type for RunnerOptions.KVCacheDType (validated).
func kvDTypeOption(s string) DType {
	if s == Float16.String() || s == KVCacheAuto {
		return Float16
	}
	return Float32
}

// pagedOpenOptions are the options a paged model opens with. Int8Linear brings its own threads
// (as many as opts ask of ONNX Runtime), so in a build whose products are all Int8Linear
// (OwnThreads) ONNX Runtime's pool has only the small operators between them to run, and
// it must not spin: a spinning worker took cores from the kernel's and the attention's
// threads. Measured on the 0.5B int8 model, 2-core EPYC, medians of 3 noisy runs: 16-row
// steps at past 512 75 -> 63 ms, a 512-token prefill 0.82 -> 0.77 s. (Running the
// segments on the calling thread alone, with a one-thread pool per session, was as fast
// but took a served process from 4.2 to 8.3 GB under sixteen 512-token streams.)
func pagedOpenOptions(man *modeldir.PagedManifest, opts RunnerOptions) RunnerOptions {
	if man.OwnThreads {
		opts.NoSpin = true
	}
	return opts
}

// mapEmbedding maps the embedding table read-only: only the rows the model reads are
// ever paged in, and it costs no second copy next to the head's tied weights.
func (r *PagedRunner) mapEmbedding(path string) error {
	e := r.manifest.Embedding
	want := int64(e.Rows) * int64(e.Cols) * 4
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: embedding: %w", ErrModelDir, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%w: embedding: %w", ErrModelDir, err)
	}
	if st.Size() != want {
		return fmt.Errorf("%w: embedding %s has %d bytes, want %d ([%d, %d] float32)", ErrModelDir, path, st.Size(), want, e.Rows, e.Cols)
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, int(want), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("%w: map embedding %s: %w", ErrModelDir, path, err)
	}
	r.embedMap = m
	r.embed = unsafe.Slice((*float32)(unsafe.Pointer(&m[0])), e.Rows*e.Cols)
	return nil
}

// Spec returns what the engine needs to know about the model.
func (r *PagedRunner) Spec() Spec {
	s := r.spec
	s.EOSTokenIDs = append([]int32(nil), s.EOSTokenIDs...)
	return s
}

// Attention returns "paged".
func (r *PagedRunner) Attention() string { return AttentionPaged }

// Close releases the sessions and the embedding mapping. It is idempotent.
func (r *PagedRunner) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, l := range r.layers {
		if err := l.session.s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	r.layers = nil
	if r.head != nil {
		if err := r.head.s.Close(); err != nil {
			errs = append(errs, err)
		}
		r.head = nil
	}
	if r.embedMap != nil {
		if err := syscall.Munmap(r.embedMap); err != nil {
			errs = append(errs, err)
		}
		r.embedMap, r.embed = nil, nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: close: %s", ErrRun, oneLine(err.Error()))
	}
	return nil
}

// Forward runs one step: every row's new tokens packed together through the layer
// segments, attention over the rows' blocks in b.Cache (read and written in place), then
// the head for each row's last position (or all of its positions with AllLogits). With a
// nil Cache (no row has a past) attention runs over scratch blocks that are dropped
// after the pass.
func (r *PagedRunner) Forward(b *Batch) (*Output, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.head == nil {
		return nil, fmt.Errorf("%w: runner is closed", ErrRun)
	}
	if _, _, err := checkBatch(b, r.spec); err != nil {
		return nil, err
	}
	cache := r.attentionCache(b)
	tokens := r.embedTokens(b)
	for l := range r.layers {
		layer := &r.layers[l]
		r.qkv = grow(r.qkv, tokens*layer.qkvCols)
		in := []segmentTensor{{r.hidden, r.manifest.HiddenSize}}
		out := []segmentTensor{{r.qkv, layer.qkvCols}}
		if l > 0 {
			r.hiddenOut = grow(r.hiddenOut, len(r.hidden))
			in = append(in, segmentTensor{r.att, r.layers[l-1].attCols})
			out = append(out, segmentTensor{r.hiddenOut, r.manifest.HiddenSize})
		}
		if err := runSegment(layer.session, tokens, in, out, nil); err != nil {
			return nil, fmt.Errorf("%w: layer %d: %w", ErrRun, l, err)
		}
		if l > 0 {
			r.hidden, r.hiddenOut = r.hiddenOut, r.hidden
		}
		r.att = grow(r.att, tokens*layer.attCols)
		c, seqs := cache(l)
		if err := layer.attn.Run(c, seqs, r.qkv, r.att); err != nil {
			return nil, fmt.Errorf("%w: layer %d attention: %w", ErrRun, l, err)
		}
	}
	return r.runHead(b, tokens)
}

// scratchBlockSize is the block size in tokens of a Forward without a cache.
const scratchBlockSize = 16

// attentionCache fills r.seqs with every row's block tables (one set per layer group),
// past and new-token count, and returns layer l's arenas for the kernel and its group's
// rows: b.Cache's, or, when the batch has no cache, scratch arenas that hold only this
// pass's new keys and values (every layer writes its own before reading them, so the
// layers share one pair).
func (r *PagedRunner) attentionCache(b *Batch) func(l int) (attention.Cache, []attention.Seq) {
	groups := 1
	if b.Cache != nil {
		groups = b.Cache.NumGroups()
	}
	rowBlocks := func(s SeqInput) int {
		if b.Cache != nil {
			return len(s.Blocks)
		}
		return (len(s.Tokens) + scratchBlockSize - 1) / scratchBlockSize
	}
	numBlocks := 0
	for _, s := range b.Seqs {
		numBlocks += rowBlocks(s)
	}
	r.tableIDs = grow(r.tableIDs, groups*numBlocks)
	for len(r.seqs) < groups {
		r.seqs = append(r.seqs, nil)
	}
	off := 0
	for g := range groups {
		r.seqs[g] = r.seqs[g][:0]
		for i := range b.Seqs {
			s := &b.Seqs[i]
			n := rowBlocks(*s)
			table := r.tableIDs[off : off+n : off+n]
			for j := range table {
				if b.Cache != nil {
					table[j] = int32(s.table(g)[j])
				} else {
					table[j] = int32(off + j) // scratch blocks in row order
				}
			}
			off += n
			r.seqs[g] = append(r.seqs[g], attention.Seq{Table: table, PastLen: s.PastLen, NumNew: len(s.Tokens)})
		}
	}
	dtype := r.spec.KVDType
	if b.Cache != nil {
		c := b.Cache.Config()
		return func(l int) (attention.Cache, []attention.Seq) {
			return attention.Cache{K: b.Cache.LayerK(l), V: b.Cache.LayerV(l), NumBlocks: c.NumBlocks,
				BlockSize: c.BlockSizeTokens, DType: dtype}, r.seqs[b.Cache.LayerGroup(l)]
		}
	}
	size := numBlocks * r.spec.NumKVHeads * scratchBlockSize * r.spec.HeadDim * dtype.Size()
	scratch := attention.Cache{K: make([]byte, size), V: make([]byte, size), NumBlocks: numBlocks,
		BlockSize: scratchBlockSize, DType: dtype}
	return func(int) (attention.Cache, []attention.Seq) { return scratch, r.seqs[0] }
}

// embedTokens fills r.hidden with every row's token embeddings, packed, and returns
// the number of tokens.
func (r *PagedRunner) embedTokens(b *Batch) int {
	h := r.manifest.HiddenSize
	tokens := 0
	for _, s := range b.Seqs {
		tokens += len(s.Tokens)
	}
	r.hidden = grow(r.hidden, tokens*h)
	scale := r.manifest.Embedding.Scale
	t := 0
	for _, s := range b.Seqs {
		for _, id := range s.Tokens {
			dst := r.hidden[t*h : (t+1)*h]
			copy(dst, r.embed[int(id)*h:(int(id)+1)*h])
			if scale != 0 && scale != 1 {
				for j := range dst {
					dst[j] *= scale
				}
			}
			t++
		}
	}
	return tokens
}

// runHead computes the logits of each row's returned positions.
func (r *PagedRunner) runHead(b *Batch, tokens int) (*Output, error) {
	r.logitRows = r.logitRows[:0]
	t := 0
	for _, s := range b.Seqs {
		n := logitPositions(s)
		for j := len(s.Tokens) - n; j < len(s.Tokens); j++ {
			r.logitRows = append(r.logitRows, int64(t+j))
		}
		t += len(s.Tokens)
	}
	vocab := r.spec.VocabSize
	r.logits = grow(r.logits, len(r.logitRows)*vocab)
	last := r.layers[len(r.layers)-1]
	in := []segmentTensor{{r.hidden, r.manifest.HiddenSize}, {r.att, last.attCols}}
	out := []segmentTensor{{r.logits, vocab}}
	if err := runSegment(r.head, tokens, in, out, r.logitRows); err != nil {
		return nil, fmt.Errorf("%w: head: %w", ErrRun, err)
	}
	r.rows = grow(r.rows, len(b.Seqs))
	off := 0
	for i, s := range b.Seqs {
		n := logitPositions(s) * vocab
		r.rows[i] = r.logits[off : off+n : off+n]
		off += n
	}
	return &Output{Logits: r.rows}, nil
}

// segment is a session of the paged layout with the names of its inputs and outputs.
type segment struct {
	s         *ort.Session
	ins, outs []string
}

// segmentTensor is a [rows][cols] float32 input or output of a segment.
type segmentTensor struct {
	data []float32
	cols int
}

// runSegment runs one segment over tokens rows; the head also takes the selected rows
// (its output has len(sel) rows).
func runSegment(s *segment, tokens int, in, out []segmentTensor, sel []int64) error {
	vals := make([]*ort.Value, 0, len(in)+1)
	outs := make([]*ort.Value, 0, len(out))
	defer func() {
		for _, v := range vals {
			v.Release()
		}
		for _, v := range outs {
			v.Release()
		}
	}()
	for _, t := range in {
		v, err := hostTensor(ort.Float32, []int64{int64(tokens), int64(t.cols)}, t.data[:tokens*t.cols])
		if err != nil {
			return fmt.Errorf("create input tensor: %w", err)
		}
		vals = append(vals, v)
	}
	outRows := tokens
	if sel != nil {
		v, err := hostTensor(ort.Int64, []int64{int64(len(sel))}, sel)
		if err != nil {
			return fmt.Errorf("create row tensor: %w", err)
		}
		vals = append(vals, v)
		outRows = len(sel)
	}
	for _, t := range out {
		v, err := hostTensor(ort.Float32, []int64{int64(outRows), int64(t.cols)}, t.data[:outRows*t.cols])
		if err != nil {
			return fmt.Errorf("create output tensor: %w", err)
		}
		outs = append(outs, v)
	}
	return s.s.Run(s.ins, vals, s.outs, outs)
}
