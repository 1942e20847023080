package models

import (
	"fmt"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/kernels"
	"github.com/conveyor-llm/conveyor/models/modeldir"
	"github.com/conveyor-llm/conveyor/models/ort"
)

// AttentionGraph runs the model's step graph (StepRunner): the whole model as one ONNX
// graph, one run per step, with PagedAttention reading and writing the KV blocks in place.
const AttentionGraph = "graph"

// kvDTypeRefused is the error for a --kv-cache-dtype kv that the step graph in dir,
// described by man, was not built for.
func kvDTypeRefused(dir string, man *modeldir.StepManifest, kv string) error {
	if man.DType != "float32" {
		return fmt.Errorf("%w: --kv-cache-dtype %s: a %s step graph's cache is its own type (leave it auto)", ErrModelDir, kv, man.DType)
	}
	return fmt.Errorf("%w: --kv-cache-dtype %s: %s's step graph was built for a %s cache (leave it auto, or rebuild it with `conveyor build-model --kv-cache-dtype %s`)",
		ErrModelDir, kv, dir, man.CacheDType(), kv)
}

// StepRunner runs a model's step graph (modeldir.StepManifest): one ONNX Runtime run per
// Forward over the step's new tokens packed row after row, every layer's PagedAttention
// reading the rows' pasts from their blocks and writing the new keys and values into
// them, and the LM head over the tokens whose logits are wanted only. On a CPU the cache
// is the batch's storage itself (token-major arenas wrapped as tensors, no copy); on a
// GPU it is one device tensor per layer and kind, allocated at the first Forward with the
// storage's shape, and the storage holds no arenas (Spec.KVOnDevice).
type StepRunner struct {
	mu   sync.Mutex
	spec Spec
	man  *modeldir.StepManifest
	dev  *ort.Device
	sess *ort.Session
	elem ort.ElemType

	inNames, outNames []string

	// The cache the session's cache inputs and outputs are bound to.
	bound      *kvcache.Storage // the storage kv belongs to
	boundShape [4]int64         // its [num_blocks, block_size, kv_heads, head_dim]
	kv         []*ort.Value     // key_cache.0, value_cache.0, key_cache.1, ...
	scratch    *kvcache.Storage // the cache of a Forward without one

	// Per-step buffers, reused.
	ids          []int64
	cu, past     []int32
	tables       [][]int32 // per layer group: [rows][width]
	width        int64
	graphGroups  int // the graph's layer groups, a block table input each (0 counts as 1)
	groups       int // the bound cache's layer groups: 1, or the graph's
	rows         []int64
	meta         []int32    // attention_metadata [2]: the longest new-token run and the longest past+new
	logits       []float32  // [R][vocab] on the host
	argmax       []int64    // [R]
	devLogits    *ort.Value // [capacity][vocab] on a GPU, grown as needed
	out          [][]float32
	outArgmax    []int32
	scratchBatch Batch
	ins, outs    []*ort.Value
}

