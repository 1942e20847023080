// Package models loads, builds and runs decoder-only language models.
//
// It has two halves that meet in a model directory: model.onnx (plus
// model.onnx.data for models over ~2 GB), config.json, and optionally
// generation_config.json, tokenizer.json and tokenizer_config.json.
//
// # Running
//
// OpenRunner loads a model directory into an ONNX Runtime session (InitORT loads the
// shared library once per process) and Runner.Forward runs one forward pass for a
// whole batch of sequences. The graph must follow the Hugging Face Optimum decoder
// interface, so a decoder exported by Optimum serves as is:
//
//	input_ids                 [batch, seq]                     int64
//	attention_mask            [batch, past+seq]                int64 (1 = real token)
//	position_ids              [batch, seq]                     int64
//	past_key_values.{i}.key   [batch, kv_heads, past, head_dim] float32 (and .value)
//	logits                    [batch, seq, vocab]              float32
//	present.{i}.key           [batch, kv_heads, past+seq, head_dim] (and .value)
//
// The runner does not own the KV cache: through the KV interface the caller gathers
// each row's past into the dense past_key_values tensors before the pass and takes the
// new keys and values out of present afterwards.
//
// The interface pads every row to the batch's longest past and longest new-token
// count, so a Forward is planned (planPasses in passes.go) from an estimate of each
// pass's work: one ONNX Runtime pass when the rows are alike, or a few passes over
// groups of alike rows when one pass would be mostly padding (a prompt chunk next to
// decoding sequences) or would span more positions than the context window. A KV that
// implements RowsKV serves each group's rows directly; any other KV is gathered and
// scattered once for the whole batch.
//
// Prepare turns a Hugging Face checkpoint directory into a loadable one, building its
// graph once into a cache directory.
//
// # Building
//
// BuildLlamaONNX writes that interface for a Llama-family model (Llama, Mistral:
// RMSNorm, rotate-half rotary embeddings, grouped-query attention, SwiGLU MLP, tied or
// separate output embeddings) straight from Go: onnx.go encodes the ONNX protobuf
// messages with protowire, streaming weights to disk without a second in-memory copy,
// and builder.go lays out the graph with standard ai.onnx opset 17 operators only.
// Hugging Face linear weights ([out, in]) are stored transposed; q, k and v are one
// fused MatMul (with 1/sqrt(head_dim) folded into q), as are gate and up. The mask
// bias and the rotary cos/sin tables are computed once per pass and shared by every
// layer; grouped-query attention regroups the queries ([B, kv_heads, group*seq, d])
// instead of repeating keys and values. A key column k is visible to query j iff
// attention_mask[b,k] == 1 and k <= past + j, so padding may sit anywhere; a query
// whose keys are all hidden gets a uniform (finite) softmax, never NaN.
//
// Weights come from a checkpoint (LoadSafetensorsDir reads single or sharded
// safetensors in F32, F16 or BF16, validating every header) or from RandomWeights,
// which gives deterministic seeded weights for tests. BuildFromHF and BuildRandom
// produce complete model directories; `conveyor build-model` is their command line.
//
// Example:
//
//	if _, err := models.BuildRandom("models/testdata/tiny-llama/config.json", dir, 1); err != nil {
//		return err
//	}
//	r, err := models.OpenRunner(dir, models.DefaultRunnerOptions())
//	if err != nil {
//		return err
//	}
//	defer r.Close()
//	out, err := r.Forward(&models.Batch{Seqs: []models.SeqInput{{Tokens: []int32{1, 42, 7}}}}, nil)
//	// out.Logits[0] holds the next-token logits after the prompt.
package models
