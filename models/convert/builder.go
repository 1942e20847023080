package convert

import (
	"errors"
	"fmt"
	"math"
	"os"
)

// ErrBadWeights marks a checkpoint whose tensors are missing or do not match config.json.
var ErrBadWeights = errors.New("convert: weights do not match the config")

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
	m, err := denseGraph(cfg, w, Quantization{})
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

// denseGraph builds the dense graph for cfg and w: model.onnx, the Hugging Face Optimum
// interface (stepGraph builds the step graph).
//
// Per layer the graph does, on hidden states x [B,S,H]:
//
//	h = RMSNorm(x); qkv = h @ Wqkv (+ bias) (q, k, v projections fused, q pre-scaled by the attention scale)
//	q, k = per-head RMSNorm (Qwen3, Gemma 3), then the layer's RoPE on the [B,S,heads+kvHeads,d] block at once
//	present = Concat(past, k|v) on the token axis
//	q is regrouped to [B,kvHeads,group*S,d] so grouped-query attention needs no copy of K/V
//	s = q k^T (soft-capped: c*tanh(s/c)); x += softmax(s + mask) v @ Wo (normalized first: Gemma 2/3)
//	x += down(act(gate(h)) * up(h)) with gate|up fused, h = RMSNorm(x) (and the output normalized: Gemma 2/3)
//
// The mask bias [B,1,group*S,T] (one per sliding window in use) and the rotary cos/sin
// [B,S,1,rotary dims] (one pair per rotary plan in use) are computed once; the logits
// are soft-capped when the family says so.
func denseGraph(cfg *Config, w Weights, q Quantization) (*onnxModel, error) {
	m, err := planModel(cfg, w, q)
	if err != nil {
		return nil, err
	}
	H, D, NH, KV, V := int64(m.hidden), int64(m.headDim), int64(m.heads), int64(m.kvHeads), int64(m.vocab)
	group := NH / KV

	b := newGraphBuilder("llama")
	batch, seq, past, total := symDim("batch_size"), symDim("sequence_length"), symDim("past_sequence_length"), symDim("total_sequence_length")
	ids := b.input(InputIDsName, onnxInt64, batch, seq)
	mask := b.input(AttentionMaskName, onnxInt64, batch, total)
	pos := b.input(PositionIDsName, onnxInt64, batch, seq)
	for i := 0; i < m.layers; i++ {
		b.input(PastKeyName(i), onnxFloat, batch, fixDim(m.kvHeads), past, fixDim(m.headDim))
		b.input(PastValueName(i), onnxFloat, batch, fixDim(m.kvHeads), past, fixDim(m.headDim))
	}
	b.output(LogitsName, onnxFloat, batch, seq, fixDim(m.vocab))
	for i := 0; i < m.layers; i++ {
		b.output(PresentKeyName(i), onnxFloat, batch, fixDim(m.kvHeads), total, fixDim(m.headDim))
		b.output(PresentValueName(i), onnxFloat, batch, fixDim(m.kvHeads), total, fixDim(m.headDim))
	}

	// Embedding.
	embed := b.weight("model.embed_tokens.weight", []int64{V, H}, m.w["model.embed_tokens.weight"].Data)
	x := scaleEmbeddings(b, m, b.op("Gather", []string{embed, ids}, attrI("axis", 0)))

	// Rotary tables, one pair per plan in use (layers share them).
	type tables struct{ cos, sinSigned string }
	rotaries := map[*rotaryPlan]tables{}
	rotaryFor := func(rot *rotaryPlan) tables {
		t, ok := rotaries[rot]
		if !ok {
			t.cos, t.sinSigned = rotaryTables(b, pos, rot, len(rotaries))
			rotaries[rot] = t
		}
		return t
	}

	// Attention bias [B,1,S,T]: key k is visible to query j iff attention_mask[b,k] != 0
	// and k <= past + j (and, under a sliding window w, the key's position is above the
	// query's minus w: keys are numbered by the mask's running count, since the past is
	// right-padded).
	scalar := func(v int64) string { return b.constInt64(nil, v) }
	seqLen := b.op("Gather", []string{b.op("Shape", []string{ids}), scalar(1)}, attrI("axis", 0))
	pastLen := b.op("Gather", []string{b.op("Shape", []string{PastKeyName(0)}), scalar(2)}, attrI("axis", 0))
	totalLen := b.op("Gather", []string{b.op("Shape", []string{mask}), scalar(1)}, attrI("axis", 0))
	keyIdx := b.op("Range", []string{scalar(0), totalLen, scalar(1)})
	lastVisible := b.op("Add", []string{b.op("Range", []string{scalar(0), seqLen, scalar(1)}), pastLen})
	causal := b.op("LessOrEqual", []string{keyIdx, b.op("Unsqueeze", []string{lastVisible, b.ints(1)})})
	maskBool := b.op("Cast", []string{mask}, attrI("to", int64(onnxBool)))
	visible := b.op("And", []string{causal, b.op("Unsqueeze", []string{maskBool, b.ints(1, 2)})})
	toBias := func(visible string) string {
		bias := b.op("Where", []string{visible, b.constFloat32(nil, 0), b.constFloat32(nil, maskBias)})
		if group > 1 {
			// Scores are laid out [B,KV,group*S,T] (row g*S+s is query s of the group's
			// head g), so the bias is repeated group times along the query axis.
			bias = b.op("Tile", []string{bias, b.ints(1, 1, group, 1)})
		}
		return bias
	}
	biases := map[int]string{0: toBias(visible)}
	var keyPos string
	biasFor := func(window int) string {
		if bias, ok := biases[window]; ok {
			return bias
		}
		if keyPos == "" {
			keyPos = b.op("Sub", []string{b.op("CumSum", []string{mask, scalar(1)}), scalar(1)}) // [B,T]
		}
		lowest := b.op("Sub", []string{pos, scalar(int64(window))})                          // [B,S]
		inWindow := b.op("Greater", []string{b.op("Unsqueeze", []string{keyPos, b.ints(1)}), // [B,1,T]
			b.op("Unsqueeze", []string{lowest, b.ints(2)})}) // [B,S,1]
		vis := b.op("And", []string{visible, b.op("Unsqueeze", []string{inWindow, b.ints(1)})}) // [B,1,S,T]
		biases[window] = toBias(vis)
		return biases[window]
	}

	for i := 0; i < m.layers; i++ {
		b.prefix = fmt.Sprintf("l%d_", i)

		// Attention block.
		qkv := attentionInput(b, m, i, x)
		qkv = b.op("Reshape", []string{qkv, b.ints(0, 0, NH+2*KV, D)})
		qkAndV := b.opN("Split", 2, []string{qkv, b.ints(NH+KV, KV)}, attrI("axis", 2))
		qk, v := qkAndV[0], qkAndV[1]
		if rot := m.arch.rotary[i]; rot.dims > 0 {
			t := rotaryFor(rot)
			qk = applyRotary(b, qk, t.cos, t.sinSigned, int64(rot.dims), D)
		}
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
		scores := softcapped(b, b.op("MatMul", []string{q, kT}), m.arch.attnSoftcap) // [B,KV,group*S,T]
		probs := b.op("Softmax", []string{b.op("Add", []string{scores, biasFor(m.arch.window[i])})}, attrI("axis", -1))
		att := b.op("MatMul", []string{probs, presentV}) // [B,KV,group*S,D]
		if group > 1 {
			att = b.op("Reshape", []string{att, b.ints(0, NH, -1, D)})
		}
		att = b.op("Transpose", []string{att}, toHeads) // [B,S,NH,D]
		att = b.op("Reshape", []string{att, b.ints(0, 0, NH*D)})
		x = attentionOutputAndMLP(b, m, i, x, att)
	}
	b.prefix = "final_"
	x = finalNorm(b, m, x)
	if tiedHead(m.cfg, m.w) {
		outShape := b.op("Concat", []string{b.op("Shape", []string{ids}), b.ints(V)}, attrI("axis", 0))
		flat := b.op("Reshape", []string{x, b.ints(-1, H)})
		logits := softcapped(b, tiedHeadLogits(b, m, flat, embed), m.arch.finalSoftcap)
		b.opTo(LogitsName, "Reshape", []string{logits, outShape})
	} else {
		b.opTo(LogitsName, "Identity", []string{softcapped(b, untiedHead(b, m, x), m.arch.finalSoftcap)})
	}
	return &onnxModel{
		IRVersion:    onnxIRVersion,
		Opsets:       b.opsets(),
		ProducerName: "conveyor",
		DocString:    fmt.Sprintf("%s decoder with the Hugging Face Optimum past_key_values interface", modelTypeOrLlama(cfg)),
		Graph:        b.g,
	}, nil
}

