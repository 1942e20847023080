package build

import (
	"errors"
	"fmt"
	"math"
	"os"
)

// ErrBadWeights marks a checkpoint whose tensors are missing or do not match config.json.
var ErrBadWeights = errors.New("build: weights do not match the config")

// Names of the decoder interface's inputs and outputs (Hugging Face Optimum).
const (
	InputIDsName      = "input_ids"
	AttentionMaskName = "attention_mask"
	PositionIDsName   = "position_ids"
	LogitsName        = "logits"
)

// PastKeyName returns the name of layer's past key input, past_key_values.{layer}.key.
func PastKeyName(layer int) string { return fmt.Sprintf("past_key_values.%d.key", layer) }

// PastValueName returns the name of layer's past value input.
func PastValueName(layer int) string { return fmt.Sprintf("past_key_values.%d.value", layer) }

// PresentKeyName returns the name of layer's present key output, present.{layer}.key.
func PresentKeyName(layer int) string { return fmt.Sprintf("present.%d.key", layer) }

// PresentValueName returns the name of layer's present value output.
func PresentValueName(layer int) string { return fmt.Sprintf("present.%d.value", layer) }

// maskBias is added to the attention scores of hidden keys. It is finite so that a
// row whose keys are all hidden (a padding query) gives a uniform softmax, not NaN.
const maskBias = -1e9

// BuildLlamaONNX writes outDir/model.onnx (and outDir/model.onnx.data when the weights
// exceed what a protobuf can hold) computing a Llama-family decoder with the Hugging
// Face Optimum interface: inputs input_ids, attention_mask, position_ids and
// past_key_values.{i}.key/value; outputs logits and present.{i}.key/value, keys and
// values in float32. w holds the Hugging Face parameter names; it is not modified.
func BuildLlamaONNX(cfg *Config, w Weights, outDir string) error {
	return buildLlamaONNX(cfg, w, outDir, writeOptions{})
}

func buildLlamaONNX(cfg *Config, w Weights, outDir string, opts writeOptions) error {
	m, err := llamaGraph(cfg, w)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fmt.Errorf("models: %w", err)
	}
	_, err = writeONNXModel(m, outDir, "model.onnx", opts)
	return err
}

// llamaDims are the sizes the graph is built from.
type llamaDims struct {
	vocab, hidden, inter, layers, heads, kvHeads, headDim int
}

func dimsOf(cfg *Config) llamaDims {
	return llamaDims{
		vocab: cfg.VocabSize, hidden: cfg.HiddenSize, inter: cfg.IntermediateSize,
		layers: cfg.NumHiddenLayers, heads: cfg.NumAttentionHeads, kvHeads: cfg.KVHeads(),
		headDim: cfg.HeadDimOrDefault(),
	}
}

