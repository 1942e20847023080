package engine

import (
	"fmt"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models"
)

// pagedKV is the models.KV of one forward pass: it gathers each row's past from the
// sequence's KV blocks into the runner's dense tensors and scatters the new keys and
// values back into the blocks. The engine refills it for every pass and reuses its slices.
type pagedKV struct {
	storage  *kvcache.Storage
	tables   [][]kvcache.BlockID // row b's block table
	pastLens []int               // row b's tokens already in its blocks
	counts   []int               // row b's new tokens
	k, v     [][]byte            // per-layer views handed to the storage
	sub      *pagedKV            // the KV of Rows
	ids      [][]int32           // row b's block table as the attention kernel reads it
}

// Rows returns the KV of a pass over some of this pass's rows (models.RowsKV): when
// the runner splits a step into passes over groups of alike rows, each gathers and
// scatters only its own rows, straight from and into the blocks.
func (kv *pagedKV) Rows(rows []int) models.KV {
	if kv.sub == nil {
		kv.sub = &pagedKV{storage: kv.storage}
	}
	sub := kv.sub
	sub.reset()
	for _, r := range rows {
		sub.add(kv.tables[r], kv.pastLens[r], kv.counts[r])
	}
	return sub
}

// BlockTable returns row b's block ids (models.PagedKV: the paged attention path reads
// and writes the blocks in place, no gather or scatter).
func (kv *pagedKV) BlockTable(b int) []int32 {
	for len(kv.ids) <= b {
		kv.ids = append(kv.ids, nil)
	}
	t := kv.tables[b]
	ids := kv.ids[b][:0]
	for _, id := range t {
		ids = append(ids, int32(id))
	}
	kv.ids[b] = ids
	return ids
}

// Arena returns layer l's key and value arenas.
func (kv *pagedKV) Arena(l int) (k, v []byte) { return kv.storage.LayerK(l), kv.storage.LayerV(l) }

// Blocks returns the arenas' block count and block size in tokens.
func (kv *pagedKV) Blocks() (numBlocks, blockSizeTokens int) {
	c := kv.storage.Config()
	return c.NumBlocks, c.BlockSizeTokens
}

// reset empties the row lists for the next pass.
func (kv *pagedKV) reset() {
	kv.tables = kv.tables[:0]
	kv.pastLens = kv.pastLens[:0]
	kv.counts = kv.counts[:0]
}

// add appends one row.
func (kv *pagedKV) add(table []kvcache.BlockID, pastLen, count int) {
	kv.tables = append(kv.tables, table)
	kv.pastLens = append(kv.pastLens, pastLen)
	kv.counts = append(kv.counts, count)
}

func (kv *pagedKV) views(k, v []models.DenseKV) {
	kv.k, kv.v = kv.k[:0], kv.v[:0]
	for l := range k {
		kv.k = append(kv.k, k[l].Data)
		kv.v = append(kv.v, v[l].Data)
	}
}

// GatherPast fills every layer's past tensors from the rows' blocks.
func (kv *pagedKV) GatherPast(k, v []models.DenseKV) error {
	if len(k) == 0 || len(k) != len(v) {
		return fmt.Errorf("engine: gather: %d key and %d value layers", len(k), len(v))
	}
	if k[0].Batch != len(kv.tables) {
		return fmt.Errorf("engine: gather: %d rows, batch has %d", k[0].Batch, len(kv.tables))
	}
	kv.views(k, v)
	return kv.storage.Gather(kv.tables, kv.pastLens, k[0].Tokens, kv.k, kv.v)
}

// ScatterNew stores every row's new keys and values in its blocks.
func (kv *pagedKV) ScatterNew(k, v []models.DenseKV, newOffset int) error {
	if len(k) == 0 || len(k) != len(v) {
		return fmt.Errorf("engine: scatter: %d key and %d value layers", len(k), len(v))
	}
	if k[0].Batch != len(kv.tables) {
		return fmt.Errorf("engine: scatter: %d rows, batch has %d", k[0].Batch, len(kv.tables))
	}
	kv.views(k, v)
	return kv.storage.Scatter(kv.tables, kv.pastLens, kv.counts, k[0].Tokens, newOffset, kv.k, kv.v)
}

// kvDType maps the model's K/V element type onto the cache's.
func kvDType(d models.DType) (kvcache.DType, error) {
	switch d {
	case models.Float32:
		return kvcache.Float32, nil
	case models.Float16:
		return kvcache.Float16, nil
	}
	return 0, fmt.Errorf("%w: unsupported K/V dtype %v", ErrInvalidConfig, d)
}