// OpenStep loads dir's step graph onto dev (CPU when nil). A directory without one is an
// error wrapping ErrModelDir and modeldir.ErrNoStep.
func OpenStep(dir string, opts RunnerOptions, dev *ort.Device) (*StepRunner, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	man, err := modeldir.LoadStep(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrModelDir, err)
	}
	if dev == nil {
		dev = ort.CPU()
	}
	if dev.IsCPU() && man.AttentionDomain != modeldir.StepDomainConveyor {
		return nil, fmt.Errorf("%w: %s's step graph is %s with ONNX Runtime's PagedAttention, which runs on NVIDIA GPUs only: "+
			"serve it with --device cuda, or rebuild it with `conveyor build-model --dtype float32` for the CPU", ErrModelDir, dir, man.DType)
	}
	if !dev.IsCPU() && man.AttentionDomain != modeldir.StepDomainMicrosoft {
		return nil, fmt.Errorf("%w: %s's step graph is float32 for the CPU: rebuild it with `conveyor build-model --dtype float16` "+
			"(or bfloat16) to serve it on %s", ErrModelDir, dir, dev.Name())
	}
	if kv := opts.KVCacheDType; kv != "" && kv != KVCacheAuto && kv != man.CacheDType() {
		return nil, kvDTypeRefused(dir, man, kv)
	}
	if man.Quantization == "int8" {
		// Every product runs on Int8Linear's own threads: ONNX Runtime's pool, left with the
		// small operators between them, must not spin beside those threads.
		opts.NoSpin = true
	}
	if err := ort.InitWithPool(opts.ORTLib, opts.pool()); err != nil {
		return nil, err
	}
	meta, err := readModelMeta(dir)
	if err != nil {
		return nil, err
	}
	kvType, elem := Float32, ort.Float32
	switch man.CacheDType() {
	case "float16":
		kvType, elem = Float16, ort.Float16
	case "bfloat16":
		// The host side only sizes a device cache: bfloat16 takes float16's two bytes.
		kvType, elem = Float16, ort.BFloat16
	}
	r := &StepRunner{
		man:  man,
		dev:  dev,
		elem: elem,
		spec: Spec{
			NumLayers:    man.NumLayers,
			NumKVHeads:   man.NumKVHeads,
			HeadDim:      man.HeadDim,
			VocabSize:    man.VocabSize,
			MaxPositions: man.MaxPositions,
			KVDType:      kvType,
			BOSTokenID:   meta.bos,
			EOSTokenIDs:  meta.eos,
			// The graph applies the sliding windows itself, over the layer groups it was
			// built with (a block table each) or one group (Spec.CacheLayout).
			LayerWindows: man.Windows,
			LayerGroups:  man.LayerGroups,
			KVTokenMajor: true,
			KVOnDevice:   !dev.IsCPU(),
			MinBlockSize: kernels.PagedMinBlockSize,
		},
	}
	if !dev.IsCPU() {
		// ONNX Runtime's CUDA PagedAttention runs FlashAttention only with blocks of a
		// multiple of this size; with smaller ones a step with a prompt chunk runs
		// memory-efficient attention over a dense copy of every row's context per layer.
		r.spec.MinBlockSize = kernels.PagedFlashBlockSize(man.HeadDim)
	}
	r.inNames = []string{modeldir.StepInputIDs, modeldir.StepCumLens, modeldir.StepPastLens, modeldir.StepLogitRows,
		modeldir.StepAttentionMetadata}
	r.graphGroups = man.NumGroups()
	for g := range r.graphGroups {
		r.inNames = append(r.inNames, modeldir.StepGroupBlockTable(g))
	}
	r.outNames = []string{modeldir.StepLogits, modeldir.StepArgmax}
	for l := range man.NumLayers {
		r.inNames = append(r.inNames, modeldir.StepKeyCache(l), modeldir.StepValueCache(l))
		r.outNames = append(r.outNames, modeldir.StepKeyCacheOut(l), modeldir.StepValueCacheOut(l))
	}
	path := filepath.Join(dir, modeldir.StepDir, man.Graph)
	r.sess, err = ort.NewSession(path, ort.SessionConfig{Device: dev, Threads: opts.IntraOpThreads, OwnOps: man.OwnOps})
	if err != nil {
		return nil, fmt.Errorf("%w: cannot load %s: %s", ErrModelDir, path, oneLine(err.Error()))
	}
	return r, nil
}

// Spec describes the model.
func (r *StepRunner) Spec() Spec { return r.spec }

// Attention returns AttentionGraph.
func (r *StepRunner) Attention() string { return AttentionGraph }

// Device names the device the graph runs on ("cpu", "cuda:0 (...)").
func (r *StepRunner) Device() string { return r.dev.Name() }

// DeviceMemory returns the GPU's free and total memory in bytes (an error on a CPU).
func (r *StepRunner) DeviceMemory() (free, total int64, err error) { return r.dev.Memory() }

// Close releases the session and the cache tensors.
func (r *StepRunner) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unbind()
	if r.devLogits != nil {
		r.devLogits.Release()
		r.devLogits = nil
	}
	if r.scratch != nil {
		r.scratch.Close()
		r.scratch = nil
	}
	if r.sess == nil {
		return nil
	}
	err := r.sess.Close()
	r.sess = nil
	return err
}

// Forward runs one step over the batch.
func (r *StepRunner) Forward(b *Batch) (*Output, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sess == nil {
		return nil, fmt.Errorf("%w: runner is closed", ErrRun)
	}
	if b == nil || len(b.Seqs) == 0 {
		return nil, fmt.Errorf("%w: empty batch", ErrBatch)
	}
	if b.Cache == nil {
		var err error
		if b, err = r.scratchCache(b); err != nil {
			return nil, err
		}
	}
	if _, _, err := checkBatch(b, r.spec); err != nil {
		return nil, err
	}
	if err := r.bind(b.Cache); err != nil {
		return nil, err
	}
	r.pack(b)
	if err := r.run(b); err != nil {
		return nil, err
	}
	return r.split(b), nil
}

