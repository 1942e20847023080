package convert

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// graphBuilder appends nodes and initializers to an onnxGraph, naming intermediate
// values and sharing identical small constants.
type graphBuilder struct {
	g      *onnxGraph
	next   int
	consts map[string]string // constant key -> initializer name
	prefix string            // prepended to generated node and value names
	usesMS bool              // a com.microsoft operator was added (MatMulNBits, MatMulIntegerToFloat)
	// ownOps lets linear use Conveyor's own operators (int8: convDomain's Int8Linear),
	// for graphs only Conveyor runs (the step graph); usesOwn says one was added.
	ownOps, usesOwn bool
}

// opsets returns the operator sets the graph imports: ai.onnx, and com.microsoft when
// one of its operators is used.
func (b *graphBuilder) opsets() []onnxOpsetID {
	ids := []onnxOpsetID{{Domain: "", Version: onnxOpset}}
	if b.usesMS {
		ids = append(ids, onnxOpsetID{Domain: msDomain, Version: 1})
	}
	if b.usesOwn {
		ids = append(ids, onnxOpsetID{Domain: convDomain, Version: 1})
	}
	return ids
}

func newGraphBuilder(name string) *graphBuilder {
	return &graphBuilder{g: &onnxGraph{Name: name}, consts: map[string]string{}}
}

// fresh returns a new unique value name built from hint.
func (b *graphBuilder) fresh(hint string) string {
	b.next++
	return fmt.Sprintf("%s%s_%d", b.prefix, hint, b.next)
}

// node appends a node with the given outputs and returns them.
func (b *graphBuilder) node(op string, inputs, outputs []string, attrs ...onnxAttr) []string {
	b.g.Nodes = append(b.g.Nodes, &onnxNode{
		Name:    fmt.Sprintf("%s%s_%d", b.prefix, op, len(b.g.Nodes)),
		OpType:  op,
		Inputs:  inputs,
		Outputs: outputs,
		Attrs:   attrs,
	})
	return outputs
}

// op appends a single-output node and returns its output's name.
func (b *graphBuilder) op(op string, inputs []string, attrs ...onnxAttr) string {
	return b.node(op, inputs, []string{b.fresh(strings.ToLower(op))}, attrs...)[0]
}

// opTo appends a single-output node whose output has the given name.
func (b *graphBuilder) opTo(out, op string, inputs []string, attrs ...onnxAttr) string {
	return b.node(op, inputs, []string{out}, attrs...)[0]
}

// opN appends a node with n outputs.
func (b *graphBuilder) opN(op string, n int, inputs []string, attrs ...onnxAttr) []string {
	outs := make([]string, n)
	for i := range outs {
		outs[i] = b.fresh(strings.ToLower(op))
	}
	return b.node(op, inputs, outs, attrs...)
}

// weight adds a float32 initializer named name.
func (b *graphBuilder) weight(name string, dims []int64, data []float32) string {
	b.g.Initializers = append(b.g.Initializers, &onnxTensor{Name: name, Dims: dims, DataType: onnxFloat, F32: data})
	return name
}

// weightGen adds a float32 initializer whose values gen writes into dst (sized by
// dims) when the model is written.
func (b *graphBuilder) weightGen(name string, dims []int64, gen func(dst []float32)) string {
	b.g.Initializers = append(b.g.Initializers, &onnxTensor{Name: name, Dims: dims, DataType: onnxFloat, Gen: gen})
	return name
}

// constInt64 returns an int64 initializer holding vals with shape dims (nil dims =
// scalar), shared between callers that ask for the same value.
func (b *graphBuilder) constInt64(dims []int64, vals ...int64) string {
	key := fmt.Sprintf("i64%v%v", dims, vals)
	if name, ok := b.consts[key]; ok {
		return name
	}
	raw := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(v))
	}
	name := b.fresh("const_i64")
	b.g.Initializers = append(b.g.Initializers, &onnxTensor{Name: name, Dims: dims, DataType: onnxInt64, Raw: raw})
	b.consts[key] = name
	return name
}

// constUint8 returns a scalar uint8 initializer, shared between callers that ask for
// the same value.
func (b *graphBuilder) constUint8(v uint8) string {
	key := fmt.Sprintf("u8/%d", v)
	if name, ok := b.consts[key]; ok {
		return name
	}
	name := b.fresh("const_u8")
	b.g.Initializers = append(b.g.Initializers, &onnxTensor{Name: name, DataType: onnxUint8, Raw: []byte{v}})
	b.consts[key] = name
	return name
}

// ints returns a 1-D int64 constant.
func (b *graphBuilder) ints(vals ...int64) string {
	return b.constInt64([]int64{int64(len(vals))}, vals...)
}

// constFloat32 returns a float32 initializer holding vals with shape dims (nil dims =
// scalar), shared between callers that ask for the same value.
func (b *graphBuilder) constFloat32(dims []int64, vals ...float32) string {
	key := fmt.Sprintf("f32%v", dims)
	for _, v := range vals {
		key += fmt.Sprintf(",%08x", math.Float32bits(v))
	}
	if name, ok := b.consts[key]; ok {
		return name
	}
	name := b.fresh("const_f32")
	b.weight(name, dims, append([]float32(nil), vals...))
	b.consts[key] = name
	return name
}

// input declares a graph input.
func (b *graphBuilder) input(name string, elem int32, dims ...onnxDim) string {
	b.g.Inputs = append(b.g.Inputs, onnxValueInfo{Name: name, ElemType: elem, Dims: dims})
	return name
}

// output declares a graph output.
func (b *graphBuilder) output(name string, elem int32, dims ...onnxDim) {
	b.g.Outputs = append(b.g.Outputs, onnxValueInfo{Name: name, ElemType: elem, Dims: dims})
}

func symDim(name string) onnxDim { return onnxDim{Param: name} }
func fixDim(n int) onnxDim       { return onnxDim{Value: int64(n)} }
