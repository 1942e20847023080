package convert

import (
	"fmt"
	"os"
	"strings"
)

// Variant changes the dense graph's interface the way other exporters do.
type Variant struct {
	Float16KV      bool // past/present in float16 (cast to and from float32 inside)
	Float16Logits  bool // logits in float16
	LastLogitsOnly bool // logits only for the last position: [batch, 1, vocab]
}

// BuildLlamaVariant is BuildLlamaONNX with the interface changes of v.
func BuildLlamaVariant(cfg *Config, w Weights, dir string, v Variant) error {
	m, err := denseGraph(cfg, w, Quantization{})
	if err != nil {
		return err
	}
	g := m.Graph
	rename := func(from, to string) {
		for _, n := range g.Nodes {
			for i := range n.Inputs {
				if n.Inputs[i] == from {
					n.Inputs[i] = to
				}
			}
			for i := range n.Outputs {
				if n.Outputs[i] == from {
					n.Outputs[i] = to
				}
			}
		}
	}
	node := func(op string, in, out string, attrs ...onnxAttr) *onnxNode {
		return &onnxNode{Name: op + "_" + out, OpType: op, Inputs: []string{in}, Outputs: []string{out}, Attrs: attrs}
	}
	var pre, post []*onnxNode
	for i, in := range g.Inputs {
		if ok := strings.HasPrefix(in.Name, "past_key_values."); ok && v.Float16KV {
			g.Inputs[i].ElemType = onnxFloat16
			rename(in.Name, in.Name+"_f32")
			pre = append(pre, node("Cast", in.Name, in.Name+"_f32", attrI("to", int64(onnxFloat))))
		}
	}
	for i, out := range g.Outputs {
		if ok := strings.HasPrefix(out.Name, "present."); ok && v.Float16KV {
			g.Outputs[i].ElemType = onnxFloat16
			rename(out.Name, out.Name+"_f32")
			post = append(post, node("Cast", out.Name+"_f32", out.Name, attrI("to", int64(onnxFloat16))))
		}
		if out.Name != "logits" {
			continue
		}
		cur := "logits_full"
		rename("logits", cur)
		if v.LastLogitsOnly {
			g.Outputs[i].Dims[1] = onnxDim{Value: 1}
			idx := "logits_last_index"
			g.Initializers = append(g.Initializers, &onnxTensor{Name: idx, Dims: []int64{1}, DataType: onnxInt64,
				Raw: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}) // [-1]
			n := node("Gather", cur, "logits_last", attrI("axis", 1))
			n.Inputs = append(n.Inputs, idx)
			post = append(post, n)
			cur = "logits_last"
		}
		if v.Float16Logits {
			g.Outputs[i].ElemType = onnxFloat16
			post = append(post, node("Cast", cur, "logits_f16", attrI("to", int64(onnxFloat16))))
			cur = "logits_f16"
		}
		post = append(post, node("Identity", cur, "logits"))
	}
	g.Nodes = append(append(pre, g.Nodes...), post...)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	_, err = writeONNXModel(m, dir, "model.onnx", writeOptions{})
	return err
}
