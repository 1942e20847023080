// Package kvcache is Conveyor's paged KV cache: a block allocator with reference counts and
// automatic prefix caching (Pool), and the K/V block storage with gather/scatter to and from
// the model's dense past/present tensors (Storage).
package kvcache