// modelTypeOrLlama returns cfg's model_type, "llama" when config.json names none.
func modelTypeOrLlama(cfg *Config) string {
	if cfg.ModelType == "" {
		return "llama"
	}
	return cfg.ModelType
}

// rotaryTables appends the cos and sin tables [B,S,1,dims] of rot at positions pos
// [B,S]: angle[b,s,0,j] = position[b,s] * invFreq[j mod dims/2]; the sign of
// rotate_half is folded into sin so that rotate_half(x)*sin = swap(x)*sinSigned, and
// longrope's attention factor into both. k numbers the plan's initializers.
func rotaryTables(b *graphBuilder, pos string, rot *rotaryPlan, k int) (cos, sinSigned string) {
	R := int64(rot.dims)
	invFreq := make([]float32, R)
	sign := make([]float32, R)
	for j, f := range rot.invFreq {
		invFreq[j], invFreq[j+rot.dims/2] = f, f
		sign[j], sign[j+rot.dims/2] = -1, 1
	}
	name := "rope"
	if k > 0 {
		name = fmt.Sprintf("rope%d", k)
	}
	posF := b.op("Cast", []string{pos}, attrI("to", int64(onnxFloat)))
	posU := b.op("Unsqueeze", []string{posF, b.ints(2, 3)}) // [B,S,1,1]
	angle := b.op("Mul", []string{posU, b.weight(name+".inv_freq", []int64{R}, invFreq)})
	if rot.factor != 1 { // longrope's attention factor scales cos and sin
		for j := range sign {
			sign[j] *= rot.factor
		}
	}
	cos = b.op("Cos", []string{angle})
	if rot.factor != 1 {
		cos = b.op("Mul", []string{cos, b.constFloat32(nil, rot.factor)})
	}
	sinSigned = b.op("Mul", []string{b.op("Sin", []string{angle}), b.weight(name+".sign", []int64{R}, sign)})
	return cos, sinSigned
}

