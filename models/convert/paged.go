package convert

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/conveyor-llm/conveyor/models/attention"
	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// BuildPaged writes outDir/paged/: the model cut into one ONNX segment per layer plus
// a head segment, the embedding table as raw float32 and the manifest that ties them
// to the attention parameters of every layer (see modeldir.PagedManifest). The
// runtime runs the segments in turn with the native paged-attention kernel between
// them, which reads and writes the KV blocks in place. The segments compute exactly
// what the dense graph computes (they are built from the same layer pieces and store
// the same fused weights); only attention moves out of the graph.
func BuildPaged(cfg *Config, w Weights, outDir string) error {
	return buildPaged(cfg, w, outDir, Quantization{}, writeOptions{})
}

func buildPaged(cfg *Config, w Weights, outDir string, q Quantization, opts writeOptions) error {
	if opts.scratch == nil {
		opts.scratch = new([]float32)
	}
	m, err := planModel(cfg, w, q)
	if err != nil {
		return err
	}
	d := m.llamaDims
	dir := filepath.Join(outDir, modeldir.PagedDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	man := &modeldir.PagedManifest{
		Format:       modeldir.PagedFormat,
		HiddenSize:   d.hidden,
		VocabSize:    d.vocab,
		MaxPositions: m.contextLength(),
		// The runtime scales the rows it looks up (Gemma); the table stays raw, as the tied
		// head reads it.
		Embedding: modeldir.Embedding{File: "embedding.bin", Rows: d.vocab, Cols: d.hidden, Scale: m.arch.embedScale},
		Head:      "head.onnx",
		// Shown by serve; the segments themselves say how they multiply.
		Quantization: q.String(),
		// int8 segments multiply only through Int8Linear (linear with ownOps).
		OwnThreads: q.Bits == 8,
	}
	for i := 0; i < d.layers; i++ {
		name := fmt.Sprintf("layer%d.onnx", i)
		if err := writeSegment(layerSegment(m, i), dir, name, opts); err != nil {
			return err
		}
		rot := m.arch.rotary[i]
		att := attention.Params{
			NumHeads:      d.heads,
			NumKVHeads:    d.kvHeads,
			HeadDim:       d.headDim,
			Scale:         1, // the attention scale is folded into the query projection
			Rotary:        attention.Rotary{Dims: rot.dims, InvFreq: rot.invFreq, AttentionFactor: rot.factor},
			SlidingWindow: m.arch.window[i],
			Softcap:       m.arch.attnSoftcap,
		}
		man.Layers = append(man.Layers, modeldir.PagedLayer{Segment: name, Attention: att})
	}
	if err := writeSegment(headSegment(m), dir, man.Head, opts); err != nil {
		return err
	}
	if err := writeFloat32File(filepath.Join(dir, man.Embedding.File), m.w["model.embed_tokens.weight"].Data); err != nil {
		return err
	}
	return modeldir.WritePaged(outDir, man)
}

func writeSegment(m *onnxModel, dir, name string, opts writeOptions) error {
	_, err := writeONNXModel(m, dir, name, opts)
	return err
}

// layerSegment is layer i's segment: layer i-1's output projection and MLP (none for
// layer 0), then layer i's norm and q|k|v projection.
func layerSegment(m *modelPlan, i int) *onnxModel {
	d := m.llamaDims
	b := newGraphBuilder(fmt.Sprintf("layer%d", i))
	b.ownOps = true
	tokens := symDim("tokens")
	x := b.input(modeldir.SegHidden, onnxFloat, tokens, fixDim(d.hidden))
	if i > 0 {
		att := b.input(modeldir.SegAttention, onnxFloat, tokens, fixDim(d.heads*d.headDim))
		b.prefix = fmt.Sprintf("l%d_", i-1)
		x = attentionOutputAndMLP(b, m, i-1, x, att)
		b.opTo(modeldir.SegHiddenOut, "Identity", []string{x})
		b.output(modeldir.SegHiddenOut, onnxFloat, tokens, fixDim(d.hidden))
	}
	b.prefix = fmt.Sprintf("l%d_", i)
	qkv := attentionInput(b, m, i, x)
	b.opTo(modeldir.SegQKV, "Identity", []string{qkv})
	b.output(modeldir.SegQKV, onnxFloat, tokens, fixDim((d.heads+2*d.kvHeads)*d.headDim))
	return segmentModel(b, "one layer of a decoder for Conveyor's paged attention")
}

// headSegment finishes the last layer and computes the logits of the selected rows.
func headSegment(m *modelPlan) *onnxModel {
	d := m.llamaDims
	b := newGraphBuilder("head")
	b.ownOps = true
	tokens, rows := symDim("tokens"), symDim("rows")
	x := b.input(modeldir.SegHidden, onnxFloat, tokens, fixDim(d.hidden))
	att := b.input(modeldir.SegAttention, onnxFloat, tokens, fixDim(d.heads*d.headDim))
	sel := b.input(modeldir.SegLogitRows, onnxInt64, rows)
	b.output(modeldir.SegLogits, onnxFloat, rows, fixDim(d.vocab))
	b.prefix = fmt.Sprintf("l%d_", d.layers-1)
	x = attentionOutputAndMLP(b, m, d.layers-1, x, att)
	b.prefix = "final_"
	x = b.op("Gather", []string{x, sel}, attrI("axis", 0)) // only the rows whose logits are wanted
	x = finalNorm(b, m, x)
	var logits string
	if tiedHead(m.cfg, m.w) {
		embed := ""
		if m.quant.Bits == 0 {
			embed = b.weight("model.embed_tokens.weight", []int64{int64(d.vocab), int64(d.hidden)}, m.w["model.embed_tokens.weight"].Data)
		}
		logits = tiedHeadLogits(b, m, x, embed)
	} else {
		logits = untiedHead(b, m, x)
	}
	logits = softcapped(b, logits, m.arch.finalSoftcap)
	b.opTo(modeldir.SegLogits, "Identity", []string{logits})
	return segmentModel(b, "the head of a decoder for Conveyor's paged attention")
}

func segmentModel(b *graphBuilder, doc string) *onnxModel {
	return &onnxModel{
		IRVersion:    onnxIRVersion,
		Opsets:       b.opsets(),
		ProducerName: "conveyor",
		DocString:    doc,
		Graph:        b.g,
	}
}

// writeFloat32File writes vs as raw little-endian float32.
func writeFloat32File(path string, vs []float32) error {
	return writeFileAtomic(path, func(w io.Writer) error { return writeFloat32s(w, vs) })
}
