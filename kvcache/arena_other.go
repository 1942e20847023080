//go:build !linux

package kvcache

// allocArena returns n zeroed bytes for K/V arenas from the Go heap.
func allocArena(n int) (mem []byte, release func()) { return make([]byte, n), func() {} }
