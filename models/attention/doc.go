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
// head and up to 64 query rows (tokens × the group's query heads): it walks the
// sequence's blocks once for the scores and once for the weighted values, so each K and
// V row is read once for every query head that shares it (grouped-query attention
// costs no extra memory traffic). A decode item (one token, so every query row sees
// the same keys) takes a path of its own: four query rows at a time (two on AVX2) share
// each key and value load and four keys at a time share each query load, and the next
// block's keys and the current block's values are prefetched into L2 while the scores
// are computed (a served step reads every layer's past from memory). On Qwen2.5-0.5B's
// attention (14 query heads over 2 KV heads, float16 blocks), 16 rows, on a 2-core
// EPYC: the decode path took one layer at past 128 from 227 to 162 µs, and the L2
// prefetch (a non-temporal hint before let the blocks arrive too late) took all 24
// layers of a step (BenchmarkDecodeQwen05B, each layer's past from memory) from 14.4 to
// 10.9 ms at past 512 and from 5.3 to 4.4 ms at past 128. An item of 16 or more query
// rows (a prompt chunk) transposes its keys 64 at a time and computes four rows' scores
// against four key vectors at once; once softmaxed, each row's scores are zero outside
// its causal range, so the weighted values, too, take four rows per value load. That
// took a 512-token prefill of the 0.5B int8 model from 0.78-0.83 to 0.72 s. Items are spread over GOMAXPROCS
// goroutines, each taking the next item when it finishes one. The tests compare every
// instruction set against a float64 reference written from the definition.
//
// # Why a native kernel: the two designs measured
//
// Two designs fit Conveyor's stack, and both were measured on the 50M benchmark config
// (hidden 512, 8 layers, 8 query / 4 KV heads of 64, one decode token per row, every
// row at the same past) on a 2-core AVX-512 machine, ms per step, medians:
//
//	past × batch     paged (this package)   GQA, shared buffer   dense (Optimum)
//	128 × 16               11.6                  8.2 – 8.6            11.5
//	512 × 16               14.6                 12.0 – 13.3           19.0
//	512 × 64               47.1                 36.8 – 39.6           67.4
//	2048 × 16              42.7                 29.1 – 33.2           53.2
//	2048 × 64             163                  102 – 113             212
//
// The paged column is `go test ./models/ -bench DecodeStep/50M` (blocks of 16 tokens
// placed at random in a kvcache.Storage); dense is DecodeStepDense from before it
// included the gather of the past, so the real dense step is slower still. The GQA column came
// from a throwaway graph with ONNX Runtime's com.microsoft.GroupQueryAttention, each
// layer's past_key/present_key bound to one [batch, kv_heads, capacity, head_dim]
// tensor so the op appends in place (it does: without the shared buffer it zeroes
// present and copies the past, and runs at the dense column's speed).
//
// GQA over contiguous per-row buffers is 15-35% faster than this kernel at long pasts:
// each (row, head)'s past is one long run for the prefetchers, and the layer stays one
// ONNX Runtime graph (the paged path runs nine sessions a step, ~3 ms at batch 16). But
// that column is the design's upper bound, not what it would serve at: the paged
// blocks must appear in those buffers, which means mapping each block of each head
// (one 4 KB page at 16 tokens × 64 dims) into a per-row virtual region with memfd and
// mmap, on every new block of every layer, and giving up huge pages. The CPU kernel
// also takes several new tokens on top of a past only at batch 1, so each prompt chunk
// of a mixed step would be a pass of its own, and a row's capacity is one fixed stride
// per batch tensor. The native kernel reads the blocks where the allocator put them,
// serves a whole mixed step in one pass, and is ours to extend (sliding windows, soft
// capping, partial rotary and layers without rotary are parameters already; float16 and
// int8 blocks come next). Blocks of 64 tokens instead of 16 close part of the gap
// (2048 × 16: 39.4 ms), at the cost of coarser prefix sharing.
package attention
