package engine

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/scheduler"
)

// draftCatchUp is the most tokens the draft model is fed in one step to catch up with
// its sequences (a new sequence's prompt, or what a sequence decoded while it did not
// speculate), over all rows: a row further behind feeds part of it and proposes nothing
// that step, so catching up is spread over steps rather than stalling one.
const draftCatchUp = 256

// drafter proposes the tokens of speculative decoding with a draft model (the
// "draft_model" method; Speculation.External): before the target's pass, the draft model
// runs its own batched steps over every speculating row, with its own paged KV cache,
// and makes the row's proposals, one step each. The first step feeds the
// draft what it has not seen of the sequence (the whole prompt at first; after a
// verification, the tokens accepted and sampled since) and gives the first proposal;
// each further step feeds the proposal before it.
//
// The draft's cache holds each sequence's tokens and the proposals fed after them; at the
// next step the proposals the target rejected are cut off (kvcache.Pool.Truncate), so the
// draft stays in step with the tokens the target accepted. A sequence keeps its draft
// cache while it is in the steps (speculating or not: the batch may be too large for a
// while), and loses it when it leaves them (finished, aborted, preempted) or, the cache
// being full, when it does not draft in a step that needs the room.
//
// A greedy row's proposals are the draft's argmax: verification (Engine.verifyDraft)
// accepts the longest prefix the model agrees with. A sampled row's are drawn from the
// draft's distribution (the row's temperature, top_k, top_p and min_p over the draft's
// logits), which is kept for verification's rejection sampling (sampler.verifyProposal):
// either way the output is distributed as the model's own.
type drafter struct {
	model   Model
	spec    models.Spec
	pool    *kvcache.Pool
	storage *kvcache.Storage
	batch   models.Batch
	log     *slog.Logger

	seqs map[kvcache.SeqID]*draftSeq
	step uint64
	rows []draftRow
	next []int32 // the last round's token of each row (a proposal, unless catching up)
	// dists holds, by item index, a sampled row's draft distributions (nil for a row
	// proposing greedy tokens); qbuf backs them from step to step.
	dists    [][]float32
	qbuf     [][]float32
	sc       sampleScratch
	groupBuf [][]kvcache.BlockID
	failures int64
}

// draftSeq is one sequence's state in the draft's cache.
type draftSeq struct {
	fed   []int32 // the tokens whose keys and values the draft's cache holds, in order
	known int     // fed[:known] are the sequence's own tokens (the rest: proposals)
	step  uint64  // the last step it was in
	// drafted is the last step it drafted in (it may be in a step without drafting:
	// the batch too large, or the step's catching up spent).
	drafted uint64
}

// draftRow is one speculating row of the step being drafted.
type draftRow struct {
	item *scheduler.Item
	st   *seqState // its sequence: the sampler draws sampled rows' proposals
	q    []float32 // sampled rows: each proposal's draft distribution, VocabSize apart
	id   kvcache.SeqID
	ds   *draftSeq
	feed []int32 // this round's tokens
	past int     // the row's tokens in the draft's cache before this round
	n    int     // proposals made
}

// newDrafter builds the draft side: model's own KV cache, holding tokens tokens (at
// least one sequence of maxLen) in blocks of its own default size.
func newDrafter(model Model, target models.Spec, tokens int, maxLen int, log *slog.Logger) (*drafter, error) {
	spec := model.Spec()
	if spec.VocabSize != target.VocabSize {
		return nil, fmt.Errorf("%w: the draft model's vocabulary has %d tokens, the model's %d: a draft must share the model's tokenizer",
			ErrInvalidConfig, spec.VocabSize, target.VocabSize)
	}
	if spec.NumLayers <= 0 || spec.NumKVHeads <= 0 || spec.HeadDim <= 0 || spec.MaxPositions <= 1 {
		return nil, fmt.Errorf("%w: draft model spec %+v", ErrInvalidConfig, spec)
	}
	if spec.MaxPositions < maxLen {
		return nil, fmt.Errorf("%w: the draft model has %d positions, fewer than the %d the model serves", ErrInvalidConfig, spec.MaxPositions, maxLen)
	}
	if spec.KVOnDevice || target.KVOnDevice {
		// Its cache would come on top of the GPU memory the model's was sized to take
		// (--gpu-memory-utilization), and it has not run there yet.
		return nil, fmt.Errorf("%w: a draft model on the GPU is not supported yet; speculate with the ngram method there", ErrInvalidConfig)
	}
	dt, err := kvDType(spec.KVDType)
	if err != nil {
		return nil, err
	}
	bs, err := spec.BlockSize(0)
	if err != nil {
		return nil, fmt.Errorf("%w: draft model: %w", ErrInvalidConfig, err)
	}
	layout := spec.CacheLayout(maxLen)
	numBlocks := len(layout.Windows) * ((max(tokens, maxLen) + bs - 1) / bs)
	pool, err := kvcache.NewPool(layout.Pool(kvcache.PoolConfig{NumBlocks: numBlocks, BlockSizeTokens: bs}))
	if err != nil {
		return nil, fmt.Errorf("%w: draft model: %w", ErrInvalidConfig, err)
	}
	storage, err := kvcache.NewStorage(layout.Storage(kvcache.StorageConfig{
		NumBlocks: numBlocks, BlockSizeTokens: bs, Layers: spec.NumLayers,
		KVHeads: spec.NumKVHeads, HeadDim: spec.HeadDim, DType: dt,
		TokenMajor: spec.KVTokenMajor, NoArenas: spec.KVOnDevice,
	}))
	if err != nil {
		return nil, fmt.Errorf("%w: draft model: %w", ErrInvalidConfig, err)
	}
	d := &drafter{model: model, spec: spec, pool: pool, storage: storage, log: log, seqs: make(map[kvcache.SeqID]*draftSeq)}
	d.batch.Cache = storage
	return d, nil
}

