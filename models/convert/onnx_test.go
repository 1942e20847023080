package convert

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/conveyor-llm/conveyor/models/ort"
)

// addModel builds y = (x + w) * 2 with x [batch, 3] float32 and w a [3] initializer.
func addModel(w []float32) *onnxModel {
	b := newGraphBuilder("add")
	x := b.input("x", onnxFloat, symDim("batch"), fixDim(3))
	b.output("y", onnxFloat, symDim("batch"), fixDim(3))
	sum := b.op("Add", []string{x, b.weight("w", []int64{3}, w)})
	b.opTo("y", "Mul", []string{sum, b.constFloat32(nil, 2)})
	return &onnxModel{IRVersion: onnxIRVersion, Opsets: []onnxOpsetID{{Version: onnxOpset}}, ProducerName: "test", Graph: b.g}
}

func runAddModel(t *testing.T, path string) []float32 {
	t.Helper()
	s := openBuilderTestSession(t, path, []string{"x"}, []string{"y"})
	out := s.run(t, []*ort.Value{mustTensor(t, []int64{2, 3}, []float32{1, 2, 3, -1, -2, -3})}, []int64{2, 3})
	return out[0].data
}

func TestONNXWriterAddGraph(t *testing.T) {
	dir := t.TempDir()
	files, err := writeONNXModel(addModel([]float32{10, 20, 30}), dir, "model.onnx", writeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 {
		t.Fatalf("small model wrote %v, want model.onnx only", files)
	}
	got := runAddModel(t, filepath.Join(dir, "model.onnx"))
	want := []float32{22, 44, 66, 18, 36, 54}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("y = %v, want %v", got, want)
		}
	}
}

func TestONNXWriterExternalData(t *testing.T) {
	// A 1000-value weight (4000 bytes) goes to model.onnx.data when forced external.
	w := make([]float32, 3000)
	for i := range w {
		w[i] = float32(i)
	}
	b := newGraphBuilder("ext")
	x := b.input("x", onnxInt64, fixDim(2))
	b.output("y", onnxFloat, fixDim(2), fixDim(3))
	table := b.weight("table", []int64{1000, 3}, w)
	small := b.weight("small", []int64{3}, []float32{0.5, 0.25, 0.125})
	b.opTo("y", "Add", []string{b.op("Gather", []string{table, x}, attrI("axis", 0)), small})
	m := &onnxModel{IRVersion: onnxIRVersion, Opsets: []onnxOpsetID{{Version: onnxOpset}}, Graph: b.g}
	dir := t.TempDir()
	files, err := writeONNXModel(m, dir, "model.onnx", writeOptions{externalAboveBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || filepath.Base(files[1]) != "model.onnx.data" {
		t.Fatalf("wrote %v, want model.onnx and model.onnx.data", files)
	}
	st, err := os.Stat(filepath.Join(dir, "model.onnx"))
	if err != nil || st.Size() > 2000 {
		t.Fatalf("model.onnx should hold no big tensor: %v, %v", st.Size(), err)
	}
	s := openBuilderTestSession(t, filepath.Join(dir, "model.onnx"), []string{"x"}, []string{"y"})
	out := s.run(t, []*ort.Value{mustTensor(t, []int64{2}, []int64{7, 999})}, []int64{2, 3})
	want := []float32{21.5, 22.25, 23.125, 2997.5, 2998.25, 2999.125}
	for i := range want {
		if out[0].data[i] != want[i] {
			t.Fatalf("y = %v, want %v", out[0].data, want)
		}
	}
	// Writing the same model inline removes the stale data file.
	if _, err := writeONNXModel(m, dir, "model.onnx", writeOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "model.onnx.data")); !os.IsNotExist(err) {
		t.Errorf("stale model.onnx.data left behind: %v", err)
	}
}

// TestONNXWriterEncoding decodes the written ModelProto's top-level fields with
// protowire, independently of ONNX Runtime.
func TestONNXWriterEncoding(t *testing.T) {
	var buf bytes.Buffer
	if err := encodeModel(addModel([]float32{1, 2, 3}), "").writeTo(&buf, new([]float32)); err != nil {
		t.Fatal(err)
	}
	if int64(buf.Len()) != encodeModel(addModel([]float32{1, 2, 3}), "").len() {
		t.Fatalf("len() disagrees with the bytes written")
	}
	b := buf.Bytes()
	var ir int64
	var opsetVersion int64
	var graph []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatal("bad tag")
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			ir, b = int64(v), b[m:]
		case typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				t.Fatal("bad length")
			}
			if num == 7 {
				graph = v
			}
			if num == 8 {
				_, _, k := protowire.ConsumeTag(v)
				ver, _ := protowire.ConsumeVarint(v[k:])
				opsetVersion = int64(ver)
			}
			b = b[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				t.Fatal("bad field")
			}
			b = b[m:]
		}
	}
	if ir != onnxIRVersion || opsetVersion != onnxOpset || len(graph) == 0 {
		t.Fatalf("ir_version %d, opset %d, graph %d bytes", ir, opsetVersion, len(graph))
	}
	// The graph holds the weight's raw little-endian bytes.
	if !bytes.Contains(graph, []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40}) {
		t.Error("raw_data of the weight not found in the graph")
	}
}