// llamaGraph builds the ONNX model for cfg and w.
//
// Per layer the graph does, on hidden states x [B,S,H]:
//
//	h = RMSNorm(x); qkv = h @ Wqkv (q, k, v projections fused, q pre-scaled by 1/sqrt(d))
//	q, k = RoPE(q, k) computed on the [B,S,heads+kvHeads,d] block at once
//	present = Concat(past, k|v) on the token axis
//	q is regrouped to [B,kvHeads,group*S,d] so grouped-query attention needs no copy of K/V
//	x += softmax(q k^T + mask) v @ Wo;  x += down(silu(gate(h)) * up(h)) with gate|up fused
//
// The mask bias [B,1,group*S,T] and the rotary cos/sin [B,S,1,d] are computed once.
func llamaGraph(cfg *Config, w Weights) (*onnxModel, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkLlamaFeatures(cfg); err != nil {
		return nil, err
	}
	d := dimsOf(cfg)
	if err := checkLlamaWeights(cfg, w); err != nil {
		return nil, err
	}
	H, D, NH, KV, V := int64(d.hidden), int64(d.headDim), int64(d.heads), int64(d.kvHeads), int64(d.vocab)
	group := NH / KV

	b := newGraphBuilder("llama")
	batch, seq, past, total := symDim("batch_size"), symDim("sequence_length"), symDim("past_sequence_length"), symDim("total_sequence_length")
	ids := b.input(InputIDsName, onnxInt64, batch, seq)
	mask := b.input(AttentionMaskName, onnxInt64, batch, total)
	pos := b.input(PositionIDsName, onnxInt64, batch, seq)
	for i := 0; i < d.layers; i++ {
		b.input(PastKeyName(i), onnxFloat, batch, fixDim(d.kvHeads), past, fixDim(d.headDim))
		b.input(PastValueName(i), onnxFloat, batch, fixDim(d.kvHeads), past, fixDim(d.headDim))
	}
	b.output(LogitsName, onnxFloat, batch, seq, fixDim(d.vocab))
	for i := 0; i < d.layers; i++ {
		b.output(PresentKeyName(i), onnxFloat, batch, fixDim(d.kvHeads), total, fixDim(d.headDim))
		b.output(PresentValueName(i), onnxFloat, batch, fixDim(d.kvHeads), total, fixDim(d.headDim))
	}

	// Embedding.
	embed := b.weight("model.embed_tokens.weight", []int64{V, H}, w["model.embed_tokens.weight"].Data)
	x := b.op("Gather", []string{embed, ids}, attrI("axis", 0))

	// Rotary tables: angle[b,s,0,j] = position[b,s] * invFreq[j mod d/2]; the sign of
	// rotate_half is folded into sin so that rotate_half(x)*sin = swap(x)*sinSigned.
	invFreq := make([]float32, D)
	sign := make([]float32, D)
	for j, f := range ropeInvFreq(cfg, d.headDim) {
		invFreq[j], invFreq[j+d.headDim/2] = f, f
		sign[j], sign[j+d.headDim/2] = -1, 1
	}
	posF := b.op("Cast", []string{pos}, attrI("to", int64(onnxFloat)))
	posU := b.op("Unsqueeze", []string{posF, b.ints(2, 3)}) // [B,S,1,1]
	angle := b.op("Mul", []string{posU, b.weight("rope.inv_freq", []int64{D}, invFreq)})
	cos := b.op("Cos", []string{angle})
	sinSigned := b.op("Mul", []string{b.op("Sin", []string{angle}), b.weight("rope.sign", []int64{D}, sign)})

	// Attention bias [B,1,S,T]: key k is visible to query j iff attention_mask[b,k] != 0
	// and k <= past + j.
	scalar := func(v int64) string { return b.constInt64(nil, v) }
	seqLen := b.op("Gather", []string{b.op("Shape", []string{ids}), scalar(1)}, attrI("axis", 0))
	pastLen := b.op("Gather", []string{b.op("Shape", []string{PastKeyName(0)}), scalar(2)}, attrI("axis", 0))
	totalLen := b.op("Gather", []string{b.op("Shape", []string{mask}), scalar(1)}, attrI("axis", 0))
	keyIdx := b.op("Range", []string{scalar(0), totalLen, scalar(1)})
	lastVisible := b.op("Add", []string{b.op("Range", []string{scalar(0), seqLen, scalar(1)}), pastLen})
	causal := b.op("LessOrEqual", []string{keyIdx, b.op("Unsqueeze", []string{lastVisible, b.ints(1)})})
	maskBool := b.op("Cast", []string{mask}, attrI("to", int64(onnxBool)))
	visible := b.op("And", []string{causal, b.op("Unsqueeze", []string{maskBool, b.ints(1, 2)})})
	bias := b.op("Where", []string{visible, b.constFloat32(nil, 0), b.constFloat32(nil, maskBias)})
	if group > 1 {
		// Scores are laid out [B,KV,group*S,T] (row g*S+s is query s of the group's
		// head g), so the bias is repeated group times along the query axis.
		bias = b.op("Tile", []string{bias, b.ints(1, 1, group, 1)})
	}

	for i := 0; i < d.layers; i++ {
		b.prefix = fmt.Sprintf("l%d_", i)

		// Attention block.
		qkv := attentionInput(b, cfg, w, d, i, x)
		qkv = b.op("Reshape", []string{qkv, b.ints(0, 0, NH+2*KV, D)})
		qkAndV := b.opN("Split", 2, []string{qkv, b.ints(NH+KV, KV)}, attrI("axis", 2))
		qk, v := qkAndV[0], qkAndV[1]
		halves := b.opN("Split", 2, []string{qk, b.ints(D/2, D/2)}, attrI("axis", 3))
		swapped := b.op("Concat", []string{halves[1], halves[0]}, attrI("axis", 3))
		qk = b.op("Add", []string{b.op("Mul", []string{qk, cos}), b.op("Mul", []string{swapped, sinSigned})})
		qAndK := b.opN("Split", 2, []string{qk, b.ints(NH, KV)}, attrI("axis", 2))
		toHeads := attrIntList("perm", 0, 2, 1, 3)
		q := b.op("Transpose", []string{qAndK[0]}, toHeads) // [B,NH,S,D]
		k := b.op("Transpose", []string{qAndK[1]}, toHeads) // [B,KV,S,D]
		v = b.op("Transpose", []string{v}, toHeads)
		presentK := b.opTo(PresentKeyName(i), "Concat", []string{PastKeyName(i), k}, attrI("axis", 2))
		presentV := b.opTo(PresentValueName(i), "Concat", []string{PastValueName(i), v}, attrI("axis", 2))
		if group > 1 {
			q = b.op("Reshape", []string{q, b.ints(0, KV, -1, D)}) // [B,KV,group*S,D]
		}
		kT := b.op("Transpose", []string{presentK}, attrIntList("perm", 0, 1, 3, 2))
		scores := b.op("MatMul", []string{q, kT}) // [B,KV,group*S,T]
		probs := b.op("Softmax", []string{b.op("Add", []string{scores, bias})}, attrI("axis", -1))
		att := b.op("MatMul", []string{probs, presentV}) // [B,KV,group*S,D]
		if group > 1 {
			att = b.op("Reshape", []string{att, b.ints(0, NH, -1, D)})
		}
		att = b.op("Transpose", []string{att}, toHeads) // [B,S,NH,D]
		att = b.op("Reshape", []string{att, b.ints(0, 0, NH*D)})
		x = attentionOutputAndMLP(b, cfg, w, d, i, x, att)
	}
	b.prefix = "final_"
	x = finalNorm(b, cfg, w, d, x)
	if tiedHead(cfg, w) {
		// Tied embeddings: Gemm with transB reads the embedding table as is.
		outShape := b.op("Concat", []string{b.op("Shape", []string{ids}), b.ints(V)}, attrI("axis", 0))
		flat := b.op("Reshape", []string{x, b.ints(-1, H)})
		logits := b.op("Gemm", []string{flat, embed}, attrI("transB", 1))
		b.opTo(LogitsName, "Reshape", []string{logits, outShape})
	} else {
		b.opTo(LogitsName, "MatMul", []string{x, untiedHead(b, w, d)})
	}
	return &onnxModel{
		IRVersion:    onnxIRVersion,
		Opsets:       []onnxOpsetID{{Domain: "", Version: onnxOpset}},
		ProducerName: "conveyor",
		DocString:    "Llama-family decoder with the Hugging Face Optimum past_key_values interface",
		Graph:        b.g,
	}, nil
}

