package convert

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
)

// OpElem is the element type of a value of an OpModel: ONNX's TensorProto.DataType.
type OpElem int32

// Element types of OpModel values.
const (
	OpFloat32 OpElem = 1
	OpInt32   OpElem = 6
	OpFloat16 OpElem = 10
	OpInt64   OpElem = 7
)

// OpValue is a graph input or output of an OpModel. A Name of "" in a node's inputs
// leaves that (optional) input absent.
type OpValue struct {
	Name string
	Elem OpElem
	Dims []int64 // a negative dimension is symbolic
}

// OpNode describes a model whose graph is one operator node: its inputs and outputs are
// the graph's, in order.
type OpNode struct {
	Domain  string // "" for ai.onnx; another domain is imported at version 1
	OpType  string
	Inputs  []OpValue
	Outputs []OpValue
	Ints    map[string]int64
	Floats  map[string]float32
}

// OpModel returns the ONNX model (the bytes of a ModelProto) of the one-node graph n
// describes, for running a single operator through ONNX Runtime.
func OpModel(n OpNode) ([]byte, error) {
	if n.OpType == "" || len(n.Outputs) == 0 {
		return nil, fmt.Errorf("convert: OpModel needs an operator type and outputs")
	}
	g := &onnxGraph{Name: n.OpType}
	node := &onnxNode{Name: n.OpType + "_0", OpType: n.OpType, Domain: n.Domain}
	valueInfo := func(v OpValue) onnxValueInfo {
		vi := onnxValueInfo{Name: v.Name, ElemType: int32(v.Elem)}
		for i, d := range v.Dims {
			if d < 0 {
				vi.Dims = append(vi.Dims, symDim(fmt.Sprintf("%s_%d", v.Name, i)))
			} else {
				vi.Dims = append(vi.Dims, fixDim(int(d)))
			}
		}
		return vi
	}
	for _, v := range n.Inputs {
		node.Inputs = append(node.Inputs, v.Name)
		if v.Name != "" {
			g.Inputs = append(g.Inputs, valueInfo(v))
		}
	}
	for _, v := range n.Outputs {
		if v.Name == "" {
			return nil, fmt.Errorf("convert: OpModel outputs need names")
		}
		node.Outputs = append(node.Outputs, v.Name)
		g.Outputs = append(g.Outputs, valueInfo(v))
	}
	for _, k := range slices.Sorted(maps.Keys(n.Ints)) {
		node.Attrs = append(node.Attrs, attrI(k, n.Ints[k]))
	}
	for _, k := range slices.Sorted(maps.Keys(n.Floats)) {
		node.Attrs = append(node.Attrs, attrF(k, n.Floats[k]))
	}
	g.Nodes = []*onnxNode{node}
	m := &onnxModel{IRVersion: onnxIRVersion, Opsets: []onnxOpsetID{{Domain: "", Version: onnxOpset}}, ProducerName: "conveyor", Graph: g}
	if n.Domain != "" {
		m.Opsets = append(m.Opsets, onnxOpsetID{Domain: n.Domain, Version: 1})
	}
	var buf bytes.Buffer
	if err := encodeModel(m, "").writeTo(&buf, new([]float32)); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