// close gives the draft's cache memory back.
func (d *drafter) close() { d.storage.Close() }

// propose writes the draft's proposals over the placeholders of every speculating item
// of the step (Item.Draft), shortening Draft where it proposes fewer (none for a row
// still catching up, or when the draft's cache is full or its pass failed).
func (d *drafter) propose(items []scheduler.Item) {
	d.step++
	d.rows = d.rows[:0]
	d.dists = slices.Grow(d.dists[:0], len(items))[:len(items)]
	clear(d.dists)
	for i := range items {
		if ds := d.seqs[items[i].Seq.ID]; ds != nil {
			ds.step = d.step // still in the steps: its draft cache is kept
		}
	}
	budget := draftCatchUp
	for i := range items {
		it := &items[i]
		if len(it.Draft) == 0 {
			continue
		}
		if r, ok := d.catchUp(it, &budget); ok {
			r.st = it.Seq.Data.(*seqState)
			if r.st.sampler.params.Temperature > 0 {
				// Its proposals are drawn from the draft's distribution, kept for verification.
				n := len(d.rows)
				for len(d.qbuf) <= n {
					d.qbuf = append(d.qbuf, nil)
				}
				d.qbuf[n] = slices.Grow(d.qbuf[n][:0], len(it.Draft)*d.spec.VocabSize)[:len(it.Draft)*d.spec.VocabSize]
				r.q = d.qbuf[n]
				d.dists[i] = r.q
			}
			d.rows = append(d.rows, r)
		} else {
			it.Draft = it.Draft[:0]
		}
	}
	for id, ds := range d.seqs {
		if ds.step != d.step {
			d.drop(id) // it left the steps
		}
	}
	for round := 0; len(d.rows) > 0; round++ {
		if err := d.forward(); err != nil {
			d.fail(items, err)
			return
		}
		kept := d.rows[:0]
		for i, r := range d.rows {
			toks := r.item.Seq.Tokens
			if round == 0 { // the sequence's own tokens are in the draft's cache now
				end := r.past + len(r.feed)
				from := d.pool.NumCommittedTokens(r.id)
				if err := d.pool.Commit(r.id, from, toks[from:end], 0); err != nil {
					d.fail(items, err)
					return
				}
				r.ds.known = end
			}
			r.past += len(r.feed)
			if r.past < len(toks) { // still catching up: no proposal this step
				r.item.Draft = r.item.Draft[:0]
				continue
			}
			r.item.Draft[r.n] = d.next[i]
			r.n++
			if r.n == len(r.item.Draft) {
				continue // the last proposal is not fed
			}
			r.feed = r.item.Draft[r.n-1 : r.n]
			r.ds.fed = append(r.ds.fed, d.next[i])
			kept = append(kept, r)
		}
		d.rows = kept
	}
}

// catchUp plans item it's first draft round: the draft's cache is cut back to the
// longest prefix it shares with the sequence, and the row feeds what follows (at most
// *budget tokens, which it takes from), with room reserved for the proposals it will
// feed after. It reports false when the row cannot draft this step.
func (d *drafter) catchUp(it *scheduler.Item, budget *int) (draftRow, bool) {
	id := it.Seq.ID
	toks := it.Seq.Tokens
	ds := d.seqs[id]
	if ds == nil {
		ds = &draftSeq{}
		d.seqs[id] = ds
	}
	ds.step = d.step
	c := ds.known
	for c < len(ds.fed) && c < len(toks) && ds.fed[c] == toks[c] {
		c++
	}
	c = min(c, len(toks)-1) // the last token is fed: its logits give the first proposal
	if c < d.pool.NumCommittedTokens(id) {
		d.pool.Free(id) // cannot happen with a sequence's tokens only appended; start over
		c, ds.known = 0, 0
	}
	if err := d.pool.Truncate(id, c); err != nil && d.pool.NumTokens(id) > 0 {
		d.drop(id)
		return draftRow{}, false
	}
	ds.fed = ds.fed[:c]
	ds.known = min(ds.known, c)
	if *budget <= 0 {
		return draftRow{}, false
	}
	feed := toks[c:min(len(toks), c+*budget)]
	*budget -= len(feed)
	extra := 0
	if c+len(feed) == len(toks) {
		extra = len(it.Draft) - 1 // the proposals fed after the first
	}
	ds.drafted = d.step
	if _, _, ok := d.pool.AllocateSlots(id, nil, len(feed)+extra); !ok {
		// The cache is full: the sequences not drafting this step give theirs up first.
		d.evictIdle()
		if _, _, ok := d.pool.AllocateSlots(id, nil, len(feed)+extra); !ok {
			d.drop(id)
			return draftRow{}, false
		}
	}
	ds.fed = append(ds.fed, feed...)
	return draftRow{item: it, id: id, ds: ds, feed: feed, past: c}, true
}