// rmsNorm appends x * 1/sqrt(mean(x^2) + eps) * weight over the last axis, in the node
// pattern ONNX Runtime fuses into one SimplifiedLayerNormalization kernel.
func rmsNorm(b *graphBuilder, x, weight string, eps float32) string {
	sq := b.op("Pow", []string{x, b.constFloat32(nil, 2)})
	mean := b.op("ReduceMean", []string{sq}, attrIntList("axes", -1), attrI("keepdims", 1))
	std := b.op("Sqrt", []string{b.op("Add", []string{mean, b.constFloat32(nil, eps)})})
	return b.op("Mul", []string{b.op("Div", []string{x, std}), weight})
}

// attentionInput appends layer i's input RMSNorm and fused q|k|v projection on the
// residual stream x [..., H] and returns qkv [..., (heads+2*kvHeads)*headDim], the
// queries pre-scaled by 1/sqrt(headDim). The dense graph and the paged segments share
// it, so both compute (and store) the same weights.
func attentionInput(b *graphBuilder, cfg *Config, w Weights, d llamaDims, i int, x string) string {
	p := fmt.Sprintf("model.layers.%d.", i)
	H, D, NH, KV := int64(d.hidden), int64(d.headDim), int64(d.heads), int64(d.kvHeads)
	h := rmsNorm(b, x, b.weight(p+"input_layernorm.weight", []int64{H}, w[p+"input_layernorm.weight"].Data), float32(cfg.Eps()))
	scale := float32(1 / math.Sqrt(float64(D)))
	wqkv := transposedWeight(b, p+"self_attn.qkv_proj.weight_t", H, (NH+2*KV)*D, []projection{
		{w[p+"self_attn.q_proj.weight"].Data, scale},
		{w[p+"self_attn.k_proj.weight"].Data, 1},
		{w[p+"self_attn.v_proj.weight"].Data, 1},
	})
	return b.op("MatMul", []string{h, wqkv})
}