// softcapped appends c * tanh(x / c), or returns x when c is 0.
func softcapped(b *graphBuilder, x string, c float32) string {
	if c == 0 {
		return x
	}
	t := b.op("Tanh", []string{b.op("Div", []string{x, b.constFloat32(nil, c)})})
	return b.op("Mul", []string{t, b.constFloat32(nil, c)})
}

// applyRotary turns the first R of the D dims of every head of qk [..., heads, D]
// (rotate-half layout) by the angles in cos and sinSigned [..., 1, R]; the other
// D-R dims pass through (partial rotary).
func applyRotary(b *graphBuilder, qk, cos, sinSigned string, R, D int64) string {
	rotated, pass := qk, ""
	if R < D {
		parts := b.opN("Split", 2, []string{qk, b.ints(R, D-R)}, attrI("axis", -1))
		rotated, pass = parts[0], parts[1]
	}
	halves := b.opN("Split", 2, []string{rotated, b.ints(R/2, R/2)}, attrI("axis", -1))
	swapped := b.op("Concat", []string{halves[1], halves[0]}, attrI("axis", -1))
	rotated = b.op("Add", []string{b.op("Mul", []string{rotated, cos}), b.op("Mul", []string{swapped, sinSigned})})
	if pass == "" {
		return rotated
	}
	return b.op("Concat", []string{rotated, pass}, attrI("axis", -1))
}

// scaleEmbeddings multiplies the looked-up embeddings by the architecture's factor
// (Gemma: sqrt(hidden), in float32 as the model computes in float32).
func scaleEmbeddings(b *graphBuilder, m *modelPlan, x string) string {
	if m.arch.embedScale == 0 {
		return x
	}
	return b.op("Mul", []string{x, b.constFloat32(nil, m.arch.embedScale)})
}

// rmsNorm appends x * 1/sqrt(mean(x^2) + eps) * weight over the last axis as one
// SimplifiedLayerNormalization node (ONNX Runtime's RMSNorm kernel, on the CPU and on
// CUDA) with stash_type 1: the mean of squares is computed in float32 whatever the
// graph's float type, so a float16 or bfloat16 graph does not overflow squaring an
// activation above 256 as a Pow/ReduceMean chain in float16 would.
func rmsNorm(b *graphBuilder, x, weight string, eps float32) string {
	return b.op("SimplifiedLayerNormalization", []string{x, weight},
		attrI("axis", -1), attrF("epsilon", eps), attrI("stash_type", 1))
}