// protoFields returns the contents of every length-delimited field number field in b.
func protoFields(t testing.TB, b []byte, field protowire.Number) [][]byte {
	t.Helper()
	var out [][]byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatal("malformed protobuf tag")
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			t.Fatal("malformed protobuf field")
		}
		if typ == protowire.BytesType && num == field {
			v, _ := protowire.ConsumeBytes(b)
			out = append(out, v)
		}
		b = b[m:]
	}
	return out
}

// onnxOpCounts reads a model file and counts its graph's nodes by op type.
func onnxOpCounts(t testing.TB, path string) (map[string]int, int) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	graphs := protoFields(t, raw, 7)
	if len(graphs) != 1 {
		t.Fatalf("%s holds %d graphs", path, len(graphs))
	}
	counts := map[string]int{}
	nodes := protoFields(t, graphs[0], 1)
	for _, n := range nodes {
		op := protoFields(t, n, 4)
		if len(op) != 1 {
			t.Fatal("node without op_type")
		}
		counts[string(op[0])]++
	}
	return counts, len(nodes)
}

// TestLlamaGraphFusesInORT checks that ONNX Runtime's optimizer recognises the graph's
// patterns: every RMSNorm becomes one SimplifiedLayerNormalization, SiLU one kernel,
// and the key transpose folds into the attention MatMul. Losing a fusion costs speed
// without changing any result, so only this test notices.
func TestLlamaGraphFusesInORT(t *testing.T) {
	cfg := tinyTestConfig()
	dir := t.TempDir()
	if err := BuildLlamaONNX(cfg, RandomWeights(cfg, 1), dir); err != nil {
		t.Fatal(err)
	}
	builderTestInitORT(t)
	opt := filepath.Join(dir, "optimized.onnx")
	s, err := ort.NewSession(filepath.Join(dir, "model.onnx"), ort.SessionConfig{OptimizedModel: opt})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	counts, total := onnxOpCounts(t, opt)
	L := cfg.NumHiddenLayers
	if got := counts["SimplifiedLayerNormalization"]; got != 2*L+1 || counts["Pow"] != 0 {
		t.Errorf("RMSNorm not fused: %d SimplifiedLayerNormalization, %d Pow (ops %v)", got, counts["Pow"], counts)
	}
	if counts["Sigmoid"] != 0 {
		t.Errorf("SiLU not fused: %v", counts)
	}
	if counts["FusedMatMul"] != L {
		t.Errorf("key transpose not folded into the score MatMul: %v", counts)
	}
	// About 34 nodes per layer plus ~24 shared ones (embedding, mask, rotary, head).
	if limit := 36*L + 30; total > limit {
		t.Errorf("%d nodes after optimisation, want at most %d: %v", total, limit, counts)
	}
}