// pack fills the step's small inputs from the batch: the packed tokens, the rows'
// cumulative new-token counts, past lengths and block tables, one per layer group of the
// graph (a cache of one group gives every group its table), padded with block 0, which no
// position the graph reads names (nor does any entry a sliding window has passed), the
// tokens whose logits are wanted, and attention_metadata's exact bounds over the rows.
func (r *StepRunner) pack(b *Batch) {
	bs := b.Cache.Config().BlockSizeTokens
	rows := len(b.Seqs)
	r.ids, r.rows = r.ids[:0], r.rows[:0]
	r.cu = append(r.cu[:0], 0)
	r.past = r.past[:0]
	width := 1
	for _, s := range b.Seqs {
		width = max(width, (s.PastLen+len(s.Tokens)+bs-1)/bs)
	}
	r.tables = grow(r.tables, max(1, r.graphGroups))
	for g := range r.tables {
		r.tables[g] = grow(r.tables[g], rows*width)
		clear(r.tables[g])
	}
	r.meta = append(r.meta[:0], 0, 0)
	for i, s := range b.Seqs {
		r.meta[0], r.meta[1] = max(r.meta[0], int32(len(s.Tokens))), max(r.meta[1], int32(s.PastLen+len(s.Tokens)))
		start := len(r.ids)
		for _, t := range s.Tokens {
			r.ids = append(r.ids, int64(t))
		}
		if s.AllLogits {
			for j := start; j < len(r.ids); j++ {
				r.rows = append(r.rows, int64(j))
			}
		} else {
			r.rows = append(r.rows, int64(len(r.ids)-1))
		}
		r.cu = append(r.cu, int32(len(r.ids)))
		r.past = append(r.past, int32(s.PastLen))
		n := (s.PastLen + len(s.Tokens) + bs - 1) / bs
		for g, table := range r.tables {
			blocks := s.Blocks
			if r.groups > 1 {
				blocks = s.table(g)
			}
			for j, id := range blocks[:n] {
				if id != kvcache.NoBlock {
					table[i*width+j] = int32(id)
				}
			}
		}
	}
	r.width = int64(width)
}

// run creates the step's input and output tensors over the packed buffers and runs the
// graph once. On a GPU the logits stay in device memory: only the rows that need them
// (not ArgmaxOnly) are copied back, and every row's argmax.
func (r *StepRunner) run(b *Batch) error {
	defer r.releaseStepValues()
	rows, width, n, vocab := len(r.cu)-1, r.width, len(r.rows), r.spec.VocabSize
	r.logits = grow(r.logits, n*vocab)
	r.argmax = grow(r.argmax, n)
	type hostInput struct {
		t     ort.ElemType
		shape []int64
		ptr   unsafe.Pointer
		bytes int
	}
	small := []hostInput{
		{ort.Int64, []int64{int64(len(r.ids))}, unsafe.Pointer(&r.ids[0]), 8 * len(r.ids)},
		{ort.Int32, []int64{int64(rows + 1)}, unsafe.Pointer(&r.cu[0]), 4 * len(r.cu)},
		{ort.Int32, []int64{int64(rows)}, unsafe.Pointer(&r.past[0]), 4 * rows},
		{ort.Int64, []int64{int64(n)}, unsafe.Pointer(&r.rows[0]), 8 * n},
		{ort.Int32, []int64{2}, unsafe.Pointer(&r.meta[0]), 8},
	}
	for _, table := range r.tables {
		small = append(small, hostInput{ort.Int32, []int64{int64(rows), width}, unsafe.Pointer(&table[0]), 4 * rows * int(width)})
	}
	r.ins, r.outs = r.ins[:0], r.outs[:0]
	for _, s := range small {
		v, err := ort.NewHostTensor(s.t, s.shape, s.ptr, s.bytes)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrRun, err)
		}
		r.ins = append(r.ins, v)
	}
	logits, err := r.logitsOutput(n)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRun, err)
	}
	r.outs = append(r.outs, logits)
	argmax, err := ort.NewHostTensor(ort.Int64, []int64{int64(n)}, unsafe.Pointer(&r.argmax[0]), 8*n)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRun, err)
	}
	r.outs = append(r.outs, argmax)
	ins, outs := append(r.ins, r.kv...), append(r.outs, r.kv...)
	if err := r.sess.Run(r.inNames, ins, r.outNames, outs); err != nil {
		return fmt.Errorf("%w: step graph: %s", ErrRun, oneLine(err.Error()))
	}
	if !r.dev.IsCPU() {
		return r.copyLogits(b)
	}
	return nil
}

