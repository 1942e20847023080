// Package attention computes a transformer layer's attention straight over Conveyor's
// paged KV cache: each sequence's past keys and values are read from their blocks
// where they live, and the step's new keys and values are written into their blocks,
// so no step copies the past (the dense Optimum path gathers it into past_key_values
// and ONNX Runtime's Concat copies it again into present).
//
// # Contract
//
// Layer.Run takes the step's tokens packed row after row (no padding) as one q|k|v
// matrix, the sequences' block tables, past lengths and new-token counts, and the
// layer's K and V arenas ([block][kv_head][block_size][head_dim], kvcache.Storage's
// layout). It applies rotate-half rotary embedding to the new queries and keys
// (partial rotary and layers without rotary are parameters), stores the new keys and
// values, and writes each token's softmax(q·K)·V over the positions it may see: causal,
// optionally within a sliding window, optionally with tanh soft-capped scores. A
// prompt chunk attends to its cached blocks and to itself in the same call, so chunked
// prefill, prefix-cache hits and mixed prefill + decode steps all take this path.
// Every length and block id is checked in Go before the native code runs: a bad block
// table is an ErrBadInput error, never an out-of-range read.
//
// # Kernel
//
// The arithmetic is C (kernel_impl.h), written once over GCC/Clang vector extensions
// and compiled three times: AVX-512F, AVX2+FMA and a portable 4-lane build; the best
// one the CPU runs is picked at start-up (ISA). A work item is one sequence, one KV
// head and up to 16 query rows (tokens × the group's query heads): it walks the
// sequence's blocks once for the scores and once for the weighted values, so each K and
// V row is read once for every query head that shares it (grouped-query attention
// costs no extra memory traffic). Items are spread over GOMAXPROCS goroutines, each
// taking the next item when it finishes one. The tests compare every instruction set
// against a float64 reference written from the definition.
package attention
