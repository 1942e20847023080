// Package models runs decoder-only language models: the runtime half of Conveyor's
// model code. It loads a model directory (model.onnx, plus model.onnx.data for models
// over ~2 GB, config.json, and optionally generation_config.json, tokenizer.json and
// tokenizer_config.json) into ONNX Runtime and runs forward passes for the engine.
//
// # Running
//
// Open loads a model directory on one of three attention paths (see "Attention paths"
// below); OpenDense loads it for the dense path: one ONNX Runtime session whose Forward
// runs one forward pass for a whole batch of sequences. Every runner's sessions and
// tensors are package models/ort's, which owns Conveyor's use of ONNX Runtime (InitORT
// loads the shared library once per process). The graph must follow the Hugging Face Optimum decoder
// interface, so a decoder exported by Optimum serves as is:
//
//	input_ids                 [batch, seq]                     int64
//	attention_mask            [batch, past+seq]                int64 (1 = real token)
//	position_ids              [batch, seq]                     int64
//	past_key_values.{i}.key   [batch, kv_heads, past, head_dim] float32 (and .value)
//	logits                    [batch, seq, vocab]              float32
//	present.{i}.key           [batch, kv_heads, past+seq, head_dim] (and .value)
//
// The runner does not own the KV cache; the batch carries it (see "The cache in the
// batch" below). Before the pass the runner gathers each row's past out of its blocks
// into the dense past_key_values tensors (kvcache.Storage.Gather), and afterwards it
// stores the new keys and values from present in the rows' blocks (Storage.Scatter).
//
// The interface pads every row to the batch's longest past and longest new-token
// count, so a Forward is planned (planPasses in dense_passes.go) from an estimate of each
// pass's work: one ONNX Runtime pass when the rows are alike, or a few passes over
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
// type-switch on; each runner does its own thing with the data. The paged runner hands
// the storage's arenas (LayerK, LayerV) and the block tables to the attention kernel;
// the dense runner gathers and scatters through the storage. The cache's layers, KV
// heads, head size and element type must be the model's (Spec) and each row's block
// table must cover its positions, or Forward fails with ErrBatch. A nil Cache means no
// cache: nothing is read or kept, so no row may have a past (the paged runner then
// attends over scratch blocks of its own).
//
// # Attention paths
//
// Open picks the path (RunnerOptions.Attention, `conveyor serve --attention`):
//
//   - paged (the default when the model directory has a paged/ layout, which every
//     graph Conveyor builds has): PagedRunner runs one ONNX Runtime segment per layer
//     (the previous layer's output projection and MLP, then this layer's norm and
//     q|k|v projection) over the step's tokens packed row after row, with the native
//     kernel of package models/attention between segments. The kernel reads every
//     row's past from its blocks in the batch's cache in place and writes the new keys
//     and values into their blocks, so no step copies the past and a prompt chunk next
//     to decoding rows costs only its own tokens.
//   - dense: DenseRunner, the Optimum interface above, for any ONNX decoder.
//   - graph: StepRunner runs the model's step graph (step/, modeldir.StepManifest): the
//     whole model as ONE ONNX graph and one ONNX Runtime run per step, embedding, every
//     layer with a PagedAttention node over the packed tokens of all rows (prefill chunks
//     and decode rows mixed) and the LM head over the rows' last tokens only. Each layer's
//     cache is one tensor [num_blocks, block_size, kv_heads, head_dim] bound as the node's
//     key_cache input and, the very same tensor, its key_cache_out output, so the node
//     writes the new keys and values in place. On a GPU (Open with DeviceCUDA, or
//     DeviceAuto when one loads) the graph is float16 or bfloat16 with ONNX Runtime's
//     com.microsoft.PagedAttention and the caches are device tensors (Spec.KVOnDevice: the
//     engine's storage only describes them, and block copies go through BlockCopier); on a
//     CPU the graph is float32 and its PagedAttention is Conveyor's own implementation of
//     the same contract (package models/pagedattn), over the batch's storage itself laid
//     out token-major (Spec.KVTokenMajor).
//
// Paged and dense read and write the same block layout, so a cache filled by one path is
// read by the other (the tests switch paths between steps). The graph path's layout is
// token-major, ONNX Runtime's; it keeps every layer's whole past (one layer group) and
// applies sliding windows inside the attention, so its cache is its own.
//
// On CPUs the paged path stays the default, and both are kept. Measured on a 2-core AMD
// EPYC (Zen 3, AVX2, no AVX-512), ONNX Runtime 1.29.0, Qwen2.5-0.5B shape, medians of three
// runs of BenchmarkDecodeStep* (ms per step, paged -> graph): int8 weights, one row at past
// 128 31.3 -> 32.2, 16 rows 134.7 -> 108.6, one row at past 512 36.2 -> 30.8, 16 rows 162.4
// -> 132.3; float32 weights, one row at past 128 75.9 -> 84.8, 16 rows 162 -> 167, at past
// 512 85.0 -> 71.2 and 190 -> 166. The one graph is faster with many rows and long pasts
// (one run instead of 25, and Conveyor's PagedAttention operator), but not at one row of a
// float32 model, the latency a single stream sees; its CPU operator keeps the cache in
// float32 only, where the paged path's float16 cache (the serving default) holds twice the
// tokens in the same memory; and its AVX-512 code is not yet measured on AVX-512 hardware,
// where the paged kernel was tuned. The graph path is the GPU's; CPUs run it so that CI
// holds it to the families' PyTorch fixtures and to the other paths token for token.
//
// Graphs come from the builder, package models/convert (architectures, the ONNX writer,
// safetensors), which shares no code with the runtime: the model directory is their
// only contract, described by package models/modeldir.
//
// Example:
//
//	if _, err := convert.BuildRandom("models/testdata/tiny-llama/config.json", dir, 1); err != nil {
//		return err
//	}
//	r, err := models.Open(dir, models.RunnerOptions{}) // paged: BuildRandom writes paged/
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
//		Layers: sp.NumLayers, KVHeads: sp.NumKVHeads, HeadDim: sp.HeadDim, DType: kvcache.Float32})
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