// logitsOutput returns the tensor the step's n logit rows are written to: the host
// buffer on a CPU, the first n rows of the device buffer on a GPU.
func (r *StepRunner) logitsOutput(n int) (*ort.Value, error) {
	vocab := int64(r.spec.VocabSize)
	if r.dev.IsCPU() {
		return ort.NewHostTensor(ort.Float32, []int64{int64(n), vocab}, unsafe.Pointer(&r.logits[0]), 4*n*int(vocab))
	}
	if r.devLogits == nil || r.devLogits.Shape()[0] < int64(n) {
		if r.devLogits != nil {
			r.devLogits.Release()
			r.devLogits = nil
		}
		v, err := ort.NewDeviceTensor(r.dev, ort.Float32, []int64{int64(max(n, 64)), vocab})
		if err != nil {
			return nil, err
		}
		r.devLogits = v
	}
	return ort.NewTensorView(r.devLogits, 0, []int64{int64(n), vocab})
}

// copyLogits copies from the device the logit rows of the batch rows that need them.
func (r *StepRunner) copyLogits(b *Batch) error {
	vocab := r.spec.VocabSize
	var src, dst []*ort.Value
	defer func() {
		for _, v := range append(src, dst...) {
			v.Release()
		}
	}()
	off := 0
	for _, s := range b.Seqs {
		n := 1
		if s.AllLogits {
			n = len(s.Tokens)
		}
		if !s.ArgmaxOnly || s.AllLogits {
			shape := []int64{int64(n), int64(vocab)}
			sv, err := ort.NewTensorView(r.devLogits, 4*off*vocab, shape)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrRun, err)
			}
			src = append(src, sv)
			dv, err := ort.NewHostTensor(ort.Float32, shape, unsafe.Pointer(&r.logits[off*vocab]), 4*n*vocab)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrRun, err)
			}
			dst = append(dst, dv)
		}
		off += n
	}
	if err := ort.CopyTensors(src, dst); err != nil {
		return fmt.Errorf("%w: logits to the host: %w", ErrRun, err)
	}
	return nil
}

// releaseStepValues releases the step's own tensors (not the cache's).
func (r *StepRunner) releaseStepValues() {
	for _, v := range r.ins {
		v.Release()
	}
	for _, v := range r.outs {
		v.Release()
	}
	r.ins, r.outs = r.ins[:0], r.outs[:0]
}

// split cuts the logits into the rows' slices; a row that asked for its argmax only
// gets that (the same on every device, so the CPU's tests cover what a GPU step returns).
func (r *StepRunner) split(b *Batch) *Output {
	v := r.spec.VocabSize
	r.out, r.outArgmax = r.out[:0], r.outArgmax[:0]
	off := 0
	for _, s := range b.Seqs {
		n := 1
		if s.AllLogits {
			n = len(s.Tokens)
		}
		r.outArgmax = append(r.outArgmax, int32(r.argmax[off+n-1]))
		if s.ArgmaxOnly && !s.AllLogits {
			r.out = append(r.out, nil)
		} else {
			r.out = append(r.out, r.logits[off*v:(off+n)*v:(off+n)*v])
		}
		off += n
	}
	return &Output{Logits: r.out, Argmax: r.outArgmax}
}

// bind points the session's cache inputs and outputs at c: its arenas on a CPU, device
// tensors of its shape on a GPU. It is a no-op while c stays the bound cache.
func (r *StepRunner) bind(c *kvcache.Storage) error {
	cfg := c.Config()
	shape := [4]int64{int64(cfg.NumBlocks), int64(cfg.BlockSizeTokens), int64(cfg.KVHeads), int64(cfg.HeadDim)}
	if c == r.bound && shape == r.boundShape {
		return nil
	}
	if !cfg.TokenMajor {
		return fmt.Errorf("%w: the step graph reads a token-major cache (kvcache.StorageConfig.TokenMajor)", ErrBatch)
	}
	if groups := c.NumGroups(); groups > 1 {
		same := groups == r.graphGroups
		for l := 0; same && l < r.spec.NumLayers; l++ {
			same = c.LayerGroup(l) == r.man.LayerGroups[l]
		}
		if !same {
			return fmt.Errorf("%w: the cache's %d layer groups are not the step graph's %d (Spec.CacheLayout)", ErrBatch, groups, r.graphGroups)
		}
	}
	r.unbind()
	for l := range r.spec.NumLayers {
		for _, arena := range [][]byte{c.LayerK(l), c.LayerV(l)} {
			var v *ort.Value
			var err error
			if r.dev.IsCPU() {
				v, err = ort.NewHostTensor(r.elem, shape[:], unsafe.Pointer(&arena[0]), len(arena))
			} else {
				v, err = ort.NewDeviceTensor(r.dev, r.elem, shape[:])
			}
			if err != nil {
				r.unbind()
				return fmt.Errorf("%w: the KV cache of layer %d: %w", ErrRun, l, err)
			}
			r.kv = append(r.kv, v)
		}
	}
	r.bound, r.boundShape, r.groups = c, shape, c.NumGroups()
	return nil
}