// forward runs one draft round over d.rows and takes each row's greedy token.
func (d *drafter) forward() error {
	d.batch.Seqs = d.batch.Seqs[:0]
	d.groupBuf = d.groupBuf[:0]
	for _, r := range d.rows {
		var groups [][]kvcache.BlockID
		if d.pool.NumGroups() > 1 {
			start := len(d.groupBuf)
			d.groupBuf = d.pool.AppendGroupTables(d.groupBuf, r.id, 1)
			groups = d.groupBuf[start:len(d.groupBuf):len(d.groupBuf)]
		}
		d.batch.Seqs = append(d.batch.Seqs, models.SeqInput{
			Tokens: r.feed, PastLen: r.past, Blocks: d.pool.BlockTable(r.id), GroupBlocks: groups,
			ArgmaxOnly: r.q == nil || r.past+len(r.feed) < len(r.item.Seq.Tokens),
		})
	}
	out, err := d.model.Forward(&d.batch)
	if err == nil && (out == nil || len(out.Logits) != len(d.rows)) {
		err = fmt.Errorf("forward returned %d logit rows for %d sequences", lenLogits(out), len(d.rows))
	}
	if err != nil {
		return err
	}
	d.next = d.next[:0]
	vocab := d.spec.VocabSize
	for i, r := range d.rows {
		switch row := out.Logits[i]; {
		case r.q != nil && row != nil && r.past+len(r.feed) == len(r.item.Seq.Tokens)+r.n:
			// A sampled row's proposal: drawn from the draft's distribution.
			q := r.q[r.n*vocab : (r.n+1)*vocab]
			d.next = append(d.next, r.st.sampler.drawDraft(row[len(row)-vocab:], q, &d.sc))
		case r.q != nil && r.past+len(r.feed) == len(r.item.Seq.Tokens)+r.n:
			// The draft gave its argmax only: a proposal for certain.
			q := r.q[r.n*vocab : (r.n+1)*vocab]
			clear(q)
			x := out.Argmax[i]
			q[x] = 1
			d.next = append(d.next, x)
		case row != nil:
			d.next = append(d.next, argmax(row[len(row)-d.spec.VocabSize:]))
		case i < len(out.Argmax):
			d.next = append(d.next, out.Argmax[i])
		default:
			return fmt.Errorf("forward returned neither logits nor argmax for row %d", i)
		}
	}
	return nil
}

// fail gives up the step's proposals after a failed draft pass: the draft's cache may
// hold half-written rows, so every sequence starts over.
func (d *drafter) fail(items []scheduler.Item, err error) {
	d.failures++
	if d.failures&(d.failures-1) == 0 { // the 1st, 2nd, 4th, 8th...: a failing draft does not flood the log
		d.log.Error("engine: the draft model's pass failed; the step verifies no proposals", "err", err, "failures", d.failures)
	}
	for i := range items {
		items[i].Draft = items[i].Draft[:0]
	}
	d.reset()
	d.rows = d.rows[:0]
}

// reset frees every sequence's draft cache (the engine has no sequence left).
func (d *drafter) reset() {
	for id := range d.seqs {
		d.drop(id)
	}
}

// evictIdle frees the draft caches of the sequences not drafting this step.
func (d *drafter) evictIdle() {
	for id, ds := range d.seqs {
		if ds.drafted != d.step {
			d.drop(id)
		}
	}
}

// drop forgets sequence id's draft cache.
func (d *drafter) drop(id kvcache.SeqID) {
	d.pool.Free(id)
	delete(d.seqs, id)
}

// dist returns item i's draft distribution of proposal j (VocabSize probabilities), or
// nil when its proposals are greedy.
func (d *drafter) dist(i, j int) []float32 {
	if i >= len(d.dists) || d.dists[i] == nil {
		return nil
	}
	v := d.spec.VocabSize
	return d.dists[i][j*v : (j+1)*v]
}

// timeDraft runs the drafter over the step's items, if there is one, and times it.
func (e *Engine) timeDraft(items []scheduler.Item) {
	if e.drafter == nil {
		return
	}
	t0 := time.Now()
	e.drafter.propose(items)
	e.phases.Draft = time.Since(t0)
}