// attentionOutputAndMLP appends layer i's output projection of the attention result
// att [..., heads*headDim], the residual add, and the MLP block with its residual add;
// it returns the new residual stream.
func attentionOutputAndMLP(b *graphBuilder, cfg *Config, w Weights, d llamaDims, i int, x, att string) string {
	p := fmt.Sprintf("model.layers.%d.", i)
	H, D, NH, I := int64(d.hidden), int64(d.headDim), int64(d.heads), int64(d.inter)
	wo := transposedWeight(b, p+"self_attn.o_proj.weight_t", NH*D, H, []projection{{w[p+"self_attn.o_proj.weight"].Data, 1}})
	x = b.op("Add", []string{x, b.op("MatMul", []string{att, wo})})

	h := rmsNorm(b, x, b.weight(p+"post_attention_layernorm.weight", []int64{H}, w[p+"post_attention_layernorm.weight"].Data), float32(cfg.Eps()))
	wgu := transposedWeight(b, p+"mlp.gate_up_proj.weight_t", H, 2*I, []projection{
		{w[p+"mlp.gate_proj.weight"].Data, 1},
		{w[p+"mlp.up_proj.weight"].Data, 1},
	})
	gu := b.op("MatMul", []string{h, wgu})
	gateUp := b.opN("Split", 2, []string{gu, b.ints(I, I)}, attrI("axis", -1))
	act := b.op("Mul", []string{gateUp[0], b.op("Sigmoid", []string{gateUp[0]})})
	act = b.op("Mul", []string{act, gateUp[1]})
	wd := transposedWeight(b, p+"mlp.down_proj.weight_t", I, H, []projection{{w[p+"mlp.down_proj.weight"].Data, 1}})
	return b.op("Add", []string{x, b.op("MatMul", []string{act, wd})})
}

// finalNorm appends the model's last RMSNorm.
func finalNorm(b *graphBuilder, cfg *Config, w Weights, d llamaDims, x string) string {
	return rmsNorm(b, x, b.weight("model.norm.weight", []int64{int64(d.hidden)}, w["model.norm.weight"].Data), float32(cfg.Eps()))
}

// tiedHead reports whether the output projection is the embedding table.
func tiedHead(cfg *Config, w Weights) bool {
	_, ok := w["lm_head.weight"]
	return !ok || cfg.TieWordEmbeddings
}

// untiedHead adds lm_head.weight transposed ([hidden, vocab]).
func untiedHead(b *graphBuilder, w Weights, d llamaDims) string {
	return transposedWeight(b, "lm_head.weight_t", int64(d.hidden), int64(d.vocab), []projection{{w["lm_head.weight"].Data, 1}})
}

// ropeInvFreq returns the rotary inverse frequencies 1/theta^(2j/headDim), j < headDim/2.
func ropeInvFreq(cfg *Config, headDim int) []float32 {
	f := make([]float32, headDim/2)
	for j := range f {
		exp := float32(2*j) / float32(headDim) // as Hugging Face: arange(0, d, 2).float() / d
		f[j] = float32(1 / math.Pow(cfg.Theta(), float64(exp)))
	}
	return f
}

// projection is one Hugging Face linear weight [out, in] and a factor applied to it.
type projection struct {
	w     []float32
	scale float32
}

// transposedWeight adds the [in, out] initializer name holding the projections
// transposed side by side (see concatTransposed); it is computed when the model is
// written, so only one transposed copy is in memory at a time.
func transposedWeight(b *graphBuilder, name string, in, out int64, ps []projection) string {
	return b.weightGen(name, []int64{in, out}, func() []float32 { return concatTransposed(int(in), ps) })
}

