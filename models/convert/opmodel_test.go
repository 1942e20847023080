package convert

import (
	"bytes"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// pbFields returns the fields of a protobuf message as (number, raw bytes) pairs, the
// varints re-encoded.
func pbFields(t *testing.T, b []byte) (nums []protowire.Number, vals [][]byte) {
	t.Helper()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatal("bad tag")
		}
		b = b[n:]
		var v []byte
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			var x uint64
			x, n = protowire.ConsumeVarint(b)
			v = protowire.AppendVarint(nil, x)
		case protowire.Fixed32Type:
			_, n = protowire.ConsumeFixed32(b)
			v = b[:4]
		default:
			t.Fatalf("unexpected wire type %d", typ)
		}
		if n < 0 {
			t.Fatal("bad field")
		}
		b = b[n:]
		nums, vals = append(nums, num), append(vals, v)
	}
	return nums, vals
}

// field returns the values of field num.
func field(t *testing.T, b []byte, num protowire.Number) [][]byte {
	nums, vals := pbFields(t, b)
	var out [][]byte
	for i, n := range nums {
		if n == num {
			out = append(out, vals[i])
		}
	}
	return out
}

// TestOpModel: the model imports the operator's domain, its node keeps absent inputs as
// empty names without graph inputs for them, and attributes come in a fixed order.
func TestOpModel(t *testing.T) {
	n := OpNode{
		Domain:  "com.example",
		OpType:  "Thing",
		Inputs:  []OpValue{{Name: "x", Elem: OpFloat32, Dims: []int64{-1, 4}}, {}, {Name: "ids", Elem: OpInt32, Dims: []int64{3}}},
		Outputs: []OpValue{{Name: "y", Elem: OpFloat32, Dims: []int64{-1, 4}}},
		Ints:    map[string]int64{"b": 2, "a": 1, "c": 3},
		Floats:  map[string]float32{"z": 0.5},
	}
	model, err := OpModel(n)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := OpModel(n)
	if !bytes.Equal(model, again) {
		t.Fatal("OpModel is not deterministic")
	}
	var domains []string
	for _, o := range field(t, model, 8) {
		d := field(t, o, 1)
		if len(d) == 0 {
			domains = append(domains, "")
		} else {
			domains = append(domains, string(d[0]))
		}
	}
	if !slices.Equal(domains, []string{"", "com.example"}) {
		t.Errorf("opset imports %q, want ai.onnx and com.example", domains)
	}
	graph := field(t, model, 7)[0]
	node := field(t, graph, 1)[0]
	var ins []string
	for _, v := range field(t, node, 1) {
		ins = append(ins, string(v))
	}
	if !slices.Equal(ins, []string{"x", "", "ids"}) {
		t.Errorf("node inputs %q, want x, an absent one, ids", ins)
	}
	if got := string(field(t, node, 4)[0]); got != "Thing" {
		t.Errorf("op type %q", got)
	}
	if got := string(field(t, node, 7)[0]); got != "com.example" {
		t.Errorf("node domain %q", got)
	}
	var attrs []string
	for _, a := range field(t, node, 5) {
		attrs = append(attrs, string(field(t, a, 1)[0]))
	}
	if !slices.Equal(attrs, []string{"a", "b", "c", "z"}) {
		t.Errorf("attributes %q, want a, b, c, z", attrs)
	}
	if got := len(field(t, graph, 11)); got != 2 {
		t.Errorf("%d graph inputs, want 2 (the absent input has none)", got)
	}
	if _, err := OpModel(OpNode{OpType: "Thing", Outputs: []OpValue{{}}}); err == nil {
		t.Error("an output without a name was accepted")
	}
}