// norm appends the RMSNorm whose weight is the tensor name: times (offset + weight)
// for architectures with an offset (Gemma), times scale (which folds the attention
// scale into Qwen3's q_norm).
func norm(b *graphBuilder, m *modelPlan, x, name string, scale float32) string {
	t := m.w[name]
	eps := float32(m.cfg.Eps())
	offset := m.arch.normOffset
	if offset == 0 && scale == 1 {
		return rmsNorm(b, x, b.weight(name, []int64{int64(len(t.Data))}, t.Data), eps)
	}
	weight := b.weightGen(name+"_folded", []int64{int64(len(t.Data))}, func(dst []float32) {
		for i, v := range t.Data {
			dst[i] = (offset + v) * scale
		}
	})
	return rmsNorm(b, x, weight, eps)
}

// attentionInput appends layer i's input RMSNorm and fused q|k|v projection (with
// its biases, and Qwen3's per-head q/k norms) on the residual stream x [..., H] and
// returns qkv [..., (heads+2*kvHeads)*headDim], the queries pre-scaled by
// the attention scale (1/sqrt(headDim) or the family's). The dense graph and the step graph share it, so both compute
// (and store) the same weights.
func attentionInput(b *graphBuilder, m *modelPlan, i int, x string) string {
	p := fmt.Sprintf("model.layers.%d.", i)
	H, D, NH, KV := int64(m.hidden), int64(m.headDim), int64(m.heads), int64(m.kvHeads)
	h := norm(b, m, x, p+"input_layernorm.weight", 1)
	scale := m.arch.queryScale
	qScale := scale
	if m.arch.qkNorm {
		qScale = 1 // RMSNorm would undo it: the q norm's weight carries it instead
	}
	qkv := linear(b, m, h, p+"self_attn.qkv_proj.weight", H, (NH+2*KV)*D, []projection{
		proj(m.w[p+"self_attn.q_proj.weight"], qScale),
		proj(m.w[p+"self_attn.k_proj.weight"], 1),
		proj(m.w[p+"self_attn.v_proj.weight"], 1),
	})
	if m.arch.qkvBias {
		bias := b.weightGen(p+"self_attn.qkv_proj.bias", []int64{(NH + 2*KV) * D}, func(dst []float32) {
			q := m.w[p+"self_attn.q_proj.bias"].Data
			for j, v := range q {
				dst[j] = v * qScale
			}
			n := copy(dst[len(q):], m.w[p+"self_attn.k_proj.bias"].Data)
			copy(dst[len(q)+n:], m.w[p+"self_attn.v_proj.bias"].Data)
		})
		qkv = b.op("Add", []string{qkv, bias})
	}
	if m.arch.qkNorm {
		heads := b.op("Reshape", []string{qkv, b.ints(-1, NH+2*KV, D)})
		parts := b.opN("Split", 3, []string{heads, b.ints(NH, KV, KV)}, attrI("axis", 1))
		q := norm(b, m, parts[0], p+"self_attn.q_norm.weight", scale)
		k := norm(b, m, parts[1], p+"self_attn.k_norm.weight", 1)
		heads = b.op("Concat", []string{q, k, parts[2]}, attrI("axis", 1))
		qkv = b.op("Reshape", []string{heads, b.op("Shape", []string{qkv})})
	}
	return qkv
}

// attentionOutputAndMLP appends layer i's output projection of the attention result
// att [..., heads*headDim], the residual add, and the MLP block with its residual add;
// it returns the new residual stream.
func attentionOutputAndMLP(b *graphBuilder, m *modelPlan, i int, x, att string) string {
	p := fmt.Sprintf("model.layers.%d.", i)
	H, D, NH, I := int64(m.hidden), int64(m.headDim), int64(m.heads), int64(m.inter)
	o := linear(b, m, att, p+"self_attn.o_proj.weight", NH*D, H, []projection{proj(m.w[p+"self_attn.o_proj.weight"], 1)})
	var h string
	if m.arch.sandwich {
		x = b.op("Add", []string{x, norm(b, m, o, p+"post_attention_layernorm.weight", 1)})
		h = norm(b, m, x, p+"pre_feedforward_layernorm.weight", 1)
	} else {
		x = b.op("Add", []string{x, o})
		h = norm(b, m, x, p+"post_attention_layernorm.weight", 1)
	}
	gu := linear(b, m, h, p+"mlp.gate_up_proj.weight", H, 2*I, []projection{
		proj(m.w[p+"mlp.gate_proj.weight"], 1),
		proj(m.w[p+"mlp.up_proj.weight"], 1),
	})
	gateUp := b.opN("Split", 2, []string{gu, b.ints(I, I)}, attrI("axis", -1))
	act := b.op("Mul", []string{activation(b, m.arch.act, gateUp[0]), gateUp[1]})
	down := linear(b, m, act, p+"mlp.down_proj.weight", I, H, []projection{proj(m.w[p+"mlp.down_proj.weight"], 1)})
	if m.arch.sandwich {
		down = norm(b, m, down, p+"post_feedforward_layernorm.weight", 1)
	}
	return b.op("Add", []string{x, down})
}