// concatTransposed returns the [in, sum(out)] row-major matrix whose columns are the
// projections' rows, scaled, side by side: x @ result computes all of them at once.
func concatTransposed(in int, ps []projection) []float32 {
	total := 0
	for _, p := range ps {
		total += len(p.w) / in
	}
	dst := make([]float32, in*total)
	col := 0
	const tile = 32 // transpose in tiles so that reads and writes both stay in cache
	for _, p := range ps {
		out := len(p.w) / in
		for o0 := 0; o0 < out; o0 += tile {
			o1 := min(o0+tile, out)
			for r0 := 0; r0 < in; r0 += tile {
				r1 := min(r0+tile, in)
				for o := o0; o < o1; o++ {
					row := p.w[o*in : o*in+r1]
					for r := r0; r < r1; r++ {
						dst[r*total+col+o] = row[r] * p.scale
					}
				}
			}
		}
		col += out
	}
	return dst
}

// checkLlamaFeatures rejects config options the graph does not implement.
func checkLlamaFeatures(cfg *Config) error {
	if len(cfg.RopeScaling) > 0 && string(cfg.RopeScaling) != "null" {
		return fmt.Errorf("%w: rope_scaling %s is not supported by the graph builder", ErrBadConfig, truncateForError(cfg.RopeScaling))
	}
	if cfg.AttentionBias || cfg.MLPBias {
		return fmt.Errorf("%w: attention_bias/mlp_bias are not supported by the graph builder", ErrBadConfig)
	}
	if cfg.HiddenAct != "" && cfg.HiddenAct != "silu" {
		return fmt.Errorf("%w: hidden_act %q is not supported (want silu)", ErrBadConfig, cfg.HiddenAct)
	}
	return nil
}

// LlamaWeightShapes returns every tensor a Llama checkpoint for cfg holds, by Hugging
// Face name, with its shape. lm_head.weight is absent when the embeddings are tied.
func LlamaWeightShapes(cfg *Config) map[string][]int {
	H, I, V := cfg.HiddenSize, cfg.IntermediateSize, cfg.VocabSize
	D, NH, KV := cfg.HeadDimOrDefault(), cfg.NumAttentionHeads, cfg.KVHeads()
	s := map[string][]int{
		"model.embed_tokens.weight": {V, H},
		"model.norm.weight":         {H},
	}
	if !cfg.TieWordEmbeddings {
		s["lm_head.weight"] = []int{V, H}
	}
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		s[p+"input_layernorm.weight"] = []int{H}
		s[p+"post_attention_layernorm.weight"] = []int{H}
		s[p+"self_attn.q_proj.weight"] = []int{NH * D, H}
		s[p+"self_attn.k_proj.weight"] = []int{KV * D, H}
		s[p+"self_attn.v_proj.weight"] = []int{KV * D, H}
		s[p+"self_attn.o_proj.weight"] = []int{H, NH * D}
		s[p+"mlp.gate_proj.weight"] = []int{I, H}
		s[p+"mlp.up_proj.weight"] = []int{I, H}
		s[p+"mlp.down_proj.weight"] = []int{H, I}
	}
	return s
}

// checkLlamaWeights verifies that w holds every tensor cfg needs with the right shape
// and data length, and no bias tensors the graph would silently ignore.
func checkLlamaWeights(cfg *Config, w Weights) error {
	want := LlamaWeightShapes(cfg)
	if !cfg.TieWordEmbeddings {
		// Some checkpoints leave lm_head out even without tie_word_embeddings.
		if _, ok := w["lm_head.weight"]; !ok {
			return fmt.Errorf("%w: lm_head.weight is missing and tie_word_embeddings is false", ErrBadWeights)
		}
	}
	for _, name := range sortedKeys(want) {
		t, ok := w[name]
		if !ok || t == nil {
			return fmt.Errorf("%w: tensor %s is missing", ErrBadWeights, name)
		}
		if !equalInts(t.Shape, want[name]) {
			return fmt.Errorf("%w: tensor %s has shape %v, config.json implies %v", ErrBadWeights, name, t.Shape, want[name])
		}
		if len(t.Data) != t.NumElements() {
			return fmt.Errorf("%w: tensor %s has shape %v but %d values", ErrBadWeights, name, t.Shape, len(t.Data))
		}
	}
	for name := range w {
		if len(name) > 5 && name[len(name)-5:] == ".bias" {
			return fmt.Errorf("%w: tensor %s is a bias, which Llama graphs do not have", ErrBadWeights, name)
		}
	}
	return nil
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
