// # PagedAttention
//
// PagedAttention (pagedattn.go, pagedattn.c) is Conveyor's own implementation of ONNX Runtime's
// com.microsoft.PagedAttention contract for the CPU, where ONNX Runtime has none: the
// one-graph-per-step model (every layer's attention one PagedAttention node over the
// packed new tokens of every sequence, the KV cache updated in place) runs on CUDA with
// com.microsoft.PagedAttention and on CPUs, in float32 with float32 or float16 caches,
// with Conveyor's operator, domain com.conveyor, op type PagedAttention, since version
// 1 (PagedOpDescs: models/ort makes an ONNX Runtime custom operator of it). The same kernel is
// a plain Go call, PagedAttention, which the tests compare against a float64 reference written from
// the definition.
//
// # PagedAttention: contract
//
// Inputs, in order (float32 unless said; T new tokens, B rows):
//
//	0 query        [T, num_heads·D], or q|k|v [T, (num_heads+2·kv_num_heads)·D] when 1 and 2 are absent
//	1 key          [T, kv_num_heads·D]  (optional)
//	2 value        [T, kv_num_heads·D]  (optional)
//	3 key_cache    [num_blocks, block_size, kv_num_heads, D], float32 or float16
//	4 value_cache  [num_blocks, block_size, kv_num_heads, D], of key_cache's type
//	5 cumulative_sequence_length  int32 [B+1]: row b's new tokens are query rows cu[b] ... cu[b+1]-1
//	6 past_seqlens int32 [B]: tokens already cached for row b; its new token j is at position past[b]+j
//	7 block_table  int32 [B, max_blocks]: position p of row b is slot p%block_size of block block_table[b][p/block_size]
//	8 cos_cache    [max_positions, rotary_dim/2]  (optional; required with do_rotary)
//	9 sin_cache    [max_positions, rotary_dim/2]  (optional)
//	10-15 slot_mapping, head_sink, q_norm_weight, k_norm_weight, k_scale, v_scale  (declared; refused when given)
//	16 attention_metadata  int32 [2]  (optional): the call's longest new-token run and longest
//	   past+new, each 0 for unknown
//
// The 17 inputs are com.microsoft.PagedAttention's, so a graph written for CUDA loads
// here. Inputs 10-15 fail the run with NOT_IMPLEMENTED naming the input. The metadata
// are bounds by which CUDA sizes its launches instead of copying the lengths back and
// synchronising the stream in every layer; this kernel needs none, checks them as CUDA
// does, and trusts them no further (CUDA may skip work a bound too small hides).
//
// Outputs: 0 output [T, num_heads·D]; 1 key_cache_out and 2 value_cache_out, which must be
// the very buffers given as inputs 3 and 4 (the caller binds the same OrtValues as inputs
// and as pre-allocated outputs); otherwise the run fails with "PagedAttention: key_cache
// and key_cache_out must be the same buffer", as the CUDA operator does. Attributes:
// num_heads and kv_num_heads (required; grouped-query attention: query head h reads KV head
// h/(num_heads/kv_num_heads)), scale (0 or absent: 1/sqrt(D)), softcap (0: none; else each
// scaled score s becomes softcap·tanh(s/softcap)), local_window_size (see below),
// do_rotary and rotary_interleaved. is_causal, smooth_softmax and rotary_offset are refused
// at session creation unless they hold their defaults (1, 0, 0).
//
// # PagedAttention: what CUDA refuses, refused here
//
// The operator refuses every shape ONNX Runtime's CUDA PagedAttention refuses, in its
// words, so that a model the CPU serves is one the GPU serves. The rules are read in ONNX
// Runtime's sources (onnxruntime/contrib_ops/cuda/bert/paged_attention.cc, its helper
// contrib_ops/cpu/bert/paged_attention_helper.h, and group_query_attention_helper.h)
// and checked against the messages of the CUDA provider Conveyor ships (1.29.0, `make
// ort-gpu`), which differs from later sources in taking attention_metadata of shape (2)
// only.
// pagedattn_contract.go gives the same rules to the model builder and the runners (PagedHeadFits,
// PagedRotaryFits, PagedMinBlockSize), and TestPagedContractMatchesKernel holds them to the
// kernel's:
//
//   - num_heads and kv_num_heads positive (PagedAttention's constructor); num_heads at
//     most 1024, "num_heads should be no larger than" (CheckInputs: CUDA's threads per
//     block); num_heads a multiple of kv_num_heads (CheckInputs).
//   - head size a multiple of 8, "head_size must be a multiple of 8" (CheckInputs,
//     Check_Q_K_V and Check_QKV), and at most 1024 (no backend takes more:
//     memory-efficient attention's limit; ComputeInternal's "requires FlashAttention ...,
//     MemoryEfficientAttention ... or the paged decode kernel").
//   - block_size a power of two of at least 16, "block_size must be a power of two and
//     at least 16" (CheckKVCache).
//   - cos and sin caches, whenever both are given (do_rotary or not): head size a
//     multiple of 16, "head_size shall be a multiple of 16", and the caches' width a
//     multiple of 8 and at most head_size/2 — (head_size/16)·8 — "cos_cache dimension 1
//     must be <= head_size / 2 and a multiple of 8" (CheckRotaryCaches). A rotary of 12
//     in heads of 16 (Phi-3.5's and Phi-4-mini's factor 0.75 at that size) is refused:
//     the model builder then rotates the queries and keys in the graph and gives the node
//     no caches. With do_rotary, both caches: "cos_cache and sin_cache must be passed to
//     PagedAttention when do_rotary = 1" (ComputeInternal).
//   - key and value both given or both absent (Check_Q_K_V); cos and sin likewise
//     (CheckInputs); the caches 4-D and alike, [*, block_size, kv_num_heads, head_size]
//     (CheckKVCache); cumulative_sequence_length [B+1], past_seqlens [B] and block_table
//     [B, *] (CheckSequenceLengthTensors, CheckBlockTable).
//   - attention_metadata of shape (2), "Input 'attention_metadata' must have shape (2)"
//     (CheckInputs); for a call with tokens, no negative entry, "'attention_metadata'
//     entries must be non-negative ... Use 0 for 'unknown'." (ComputeInternal).
//   - element types: CUDA takes float16 and bfloat16 (T) with caches of the same type;
//     this operator takes float32 (T) with float32 or float16 caches (registered twice,
//     once per cache type: ONNX Runtime picks the kernel by the caches' type). A float16
//     cache stores each new key (rotated in float32) and value rounded to nearest even,
//     and each tile of keys and values is converted back to float32 before it is scored.
//     A float32 graph is the CPU's and a 16-bit one the GPU's (models/convert writes each
//     in its own domain).
//
// Beyond CUDA, the CPU kernel checks the values it would otherwise read out of bounds:
// CUDA clamps a bad block table entry on the device, where this kernel must not read
// out of its buffers, so what follows refuses calls CUDA would run:
//
// Every shape is checked against the others, and cumulative_sequence_length (from 0, never
// decreasing, ending at T), past_seqlens (>= 0), the block table entries of every position
// a row uses (in [0, num_blocks)) and those positions against block_table's columns and
// cos_cache's rows are checked before anything is written: a bad call fails with an
// INVALID_ARGUMENT status naming what is wrong (PagedAttention: an ErrPagedInput error) and changes
// nothing. Rows whose slots overlap are not detected (the later row's keys win).
//
// For every row and new token at position p: with do_rotary, its query and key heads are
// rotated over their first rotary_dim = 2·cos_cache.dims[1] values (partial rotary when
// that is less than D, as Phi-3) by row p of cos_cache and sin_cache, in rotate-half pairs
// (i, i+rotary_dim/2) or, with rotary_interleaved, adjacent pairs (2i, 2i+1). Its key and
// value are stored in its cache slot; then each query head attends, softmax(scale·q·k)·v,
// over the row's positions up to p, the new tokens of the same call included (a chunk of
// a prompt sees itself). Rows may mix prompt chunks at any past with decode rows; a row
// with no new tokens is allowed and reads and writes nothing, whatever its block table
// holds.
//
// # PagedAttention: the window
//
// With local_window_size = W > 0 the query at position p sees positions p-W+1 ... p: W
// keys, itself included. W <= 0 means no window. This is the CUDA operator's semantic,
// read in ONNX Runtime's sources: onnxruntime/contrib_ops/cuda/bert/paged_attention_impl.cu
// passes window_size_left = local_window_size - 1 to flash attention (which masks keys
// before p - window_size_left, and takes -1 for none: W = 0 is no window there too), its
// paged decode kernel admits "positions in [kv_len - local_window_size, kv_len)", and the
// operator's test reference (onnxruntime/test/python/transformers/test_paged_attention_cuda.py,
// construct_local_mask with window (local_window_size, 0)) masks keys at or before
// p - local_window_size. ONNX Runtime's CPU GroupQueryAttention (contrib_ops/cpu/bert/
// gqa_attention_base.h) differs by one: it lets a query see local_window_size + 1 keys.
// Conveyor's paged attention (models/attention, since retired) used W keys, like this operator.
//
// # PagedAttention: kernel
//
// The arithmetic is C over GCC/Clang vector extensions (pagedattn_impl.h), compiled for
// AVX-512F, AVX2+FMA and a portable 4-lane build; the best one the CPU runs is picked on
// first use (PagedAttentionISA). The new keys and values are stored first, in one pass.
// The attention is split into work items: one row, up to 16 of its new tokens and one KV
// head, or every KV head when the call has at least 16 such chunks (a decode batch), so
// that there are items for every thread either way.
//
// A decode item (one new token) makes three passes over its row's blocks per KV head:
// the scores of every key it sees, one softmax per query row, then the weighted sum of
// the values. The group's query rows (num_heads/kv_num_heads of them) go two at a time, so
// that two rows share each load of a key or value; a float16 cache's values are
// converted to float32 in registers as they are loaded (F16C); and the rows about
// CV_PA_PREFETCH_BYTES (8 KB) ahead are prefetched while one block is read. Its scores
// take 4 bytes of per-thread scratch per key and query row.
//
// An item of several tokens (a prompt chunk) walks the keys its tokens see in tiles of at
// most 64 positions with an online softmax (a running maximum, denominator and weighted
// sum per query row), so it needs no memory proportional to the past: each tile's keys
// and values are read from memory once (a float16 cache's converted once into a float32
// tile) and then from L1 by every query row of the group, and the next tile's blocks are
// prefetched into L2 while this one is scored.
//
// Either way a query row scores VW keys at a time (VW the vector's lanes), one
// accumulator per key sharing each load of the query, and sums the VW accumulators into
// one vector of scores by pairwise lane shuffles, not one horizontal sum per key; the
// weighted sum keeps its accumulators in registers while the values stream past.
// Through ONNX Runtime the items run on the session's intra-op threads
// (KernelContext_ParallelFor); PagedAttention spreads them over GOMAXPROCS goroutines.
//
// # PagedAttention: speed
//
// BenchmarkPagedAttention (one `go test -bench`, 3 s per case) on Qwen2.5-0.5B's attention shape: 14
// query heads over 2 KV heads of 64, full rotary, blocks of 16 tokens, float32 caches, the
// 24 layers' caches cycled so that each call reads its past from memory; a 2-core AMD
// EPYC (family 25 model 1, Zen 3; /proc/cpuinfo names it "AMD EPYC"), AVX2:
//
//	decode, 16 rows at past 512     1.47 ms per call    (10,900 tokens/s per layer)
//	prompt, one row of 128 tokens   1.23 ms per call    (104,000 tokens/s per layer)
//
// The decode call reads 8.4 MB of float32 keys and values (5.7 GB/s). Its scores are
// latency bound: each is one dot product of 64 values over two accumulator chains and a
// horizontal sum. Scoring a vector of keys at a time and tiles over several blocks
// (above) took it, on a 2-core first-generation Zen (AMD EPYC family 23 model 1, AVX2),
// from 2,569 to 2,493 µs per call with float32 caches and from 2,421 to 2,202 µs with
// float16 caches (medians of three runs of 500 calls each, alternating). Scoring the
// group's query heads against each key load is the next lever. Those float16 figures
// were taken on zero-filled caches (one page of zeros that the whole cache maps to, read
// from L1); the benchmark's half caches now hold its float32 past, rounded. On a 2-core Zen 4 (AMD EPYC family 25 model
// 17, AVX-512; medians of three, 1 s per case), before and after the decode path of
// three passes with query rows in pairs (above): decode 16 rows at past 512, 880 → 668 µs
// with float32 caches and 751 → 486 µs with float16; on the 50M benchmark model's shape
// (8 query heads over 4 KV heads of 64), 64 decode rows at past 128 and 512 with float16
// caches, 1,637 → 799 and 4,031 → 2,778 µs (float32: 1,306 → 1,078 and 4,861 → 4,721);
// the 128-token prompt, which keeps the tiles, unchanged within the noise (about 800-950
// µs). The 64 × 512 float16 call reads 16.7 MB, at 6 GB/s, where this VM streams 20-45
// GB/s: with the caches in L2 it takes two thirds of the time, so the arithmetic (the
// scores' pairwise sums, the conversions) bounds it as much as memory. A single decode row has
// only kv_num_heads items, so it uses that many threads.
//
// # PagedAttention: usage
//
// In Go, with the tensors as slices (KeyCache and ValueCache are updated in place):
//
//	err := kernels.PagedAttention(
//		kernels.PagedAttrs{NumHeads: 14, KVNumHeads: 2, DoRotary: true},
//		kernels.PagedDims{Tokens: 5, HeadDim: 64, NumBlocks: 64, BlockSize: 16, Batch: 2, MaxBlocks: 8, RotaryDim: 64, MaxPos: 4096},
//		kernels.PagedTensors{Query: q, Key: k, Value: v, KeyCache: kc, ValueCache: vc,
//			CumSeqLens: []int32{0, 4, 5}, PastSeqLens: []int32{0, 37}, BlockTable: table,
//			Cos: cos, Sin: sin, Out: out})
//
// Through ONNX Runtime, open the session with Conveyor's operators and bind each cache as
// both its input and its output:
//
//	sess, err := ort.NewSession("step.onnx", ort.SessionConfig{OwnOps: true})
//	err = sess.Run([]string{"query", "key_cache", "value_cache", ...}, []*ort.Value{query, keyCache, valueCache, ...},
//		[]string{"output", "key_cache_out", "value_cache_out"}, []*ort.Value{output, keyCache, valueCache})
package kernels
