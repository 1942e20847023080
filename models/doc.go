// Package models runs decoder-only language models: the runtime half of Conveyor's
// model code. It loads a model directory (model.onnx, plus model.onnx.data for models
// over ~2 GB, config.json, and optionally generation_config.json, tokenizer.json and
// tokenizer_config.json) into ONNX Runtime and runs forward passes for the engine.
//
// # Running
//
// Open loads a model directory on one of two attention paths (see "Attention paths"
// below). The step graph (StepRunner) serves every model Conveyor builds, on CPUs and on
// GPUs. OpenDense loads a directory for the dense path: one ONNX Runtime session whose
// Forward runs one forward pass for a whole batch of sequences. Every runner's sessions
// and tensors are package models/ort's, which owns Conveyor's use of ONNX Runtime
// (InitORT loads the shared library once per process). The dense graph must follow the
// Hugging Face Optimum decoder
// interface, so a decoder exported by Optimum serves as is:
//
//	input_ids                 [batch, seq]                     int64
//	attention_mask            [batch, past+seq]                int64 (1 = real token)
//	position_ids              [batch, seq]                     int64
//	past_key_values.{i}.key   [batch, kv_heads, past, head_dim] float32 (and .value)
//	logits                    [batch, seq, vocab]              float32
//	present.{i}.key           [batch, kv_heads, past+seq, head_dim] (and .value)
//
// The runners do not own the KV cache; the batch carries it (see "The cache in the
// batch" below). Before the pass the dense runner gathers each row's past out of its
// blocks into the dense past_key_values tensors (kvcache.Storage.Gather), and afterwards
// it stores the new keys and values from present in the rows' blocks (Storage.Scatter).
//
// The interface pads every row to the batch's longest past and longest new-token
// count, so a dense Forward is planned (planPasses in dense_passes.go) from an estimate of
// each pass's work: one ONNX Runtime pass when the rows are alike, or a few passes over
// groups of alike rows when one pass would be mostly padding (a prompt chunk next to
// decoding sequences) or would span more positions than the context window. Each group's
// pass is a batch of its own over the same cache, holding the group's rows, so it gathers
// and scatters only theirs.
//
// # The cache in the batch
//
// A Batch is plain data, like vLLM's attention metadata: its rows (new tokens, past
// length, block table) and the cache their block tables point into, a kvcache.Storage
// (Batch.Cache, SeqInput.Blocks). There is no interface to implement and nothing to
// type-switch on; each runner does its own thing with the data. The step runner binds the
// storage's arenas (LayerK, LayerV) as the graph's caches and passes the block tables;
// the dense runner gathers and scatters through the storage. The cache's layers, KV
// heads, head size and element type must be the model's (Spec) and each row's block
// table must cover its positions, or Forward fails with ErrBatch. A nil Cache means no
// cache: nothing is read or kept, so no row may have a past (the step runner then
// attends over scratch blocks of its own).
//
// # Attention paths
//
// Open picks the path (RunnerOptions.Attention, `conveyor serve --attention`):
//
//   - graph (the default when the directory has a step graph for the device, which every
//     directory Conveyor builds has): StepRunner runs the model's step graph (step/,
//     modeldir.StepManifest): the whole model as ONE ONNX graph and one ONNX Runtime run
//     per step, embedding, every layer with a PagedAttention node over the packed tokens
//     of all rows (prefill chunks and decode rows mixed) and the LM head over the rows'
//     last tokens only. Each layer's cache is one tensor [num_blocks, block_size,
//     kv_heads, head_dim] bound as the node's key_cache input and, the very same tensor,
//     its key_cache_out output, so the node writes the new keys and values in place and
//     no step copies the past. On a GPU (Open with DeviceCUDA, or DeviceAuto when one
//     loads) the graph is float16 or bfloat16 with ONNX Runtime's
//     com.microsoft.PagedAttention and the caches are device tensors (Spec.KVOnDevice: the
//     engine's storage only describes them, and block copies go through BlockCopier); on
//     a CPU the graph is float32 (its cache float16 or float32, as built) and its
//     PagedAttention is Conveyor's own implementation of the same contract (package
//     models/kernels), over the batch's storage itself laid out token-major
//     (Spec.KVTokenMajor).
//   - dense: DenseRunner, the Optimum interface above, for ONNX decoders Conveyor did not
//     build (Optimum exports) and for models whose heads PagedAttention cannot take.
//
// The two paths lay the cache out differently (token-major for the graph), so a cache is
// one path's. Both group the layers of a model with sliding windows (Spec.CacheLayout):
// each group of one window has a block table of its own, and a sliding group's blocks go
// back to the pool once its window has passed them. On a CPU the step graph is built with
// a block table input per group (modeldir.StepManifest.LayerGroups); a GPU graph keeps
// every layer's whole past in one group and applies the windows inside the attention.
//
// The step graph replaced per-layer ONNX Runtime segments with a native attention kernel
// between them, the CPU's path of earlier releases, once it was as fast on every measured
// shape. Measured on a 2-core Intel Xeon with AVX-512 (VNNI, no AMX), ONNX Runtime
// 1.29.0, Qwen2.5-0.5B's shape, float16 caches, medians of three runs of
// BenchmarkDecodeStep* and BenchmarkPrefillInt8 (ms per step, segments -> graph): int8
// weights, one row at past 128 28.1 -> 24.5, 16 rows 69.3 -> 45.2, one row at past 512
// 36.2 -> 25.1, 16 rows 89.0 -> 70.0, a 128-token prompt 210.2 -> 142.2; float32 weights,
// one row at past 128 100.9 -> 89.8, 16 rows 167.1 -> 163.7, at past 512 106.3 -> 92.2
// and 180.3 -> 151.2 (docs/performance.md).
//
// Graphs come from the builder, package models/convert (architectures, the ONNX writer,
// safetensors), which shares no code with the runtime: the model directory is their
// only contract, described by package models/modeldir.
//
// Example:
//
//	if _, err := convert.BuildRandom("models/testdata/tiny-llama/config.json", dir, 1, convert.Options{}); err != nil {
//		return err
//	}
//	r, err := models.Open(dir, models.RunnerOptions{}) // the step graph BuildRandom writes
//	if err != nil {
//		return err
//	}
//	defer r.Close()
//	out, err := r.Forward(&models.Batch{Seqs: []models.SeqInput{{Tokens: []int32{1, 42, 7}}}})
//	// out.Logits[0] holds the next-token logits after the prompt; nothing was kept.
//
//	// With a cache, a later pass reads the prompt's keys and values from its blocks:
//	sp := r.Spec()
//	cache, err := kvcache.NewStorage(kvcache.StorageConfig{NumBlocks: 8, BlockSizeTokens: 16,
//		Layers: sp.NumLayers, KVHeads: sp.NumKVHeads, HeadDim: sp.HeadDim, DType: sp.KVDType,
//		TokenMajor: sp.KVTokenMajor})
//	if err != nil {
//		return err
//	}
//	blocks := []kvcache.BlockID{5} // the sequence's positions 0-15
//	prompt := models.SeqInput{Tokens: []int32{1, 42, 7}, Blocks: blocks}
//	if _, err := r.Forward(&models.Batch{Cache: cache, Seqs: []models.SeqInput{prompt}}); err != nil {
//		return err
//	}
//	next := models.SeqInput{Tokens: []int32{9}, PastLen: 3, Blocks: blocks}
//	out, err = r.Forward(&models.Batch{Cache: cache, Seqs: []models.SeqInput{next}})
//	// out.Logits[0] predicts the token after 1, 42, 7, 9.
package models