// CopyBlocks copies whole blocks of every layer's keys and values, in order, in the
// bound cache's own memory (the GPU's, for a device cache): copy-on-write of a shared
// partial block when a sequence forks (n, best_of).
func (r *StepRunner) CopyBlocks(ops []kvcache.CopyOp) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(ops) == 0 {
		return nil
	}
	if len(r.kv) == 0 {
		return fmt.Errorf("%w: no cache is bound to copy blocks in", ErrRun)
	}
	shape := []int64{1, r.boundShape[1], r.boundShape[2], r.boundShape[3]}
	blockBytes := int(shape[1]*shape[2]*shape[3]) * r.elem.Size()
	var src, dst []*ort.Value
	defer func() {
		for _, v := range append(src, dst...) {
			v.Release()
		}
	}()
	for _, op := range ops {
		if op.Src < 0 || op.Dst < 0 || int64(op.Src) >= r.boundShape[0] || int64(op.Dst) >= r.boundShape[0] {
			return fmt.Errorf("%w: copy of block %d to %d in a cache of %d blocks", ErrBatch, op.Src, op.Dst, r.boundShape[0])
		}
		for _, t := range r.kv {
			s, err := ort.NewTensorView(t, int(op.Src)*blockBytes, shape)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrRun, err)
			}
			src = append(src, s)
			d, err := ort.NewTensorView(t, int(op.Dst)*blockBytes, shape)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrRun, err)
			}
			dst = append(dst, d)
		}
	}
	if err := ort.CopyTensors(src, dst); err != nil {
		return fmt.Errorf("%w: %w", ErrRun, err)
	}
	return nil
}

// unbind releases the cache tensors.
func (r *StepRunner) unbind() {
	for _, v := range r.kv {
		v.Release()
	}
	r.kv, r.bound, r.boundShape = r.kv[:0], nil, [4]int64{}
}

// scratchBlockSize is the block size in tokens of a Forward without a cache.
const scratchBlockSize = 16

// scratchCache returns b with a scratch cache that holds this pass's tokens only: every
// row's tokens in blocks of their own.
func (r *StepRunner) scratchCache(b *Batch) (*Batch, error) {
	need := 0
	for _, s := range b.Seqs {
		if s.PastLen > 0 {
			return nil, fmt.Errorf("%w: a row has %d past tokens but the batch has no cache", ErrBatch, s.PastLen)
		}
		need += (len(s.Tokens) + scratchBlockSize - 1) / scratchBlockSize
	}
	if r.scratch == nil || r.scratch.Config().NumBlocks < need {
		if r.scratch != nil {
			if r.bound == r.scratch {
				r.unbind()
			}
			r.scratch.Close()
		}
		st, err := kvcache.NewStorage(kvcache.StorageConfig{NumBlocks: max(need, 8), BlockSizeTokens: scratchBlockSize,
			Layers: r.spec.NumLayers, KVHeads: r.spec.NumKVHeads, HeadDim: r.spec.HeadDim,
			DType: r.spec.KVDType, TokenMajor: true})
		if err != nil {
			return nil, fmt.Errorf("%w: scratch cache: %w", ErrRun, err)
		}
		r.scratch = st
	}
	sb := &r.scratchBatch
	sb.Cache, sb.Seqs = r.scratch, append(sb.Seqs[:0], b.Seqs...)
	next := kvcache.BlockID(0)
	for i := range sb.Seqs {
		n := (len(sb.Seqs[i].Tokens) + scratchBlockSize - 1) / scratchBlockSize
		blocks := make([]kvcache.BlockID, n)
		for j := range blocks {
			blocks[j] = next
			next++
		}
		sb.Seqs[i].Blocks, sb.Seqs[i].GroupBlocks = blocks, nil
	}
	return sb, nil
}
