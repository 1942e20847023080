package kvcache

import (
	"fmt"
)

// StorageConfig describes the K/V arenas.
type StorageConfig struct {
	NumBlocks       int   // same as the pool's
	BlockSizeTokens int   // same as the pool's
	Layers          int   // transformer layers
	KVHeads         int   // key/value heads per layer
	HeadDim         int   // values per head
	DType           DType // element type
	Parallelism     int   // goroutines for large gathers/scatters; 0 = GOMAXPROCS, 1 = never split
}

// Validate reports whether the configuration can build a Storage.
func (c StorageConfig) Validate() error {
	if c.NumBlocks <= 0 || c.NumBlocks > maxBlocks {
		return fmt.Errorf("%w: NumBlocks %d must be in [1, %d]", ErrInvalid, c.NumBlocks, maxBlocks)
	}
	if c.BlockSizeTokens <= 0 || c.Layers <= 0 || c.KVHeads <= 0 || c.HeadDim <= 0 {
		return fmt.Errorf("%w: BlockSizeTokens %d, Layers %d, KVHeads %d, HeadDim %d must be positive",
			ErrInvalid, c.BlockSizeTokens, c.Layers, c.KVHeads, c.HeadDim)
	}
	if c.DType.Size() == 0 {
		return fmt.Errorf("%w: unknown dtype %v", ErrInvalid, c.DType)
	}
	if c.Parallelism < 0 {
		return fmt.Errorf("%w: Parallelism %d must be >= 0", ErrInvalid, c.Parallelism)
	}
	return nil
}

// Storage holds the K and V arenas of every layer, laid out [block][kvHead][token][headDim].
// Gather and Scatter may use several goroutines internally but a Storage must not be used
// from two goroutines at once.
type Storage struct {
	cfg StorageConfig
}

// NewStorage allocates the arenas (2 * Layers * NumBlocks * BlockBytes/2/Layers bytes).
func NewStorage(cfg StorageConfig) (*Storage, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Storage{cfg: cfg}, nil
}

// Config returns the storage's configuration.
func (s *Storage) Config() StorageConfig { return s.cfg }

// CopyBlock copies block src's K and V, all layers, into block dst.
func (s *Storage) CopyBlock(src, dst BlockID) error { return nil }

// Gather writes each row's past into dense [batch, kvHeads, maxPast, headDim] buffers, one per
// layer: row b takes positions [0, pastLens[b]) from tables[b]; positions at or beyond
// pastLens[b] are zeroed. len(k) == len(v) == Layers and each buffer holds exactly
// batch*kvHeads*maxPast*headDim elements. Large gathers are split across goroutines.
func (s *Storage) Gather(tables [][]BlockID, pastLens []int, maxPast int, k, v [][]byte) error {
	return nil
}

// Scatter stores row b's new K/V for all layers: the dense [batch, kvHeads, srcTokens, headDim]
// buffers k[l], v[l] hold them at token columns [srcOffset, srcOffset+counts[b]); they go to
// positions [startPos[b], startPos[b]+counts[b]) of tables[b]. Rows with counts[b] == 0 are
// skipped.
func (s *Storage) Scatter(tables [][]BlockID, startPos, counts []int, srcTokens, srcOffset int, k, v [][]byte) error {
	return nil
}
