package convert

import (
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/kernels"
	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// The step graph: the whole model as one ONNX graph, run once per engine step over the
// new tokens of every row packed together (prefill chunks and decode rows mixed). Each
// layer's attention is one PagedAttention node that writes the new keys and values into
// the layer's block cache and attends over every row's past in place; the LM head runs
// over the rows' selected tokens only. The inputs and outputs are modeldir's Step* names.
//
// A float32 graph uses Conveyor's own PagedAttention (domain com.conveyor, the CPU); a
// float16 or bfloat16 graph uses ONNX Runtime's contrib operator (com.microsoft, CUDA).
// Both take the same inputs and attributes, so the graphs differ only in that domain and
// in their float type.

// stepGraphFile is the step graph's file name inside modeldir.StepDir.
const stepGraphFile = "step.onnx"

// pagedAttentionOp is the operator type of both PagedAttention implementations.
const pagedAttentionOp = "PagedAttention"

// buildStep writes outDir/step/: the step graph of cfg with weights w in float type
// dtype, and its manifest. A model whose heads PagedAttention cannot take (a size not a
// multiple of 8, or above kernels.PagedMaxHeadDim) gets no step graph: its directory serves
// on the other paths, and asking for the graph says it has none.
func buildStep(cfg *Config, w Weights, outDir string, q Quantization, dtype, kvType DType, opts writeOptions) error {
	m, err := planModel(cfg, w, q)
	if err != nil {
		return err
	}
	if !kernels.PagedHeadFits(m.headDim) {
		return nil
	}
	domain := modeldir.StepDomainConveyor
	switch {
	case dtype != Float32:
		kvType = dtype // a 16-bit graph's cache is its own type
	case kvType != Float32 && kvType != Float16:
		return fmt.Errorf("%w: a float32 step graph's KV cache is float32 or float16, not %v", ErrBadConfig, kvType)
	}
	if dtype != Float32 {
		domain = modeldir.StepDomainMicrosoft
		if q.Bits == 8 || q.WideInt8 {
			return fmt.Errorf("%w: int8 weights run on the CPU only (Conveyor's Int8Linear); a %v step graph for the GPU takes float or int4 weights", ErrBadConfig, dtype)
		}
	}
	// On the CPU the layers are grouped by window (kvcache.PlanLayout, for any context), so
	// that sliding layers read blocks of their own that their window gives back; a GPU
	// graph keeps every layer's whole past in one group.
	var groups []int
	if domain == modeldir.StepDomainConveyor {
		groups = kvcache.PlanLayout(m.arch.window, m.layers, math.MaxInt).LayerGroups
	}
	model := stepGraph(m, dtype, kvType, domain, groups)
	dir := filepath.Join(outDir, modeldir.StepDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	if _, err := writeONNXModel(model, dir, stepGraphFile, opts); err != nil {
		return err
	}
	d := m.llamaDims
	man := &modeldir.StepManifest{
		Format:          modeldir.StepFormat,
		Graph:           stepGraphFile,
		DType:           dtype.String(),
		KVDType:         kvDTypeField(dtype, kvType),
		AttentionDomain: domain,
		NumLayers:       d.layers,
		NumHeads:        d.heads,
		NumKVHeads:      d.kvHeads,
		HeadDim:         d.headDim,
		HiddenSize:      d.hidden,
		VocabSize:       d.vocab,
		MaxPositions:    m.contextLength(),
		Windows:         append([]int(nil), m.arch.window...),
		LayerGroups:     groups,
		Quantization:    q.String(),
		OwnOps:          domain == modeldir.StepDomainConveyor,
	}
	return modeldir.WriteStep(outDir, man)
}

// kvDTypeField is the manifest's kv_dtype: empty when the cache is the graph's type.
func kvDTypeField(dtype, kvType DType) string {
	if kvType == dtype {
		return ""
	}
	return kvType.String()
}

// stepGraph builds the step graph of m in float type dtype, its KV caches of kvType (the
// graph's own, or float16 in a float32 graph), with PagedAttention nodes of domain; layer
// l reads its blocks through the block table of groups[l] (nil: all through group 0's).
func stepGraph(m *modelPlan, dtype, kvType DType, domain string, groups []int) *onnxModel {
	d := m.llamaDims
	b := newGraphBuilder("step")
	b.ownOps = domain == modeldir.StepDomainConveyor
	tokens, rows, batch := symDim("tokens"), symDim("logit_rows"), symDim("batch")
	ids := b.input(modeldir.StepInputIDs, onnxInt64, tokens)
	cu := b.input(modeldir.StepCumLens, onnxInt32, symDim("batch_plus_1"))
	past := b.input(modeldir.StepPastLens, onnxInt32, batch)
	tables := []string{b.input(modeldir.StepBlockTable, onnxInt32, batch, symDim("max_blocks"))}
	for _, g := range groups {
		for len(tables) <= g {
			tables = append(tables, b.input(modeldir.StepGroupBlockTable(len(tables)), onnxInt32, batch, symDim("max_blocks")))
		}
	}
	sel := b.input(modeldir.StepLogitRows, onnxInt64, rows)
	meta := b.input(modeldir.StepAttentionMetadata, onnxInt32, fixDim(2))
	cacheDims := []onnxDim{symDim("num_blocks"), symDim("block_size"), fixDim(d.kvHeads), fixDim(d.headDim)}
	// A 16-bit graph's caches are declared float here and turned with every other float
	// input by toHalf; a float32 graph's half caches are declared so.
	cacheElem := int32(onnxFloat)
	if dtype == Float32 {
		cacheElem = halfType(kvType)
	}

	embed := b.weight("model.embed_tokens.weight", []int64{int64(d.vocab), int64(d.hidden)}, m.w["model.embed_tokens.weight"].Data)
	x := scaleEmbeddings(b, m, b.op("Gather", []string{embed, ids}, attrI("axis", 0)))
	rotaries := map[string][2]string{} // cos and sin caches, one pair per distinct rotary
	cachesOf := func(rot *rotaryPlan) [2]string {
		key := fmt.Sprint(rot.dims, rot.factor, rot.invFreq)
		t, ok := rotaries[key]
		if !ok {
			t = rotaryCaches(b, rot, m.contextLength(), len(rotaries))
			rotaries[key] = t
		}
		return t
	}
	positions := "" // [T]: each packed token's position, when the graph rotates
	var cacheOuts []string
	for i := 0; i < d.layers; i++ {
		b.prefix = fmt.Sprintf("l%d_", i)
		qkv := attentionInput(b, m, i, x)
		rot := m.arch.rotary[i]
		nodeRotates := rot.dims > 0 && kernels.PagedRotaryFits(d.headDim, rot.dims)
		if rot.dims > 0 && !nodeRotates {
			// PagedAttention's rotary cannot take this shape (CUDA refuses it): the graph
			// turns the queries and keys itself, by the same cos and sin caches, and the
			// node gets none.
			if positions == "" {
				positions = packedPositions(b, ids, cu, past)
			}
			qkv = rotatePacked(b, qkv, cachesOf(rot), positions, rot, d)
		}
		parts := b.opN("Split", 3, []string{qkv, b.ints(int64(d.heads*d.headDim), int64(d.kvHeads*d.headDim), int64(d.kvHeads*d.headDim))}, attrI("axis", -1))
		kc := b.input(modeldir.StepKeyCache(i), cacheElem, cacheDims...)
		vc := b.input(modeldir.StepValueCache(i), cacheElem, cacheDims...)
		// Inputs 0-7, cos and sin (8, 9) when the node rotates, nothing for 10-15, and
		// attention_metadata (16).
		table := tables[0]
		if groups != nil {
			table = tables[groups[i]]
		}
		ins := []string{parts[0], parts[1], parts[2], kc, vc, cu, past, table, "", ""}
		attrs := []onnxAttr{attrI("num_heads", int64(d.heads)), attrI("kv_num_heads", int64(d.kvHeads)),
			attrF("scale", 1)} // the attention scale is folded into the query projection
		if nodeRotates {
			t := cachesOf(rot)
			ins[8], ins[9] = t[0], t[1]
			attrs = append(attrs, attrI("do_rotary", 1))
		}
		ins = append(ins, "", "", "", "", "", "", meta)
		if c := m.arch.attnSoftcap; c > 0 {
			attrs = append(attrs, attrF("softcap", c))
		}
		if win := m.arch.window[i]; win > 0 {
			// Both count the keys a query sees, its own position included.
			attrs = append(attrs, attrI("local_window_size", int64(win)))
		}
		att := b.fresh("attention")
		kOut, vOut := modeldir.StepKeyCacheOut(i), modeldir.StepValueCacheOut(i)
		b.g.Nodes = append(b.g.Nodes, &onnxNode{
			Name: fmt.Sprintf("%s%s_%d", b.prefix, pagedAttentionOp, len(b.g.Nodes)), OpType: pagedAttentionOp, Domain: domain,
			Inputs: ins, Outputs: []string{att, kOut, vOut}, Attrs: attrs,
		})
		cacheOuts = append(cacheOuts, kOut, vOut)
		x = attentionOutputAndMLP(b, m, i, x, att)
	}
	b.prefix = "final_"
	x = b.op("Gather", []string{x, sel}, attrI("axis", 0)) // only the tokens whose logits are wanted
	x = finalNorm(b, m, x)
	var logits string
	if tiedHead(m.cfg, m.w) {
		logits = tiedHeadLogits(b, m, x, embed)
	} else {
		logits = untiedHead(b, m, x)
	}
	logits = softcapped(b, logits, m.arch.finalSoftcap)
	if dtype != Float32 {
		toHalf(b.g, dtype)
		logits = b.op("Cast", []string{logits}, attrI("to", int64(onnxFloat)))
	}
	b.opTo(modeldir.StepLogits, "Identity", []string{logits})
	b.output(modeldir.StepLogits, onnxFloat, rows, fixDim(d.vocab))
	// The greedy rows' next tokens, computed where the logits are, so that a GPU step
	// copies back ids instead of whole vocabularies.
	b.opTo(modeldir.StepArgmax, "ArgMax", []string{logits}, attrI("axis", 1), attrI("keepdims", 0))
	b.output(modeldir.StepArgmax, onnxInt64, rows)
	elem := halfType(kvType)
	for _, name := range cacheOuts {
		b.output(name, elem, cacheDims...)
	}
	opsets := b.opsets()
	opsets = append(opsets, onnxOpsetID{Domain: domain, Version: 1})
	return &onnxModel{
		IRVersion:    onnxIRVersion,
		Opsets:       dedupOpsets(opsets),
		ProducerName: "conveyor",
		DocString:    "a decoder as one step graph over packed rows with paged attention, for Conveyor",
		Graph:        b.g,
	}
}

// packedPositions returns [T]: the position of each of the step's packed tokens, t -
// cu[r] + past[r] for the row r whose tokens [cu[r], cu[r+1]) hold t (the number of
// rows that end at or before t).
func packedPositions(b *graphBuilder, ids, cu, past string) string {
	scalar := func(v int64) string { return b.constInt64(nil, v) }
	n := b.op("Gather", []string{b.op("Shape", []string{ids}), scalar(0)}, attrI("axis", 0))
	tok := b.op("Range", []string{scalar(0), n, scalar(1)}) // [T]
	cu64 := b.op("Cast", []string{cu}, attrI("to", int64(onnxInt64)))
	ends := b.op("Slice", []string{cu64, b.ints(1), b.ints(math.MaxInt64)}) // [B]
	ended := b.op("GreaterOrEqual", []string{b.op("Unsqueeze", []string{tok, b.ints(1)}), b.op("Unsqueeze", []string{ends, b.ints(0)})})
	row := b.op("ReduceSum", []string{b.op("Cast", []string{ended}, attrI("to", int64(onnxInt64))), b.ints(1)}, attrI("keepdims", 0))
	start := b.op("Gather", []string{cu64, row}, attrI("axis", 0))
	before := b.op("Gather", []string{b.op("Cast", []string{past}, attrI("to", int64(onnxInt64))), row}, attrI("axis", 0))
	return b.op("Add", []string{b.op("Sub", []string{tok, start}), before})
}

// rotatePacked turns the queries and keys of the packed q|k|v [T, (heads+2·kv)·D] as
// PagedAttention's do_rotary would with the cos and sin caches [positions, dims/2]:
// rotate-half pairs over the first rot.dims values of each head, by the caches' rows
// at the tokens' positions [T].
func rotatePacked(b *graphBuilder, qkv string, caches [2]string, positions string, rot *rotaryPlan, d llamaDims) string {
	NH, KV, D := int64(d.heads), int64(d.kvHeads), int64(d.headDim)
	cos := b.op("Gather", []string{caches[0], positions}, attrI("axis", 0)) // [T, dims/2]
	sin := b.op("Gather", []string{caches[1], positions}, attrI("axis", 0))
	// rotate_half(x)·sin is swap(x)·(-sin | sin): the sign goes with the table.
	cosFull := b.op("Unsqueeze", []string{b.op("Concat", []string{cos, cos}, attrI("axis", -1)), b.ints(1)}) // [T, 1, dims]
	sinSigned := b.op("Unsqueeze", []string{b.op("Concat", []string{b.op("Neg", []string{sin}), sin}, attrI("axis", -1)), b.ints(1)})
	heads := b.op("Reshape", []string{qkv, b.ints(-1, NH+2*KV, D)}) // [T, heads, D]
	qkAndV := b.opN("Split", 2, []string{heads, b.ints(NH+KV, KV)}, attrI("axis", 1))
	qk := applyRotary(b, qkAndV[0], cosFull, sinSigned, int64(rot.dims), D)
	joined := b.op("Concat", []string{qk, qkAndV[1]}, attrI("axis", 1))
	return b.op("Reshape", []string{joined, b.ints(-1, (NH+2*KV)*D)})
}

// rotaryCaches adds the cos and sin caches [positions, dims/2] of rot, each value times
// the attention factor; k numbers the model's distinct rotaries.
func rotaryCaches(b *graphBuilder, rot *rotaryPlan, positions, k int) [2]string {
	half := rot.dims / 2
	dims := []int64{int64(positions), int64(half)}
	fill := func(dst []float32, f func(float64) float64) {
		for p := 0; p < positions; p++ {
			for j, inv := range rot.invFreq {
				// The angle in float32, as the reference models compute it.
				angle := float32(p) * inv
				dst[p*half+j] = float32(f(float64(angle))) * rot.factor
			}
		}
	}
	name := fmt.Sprintf("rope%d", k)
	cos := b.weightGen(name+".cos_cache", dims, func(dst []float32) { fill(dst, math.Cos) })
	sin := b.weightGen(name+".sin_cache", dims, func(dst []float32) { fill(dst, math.Sin) })
	return [2]string{cos, sin}
}

// halfType is the ONNX element type of dtype.
func halfType(dtype DType) int32 {
	switch dtype {
	case Float16:
		return onnxFloat16
	case BFloat16:
		return onnxBF16
	}
	return onnxFloat
}

// toHalf turns the float32 graph g into one of dtype: every float initializer is stored
// in it, every float input is of it, and every Cast to float casts to it.
func toHalf(g *onnxGraph, dtype DType) {
	elem := halfType(dtype)
	for _, t := range g.Initializers {
		if t.DataType == onnxFloat {
			t.DataType, t.Half = elem, elem
		}
	}
	for i := range g.Inputs {
		if g.Inputs[i].ElemType == onnxFloat {
			g.Inputs[i].ElemType = elem
		}
	}
	for _, n := range g.Nodes {
		if n.OpType != "Cast" {
			continue
		}
		for i, a := range n.Attrs {
			if a.Name == "to" && a.I == int64(onnxFloat) {
				n.Attrs[i].I = int64(elem)
			}
		}
	}
}

// dedupOpsets drops repeated domains, keeping the first of each.
func dedupOpsets(ids []onnxOpsetID) []onnxOpsetID {
	seen := map[string]bool{}
	out := ids[:0]
	for _, id := range ids {
		if !seen[id.Domain] {
			seen[id.Domain] = true
			out = append(out, id)
		}
	}
	return out
}
