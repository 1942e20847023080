// Package convert writes Conveyor model directories: the graph-builder half of
// Conveyor's model code (the runtime is package models).
//
// BuildLlamaONNX writes the Hugging Face Optimum decoder interface (see package models)
// straight from Go for the Llama-like families. A family is one file, family_<name>.go,
// that registers the config.json model_type values it reads (registerFamily) and
// resolves a config into the shared parameters of arch: norm style (weight or 1 +
// weight, and Gemma 2/3's four norms per layer), MLP activation, q/k/v biases, per-head
// q/k norms, embedding scale, attention scale, soft-caps of the scores and the logits,
// and per layer a sliding window and a rotary plan (rope_theta and rope_scaling, a
// local base on Gemma 3's sliding layers, none on SmolLM3's NoPE layers). It lists its
// tensors as edits of Llama's, and refuses, naming the field and value, anything the
// graphs would not compute as transformers does; absent fields take transformers'
// defaults, and a null one (a soft-cap, a window) means none where transformers reads it
// so. The registered families: llama (linear and llama3 rope scaling), mistral (sliding
// window), qwen2 (q/k/v biases), qwen3 (q/k norms), both with use_sliding_window (layers
// from max_window_layers on), gemma, gemma2, gemma3_text (and the text model of a gemma3
// checkpoint with vision), phi3 (fused projections, split into views of the
// checkpoint's memory; partial rotary; longrope within the original context) and
// smollm3. The dense graph and the step graph read only arch.
// onnx.go encodes the ONNX protobuf messages with protowire, streaming weights to disk
// without a second in-memory copy, and builder.go lays out the graph with standard
// ai.onnx opset 17 operators only. Hugging Face linear weights ([out, in]) are stored
// transposed; q, k and v are one fused MatMul (with the attention scale folded into q,
// or into the q norm's weight), as are gate and up. The mask bias (one per sliding
// window in use) and the rotary cos/sin tables (one pair per rotary plan in use) are
// computed once per pass and shared by the layers; grouped-query attention regroups the
// queries ([B, kv_heads, group*seq, d]) instead of repeating keys and values. A key
// column k is visible to query j iff attention_mask[b,k] == 1 and k <= past + j (and,
// under a window w, k's position is above j's minus w: w keys with j's own), so padding
// may sit anywhere; a query whose keys are all hidden gets a uniform (finite) softmax,
// never NaN. A soft-capped layer computes c*tanh(s/c) of the scaled scores before the
// mask, in the dense graph and in the step graph's PagedAttention alike.
//
// Weights come from a checkpoint (LoadSafetensorsDir reads single or sharded
// safetensors in F32, F16 or BF16, validating every header) or from RandomWeights,
// which gives deterministic seeded weights for tests. BuildFromHF and BuildRandom
// produce complete model directories, WriteRandomCheckpoint a Hugging Face checkpoint;
// `conveyor build-model` is their command line.
//
// Every directory also gets the step graph (step.go, step/): the same model as one graph
// over the step's tokens of every row packed without padding, each layer's attention one
// PagedAttention node that reads and writes the KV blocks in place, the logits of
// selected rows only. It is built from the same layer pieces as the dense graph, so both
// paths compute the same model. On the CPU its layers are grouped by sliding window
// (kvcache.PlanLayout), a block table input per group.
//
// With Options.Quantize (quantize.go) every linear layer, and the output projection,
// is stored quantized. int8: per output channel (one float32 scale each, symmetric),
// multiplied after each row of activations is quantized to int8 with its own scale: in
// model.onnx by ONNX Runtime's com.microsoft.MatMulIntegerToFloat (a few small ops
// before each linear; MLAS runs it on the CPU's int8 units, AMX included), in the step
// graph by one com.conveyor.Int8Linear node, Conveyor's own kernel (package
// models/kernels, registered with every session), which computes the same thing and
// ran a 0.5B-shaped decode step 1.4× (one row) to 1.8× (16 rows) faster. int4: 32
// values per block along the input axis, one float32 scale each, symmetric, through
// com.microsoft.MatMulNBits with accuracy_level 4 (int8 activations per block).
//
// Measured on a 2-core AMD EPYC with AVX512-VNNI, Qwen2.5-0.5B's shape, decode on the
// per-layer segments of earlier releases at past 128 (ms per step at batch 1 / 16 / 64, and a 512-token prefill):
//
//	int8 in 32-blocks, MatMulNBits level 4   25.5 / 90.9 / 285   1535 ms
//	int8 per tensor, DynamicQuantizeMatMul   24.5 / 49.7 / 141    817 ms
//	int8 per row, MatMulIntegerToFloat       28.9 / 58.6 / 158    845 ms
//
// and in a later session on a machine of the same class, per-row int8 through MLAS
// against Conveyor's Int8Linear: 28.4 / 85.1 / 193 against 19.9 / 46.7 / 159 ms, a
// 512-token prefill 982 against 966 ms.
//
// The blocked MatMulNBits kernel streams one row well but gains little from batching;
// MLAS's QGEMM (DynamicQuantizeMatMul, MatMulIntegerToFloat) runs 16 rows in about 2x
// one row's time and prefill 1.8x faster. DynamicQuantizeMatMul quantizes the whole
// activation tensor with one scale: a batch-mate's outliers coarsen every other row
// (logits moved by 0.3 on the default model) and its KL divergence from float32 was
// 8x the per-row variant's (0.0048 vs 0.0006; perplexity +0.76% vs +0.06%). Per-row
// scales cost a few small operators per linear and keep every row's result its own.
// The embedding table stays float32 for the lookup, which reads one row per token; a
// tied head multiplies by a quantized copy of it.
//
// Prepare turns a Hugging Face checkpoint directory into a loadable one, building its
// graph once into a cache directory the caller names (the commands take it from
// $CONVEYOR_CACHE_DIR; the package itself reads no environment).
//
// Example:
//
//	res, err := convert.BuildFromHF("checkpoints/llama", "build/llama", convert.Options{})
//	if err != nil {
//		return err
//	}
//	fmt.Println(res.Params, "parameters written to", res.Files[0])
package convert