// activation appends the MLP activation act of x.
func activation(b *graphBuilder, act, x string) string {
	c := func(v float32) string { return b.constFloat32(nil, v) }
	switch act {
	case actGeluTanh: // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
		x3 := b.op("Mul", []string{b.op("Mul", []string{x, x}), x})
		inner := b.op("Mul", []string{b.op("Add", []string{x, b.op("Mul", []string{x3, c(0.044715)})}), c(float32(math.Sqrt(2 / math.Pi)))})
		return b.op("Mul", []string{b.op("Mul", []string{x, c(0.5)}), b.op("Add", []string{b.op("Tanh", []string{inner}), c(1)})})
	case actGelu: // 0.5 x (1 + erf(x / sqrt(2)))
		erf := b.op("Erf", []string{b.op("Mul", []string{x, c(float32(1 / math.Sqrt2))})})
		return b.op("Mul", []string{b.op("Mul", []string{x, c(0.5)}), b.op("Add", []string{erf, c(1)})})
	}
	return b.op("Mul", []string{x, b.op("Sigmoid", []string{x})})
}

// finalNorm appends the model's last RMSNorm.
func finalNorm(b *graphBuilder, m *modelPlan, x string) string {
	return norm(b, m, x, "model.norm.weight", 1)
}

// tiedHead reports whether the output projection is the embedding table.
func tiedHead(cfg *Config, w Weights) bool {
	_, ok := w["lm_head.weight"]
	return !ok || cfg.TieWordEmbeddings
}

// untiedHead appends the logits x @ lm_head.weight^T.
func untiedHead(b *graphBuilder, m *modelPlan, x string) string {
	return linear(b, m, x, "lm_head.weight", int64(m.hidden), int64(m.vocab), []projection{proj(m.w["lm_head.weight"], 1)})
}

// tiedHeadLogits appends the logits of the rows x [rows, hidden] against the embedding
// table embed: a Gemm with transB reading the table as is, or, when the build
// quantizes, a quantized linear over a copy of it (the lookup keeps the float
// table: it reads one row per token, the head all of them every step).
func tiedHeadLogits(b *graphBuilder, m *modelPlan, x, embed string) string {
	if m.quant.Bits != 0 {
		return linear(b, m, x, "model.embed_tokens.weight", int64(m.hidden), int64(m.vocab), []projection{proj(m.w["model.embed_tokens.weight"], 1)})
	}
	return b.op("Gemm", []string{x, embed}, attrI("transB", 1))
}

// projection is one Hugging Face linear weight [out, in] and a factor applied to it.
type projection struct {
	w          []float32
	scale      float32
	sourceBits int // the weight's Tensor.SourceBits
}

// proj is the projection of weight t scaled by scale.
func proj(t *Tensor, scale float32) projection {
	return projection{w: t.Data, scale: scale, sourceBits: t.SourceBits}
}

// transposedWeight adds the [in, out] initializer name holding the projections
// transposed side by side (see concatTransposed); it is computed when the model is
// written, so only one transposed copy is in memory at a time.
func transposedWeight(b *graphBuilder, name string, in, out int64, ps []projection) string {
	return b.weightGen(name, []int64{in, out}, func(dst []float32) { concatTransposed(dst, int(in), ps) })
}

// concatTransposed writes into dst the [in, sum(out)] row-major matrix whose columns
// are the projections' rows, scaled, side by side: x @ dst computes all of them at once.
func concatTransposed(dst []float32, in int, ps []projection) {
	total := 0
	for _, p := range ps {
		total += len(p.w) / in
	}
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
}
