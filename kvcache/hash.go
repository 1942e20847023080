package kvcache

import "math/bits"

// blockHashFunc computes a full block's prefix-cache key from its parent's key, its token ids
// and the extra key. Keys only find candidates: a candidate is always verified against the
// stored token ids and parent before it is used, so a collision costs a miss, never wrong data.
type blockHashFunc func(parent uint64, tokens []int32, extraKey uint64) uint64

const (
	hashK1   = 0x9e3779b97f4a7c15
	hashK2   = 0xc2b2ae3d27d4eb4f
	hashRoot = 0x243f6a8885a308d3 // parent key of a sequence's first block
)

// hashBlock is a 64-bit multiply-rotate hash over pairs of token ids with a murmur3 finalizer.
func hashBlock(parent uint64, tokens []int32, extraKey uint64) uint64 {
	h := fmix64(parent^hashK1) ^ fmix64(extraKey+hashK2)
	i := 0
	for ; i+1 < len(tokens); i += 2 {
		w := uint64(uint32(tokens[i])) | uint64(uint32(tokens[i+1]))<<32
		h = bits.RotateLeft64(h^(w*hashK1), 29) * hashK2
	}
	if i < len(tokens) {
		h = bits.RotateLeft64(h^(uint64(uint32(tokens[i]))*hashK1), 29) * hashK2
	}
	return fmix64(h ^ uint64(len(tokens)))
}

func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
