package kvcache

import (
	"fmt"
	"math"
	"math/bits"
)

// DType is the element type of the K/V arenas.
type DType int

// Element types. The engine maps the model's dtype onto these.
const (
	Float32 DType = iota // 4 bytes per element
	Float16              // 2 bytes per element (IEEE 754 binary16)
)

// Size returns the number of bytes per element, or 0 for an unknown DType.
func (d DType) Size() int {
	switch d {
	case Float32:
		return 4
	case Float16:
		return 2
	}
	return 0
}

// String returns "float32", "float16" or "DType(n)".
func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float16:
		return "float16"
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

// BlockBytes returns the bytes one block occupies across all layers, K and V together:
// 2 * layers * kvHeads * blockSizeTokens * headDim * dt.Size(). It returns 0 when any
// argument is not positive, dt is unknown or the product overflows an int64.
func BlockBytes(blockSizeTokens, layers, kvHeads, headDim int, dt DType) int64 {
	if dt.Size() == 0 {
		return 0
	}
	n, ok := mulPositive(2, layers, kvHeads, blockSizeTokens, headDim, dt.Size())
	if !ok {
		return 0
	}
	return n
}

// mulPositive returns the product of positive factors, and false when a factor is not
// positive or the product exceeds math.MaxInt64.
func mulPositive(factors ...int) (int64, bool) {
	prod := uint64(1)
	for _, f := range factors {
		if f <= 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(prod, uint64(f))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		prod = lo
	}
	return int64(prod), true
}

// NumBlocksForBudget returns how many blocks fit in budgetBytes of K/V storage for a model
// with the given shape. It returns 0 when the budget is too small or the shape is invalid.
func NumBlocksForBudget(budgetBytes int64, blockSizeTokens, layers, kvHeads, headDim int, dt DType) int {
	per := BlockBytes(blockSizeTokens, layers, kvHeads, headDim, dt)
	if per == 0 || budgetBytes <= 0 {
		return 0
	}
	n := budgetBytes / per
	if n > maxBlocks {
		n = maxBlocks
	}
	return int(n)
}
