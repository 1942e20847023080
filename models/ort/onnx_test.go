package ort

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// A minimal ONNX protobuf writer for the tests' graphs: just the fields they use.

type pb []byte

func (b pb) varint(field int, v uint64) pb {
	b = binary.AppendUvarint(b, uint64(field)<<3)
	return binary.AppendUvarint(b, v)
}

func (b pb) bytes(field int, v []byte) pb {
	b = binary.AppendUvarint(b, uint64(field)<<3|2)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func (b pb) str(field int, s string) pb { return b.bytes(field, []byte(s)) }

// ONNX element types as TensorProto.DataType numbers (the tests' only other one).
const onnxInt8 = 3

// valueInfo is a ValueInfoProto: a tensor of type t whose dimensions are numbers, or
// names (symbolic) where dims holds -1.
func valueInfo(name string, t int, dims []int64, names ...string) pb {
	var shape pb
	for i, d := range dims {
		var dim pb
		if d < 0 {
			dim = dim.str(2, names[i])
		} else {
			dim = dim.varint(1, uint64(d))
		}
		shape = shape.bytes(1, dim)
	}
	tensor := pb(nil).varint(1, uint64(t)).bytes(2, shape)
	typ := pb(nil).bytes(1, tensor)
	return pb(nil).str(1, name).bytes(2, typ)
}

// node is a NodeProto; attrs are integer attributes.
func node(op, domain string, ins, outs []string, attrs map[string]int64) pb {
	var n pb
	for _, in := range ins {
		n = n.str(1, in)
	}
	for _, out := range outs {
		n = n.str(2, out)
	}
	n = n.str(3, op+"_0").str(4, op)
	for k, v := range attrs {
		a := pb(nil).str(1, k).varint(3, uint64(v)).varint(20, 2) // type INT
		n = n.bytes(5, a)
	}
	if domain != "" {
		n = n.str(7, domain)
	}
	return n
}

// initializer is a TensorProto with raw data.
func initializer(name string, t int, dims []int64, raw []byte) pb {
	var b pb
	for _, d := range dims {
		b = b.varint(1, uint64(d))
	}
	return b.varint(2, uint64(t)).str(8, name).bytes(9, raw)
}

// model writes a ModelProto (IR 8, opset 17, plus domains at version 1) to dir/name.
func model(t *testing.T, dir, name string, nodes, inits, ins, outs []pb, domains ...string) string {
	t.Helper()
	g := pb(nil)
	for _, n := range nodes {
		g = g.bytes(1, n)
	}
	g = g.str(2, "g")
	for _, x := range inits {
		g = g.bytes(5, x)
	}
	for _, x := range ins {
		g = g.bytes(11, x)
	}
	for _, x := range outs {
		g = g.bytes(12, x)
	}
	m := pb(nil).varint(1, 8).bytes(8, pb(nil).str(1, "").varint(2, 17))
	for _, d := range domains {
		m = m.bytes(8, pb(nil).str(1, d).varint(2, 1))
	}
	m = m.bytes(7, g)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, m, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// addModel writes z = Add(x, y) over float32 vectors of any length n.
func addModel(t *testing.T) string {
	vec := func(name string) pb { return valueInfo(name, int(Float32), []int64{-1}, "n") }
	return model(t, t.TempDir(), "add.onnx",
		[]pb{node("Add", "", []string{"x", "y"}, []string{"z"}, nil)}, nil,
		[]pb{vec("x"), vec("y")}, []pb{vec("z")})
}

func float32Bytes(xs []float32) []byte {
	out := make([]byte, 4*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}
