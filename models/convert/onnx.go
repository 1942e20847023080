package convert

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/conveyor-llm/conveyor/kvcache"
	"google.golang.org/protobuf/encoding/protowire"
)

// This file writes ONNX models (onnx.proto, IR version 8) with protowire, without
// generated code. Only the messages and fields Conveyor needs are modelled. Large
// float tensors are never copied into the encoded message: the encoder keeps them as
// references and streams them to the file, so a model needs no second in-memory copy.

// ONNX TensorProto.DataType values.
const (
	onnxFloat   int32 = 1
	onnxUint8   int32 = 2
	onnxInt8    int32 = 3
	onnxInt32   int32 = 6
	onnxInt64   int32 = 7
	onnxBool    int32 = 9
	onnxFloat16 int32 = 10
	onnxBF16    int32 = 16
)

// ONNX AttributeProto.AttributeType values.
const (
	attrFloat  int32 = 1
	attrInt    int32 = 2
	attrString int32 = 3
	attrTensor int32 = 4
	attrFloats int32 = 6
	attrInts   int32 = 7
)

// onnxIRVersion is the ONNX IR version written (IR 8 goes with opset 17).
const onnxIRVersion = 8

// onnxOpset is the ai.onnx operator set version the graphs use.
const onnxOpset = 17

// onnxModel is a ModelProto.
type onnxModel struct {
	IRVersion       int64
	Opsets          []onnxOpsetID
	ProducerName    string
	ProducerVersion string
	DocString       string
	Graph           *onnxGraph
	Metadata        [][2]string // metadata_props key/value pairs
}

// onnxOpsetID is an OperatorSetIdProto; Domain "" is ai.onnx.
type onnxOpsetID struct {
	Domain  string
	Version int64
}

// onnxGraph is a GraphProto.
type onnxGraph struct {
	Name         string
	Nodes        []*onnxNode
	Initializers []*onnxTensor
	Inputs       []onnxValueInfo
	Outputs      []onnxValueInfo
}

// onnxNode is a NodeProto.
type onnxNode struct {
	Name    string
	OpType  string
	Domain  string
	Inputs  []string
	Outputs []string
	Attrs   []onnxAttr
}

// onnxAttr is an AttributeProto; Type selects which value field is used.
type onnxAttr struct {
	Name   string
	Type   int32
	F      float32
	I      int64
	S      string
	T      *onnxTensor
	Floats []float32
	Ints   []int64
}

func attrI(name string, v int64) onnxAttr { return onnxAttr{Name: name, Type: attrInt, I: v} }
func attrF(name string, v float32) onnxAttr {
	return onnxAttr{Name: name, Type: attrFloat, F: v}
}
func attrIntList(name string, v ...int64) onnxAttr {
	return onnxAttr{Name: name, Type: attrInts, Ints: v}
}

// onnxTensor is a TensorProto. Exactly one of F32 (float32 values), Gen (a function
// filling in the float32 values when the tensor is written, into one scratch buffer
// the writer reuses, so that derived weights are never all in memory at once and
// leave no garbage behind) and Raw (encoded little-endian bytes) holds the data.
type onnxTensor struct {
	Name     string
	Dims     []int64
	DataType int32
	F32      []float32
	Gen      func(dst []float32)
	Raw      []byte
	// Half, when onnxFloat16 or onnxBF16, stores the float32 values of F32 or Gen in that
	// 16-bit type (DataType is then Half), converted as they are written.
	Half int32

	// Set by the writer when the data lives in the external data file.
	external       bool
	extOffsetBytes int64
}

// dataBytes returns the size of t's data in bytes.
func (t *onnxTensor) dataBytes() int64 {
	elem := int64(4)
	if t.Half != 0 {
		elem = 2
	}
	switch {
	case t.F32 != nil:
		return elem * int64(len(t.F32))
	case t.Gen != nil:
		n := elem
		for _, d := range t.Dims {
			n *= d
		}
		return n
	}
	return int64(len(t.Raw))
}

// values returns t's float32 values: F32, or Gen's output in scratch.
func (t *onnxTensor) values(scratch *[]float32) []float32 {
	if t.F32 != nil {
		return t.F32
	}
	n := 1
	for _, d := range t.Dims {
		n *= int(d)
	}
	if cap(*scratch) < n {
		*scratch = make([]float32, n)
	}
	vs := (*scratch)[:n]
	t.Gen(vs)
	return vs
}

// writeData writes t's data as little-endian bytes; scratch is the buffer generated
// tensors are computed in (grown as needed, kept for the next one).
func (t *onnxTensor) writeData(w io.Writer, scratch *[]float32) error {
	if t.F32 == nil && t.Gen == nil {
		_, err := w.Write(t.Raw)
		return err
	}
	vs := t.values(scratch)
	if t.Half != 0 {
		return writeHalfs(w, vs, t.Half)
	}
	return writeFloat32s(w, vs)
}

// writeHalfs writes vs as little-endian float16 or bfloat16 (typ).
func writeHalfs(w io.Writer, vs []float32, typ int32) error {
	conv := kvcache.Float32ToFloat16
	if typ == onnxBF16 {
		conv = float32ToBF16
	}
	var buf [4096]byte
	for len(vs) > 0 {
		n := min(len(vs), len(buf)/2)
		for i, v := range vs[:n] {
			binary.LittleEndian.PutUint16(buf[2*i:], conv(v))
		}
		if _, err := w.Write(buf[:2*n]); err != nil {
			return err
		}
		vs = vs[n:]
	}
	return nil
}

// onnxDim is one dimension of a ValueInfo shape: a fixed size or a symbolic name.
type onnxDim struct {
	Value int64
	Param string
}

// onnxValueInfo is a ValueInfoProto for a tensor.
type onnxValueInfo struct {
	Name     string
	ElemType int32
	Dims     []onnxDim
}

// pbEncoder builds a protobuf message as a list of parts so that big float arrays are
// referenced, not copied. Nested messages are encoded separately and spliced in.
type pbEncoder struct {
	parts []pbPart
	buf   []byte
	size  int64 // bytes in parts (not counting buf)
}

// pbPart is a run of encoded bytes or a tensor's data, written when the message is.
type pbPart struct {
	b []byte
	t *onnxTensor
}

func (e *pbEncoder) flush() {
	if len(e.buf) > 0 {
		e.parts = append(e.parts, pbPart{b: e.buf})
		e.size += int64(len(e.buf))
		e.buf = nil
	}
}

// len returns the encoded size in bytes.
func (e *pbEncoder) len() int64 { return e.size + int64(len(e.buf)) }

func (e *pbEncoder) varint(field protowire.Number, v uint64) {
	e.buf = protowire.AppendTag(e.buf, field, protowire.VarintType)
	e.buf = protowire.AppendVarint(e.buf, v)
}

func (e *pbEncoder) int64(field protowire.Number, v int64) { e.varint(field, uint64(v)) }

func (e *pbEncoder) float32(field protowire.Number, v float32) {
	e.buf = protowire.AppendTag(e.buf, field, protowire.Fixed32Type)
	e.buf = protowire.AppendFixed32(e.buf, math.Float32bits(v))
}

func (e *pbEncoder) str(field protowire.Number, s string) {
	e.buf = protowire.AppendTag(e.buf, field, protowire.BytesType)
	e.buf = protowire.AppendString(e.buf, s)
}

func (e *pbEncoder) bytes(field protowire.Number, b []byte) {
	e.buf = protowire.AppendTag(e.buf, field, protowire.BytesType)
	e.buf = protowire.AppendBytes(e.buf, b)
}

// packedInt64 writes a packed repeated int64 field.
func (e *pbEncoder) packedInt64(field protowire.Number, vs []int64) {
	var p []byte
	for _, v := range vs {
		p = protowire.AppendVarint(p, uint64(v))
	}
	e.bytes(field, p)
}

// packedFloat32 writes a packed repeated float field (small arrays only).
func (e *pbEncoder) packedFloat32(field protowire.Number, vs []float32) {
	p := make([]byte, 0, 4*len(vs))
	for _, v := range vs {
		p = protowire.AppendFixed32(p, math.Float32bits(v))
	}
	e.bytes(field, p)
}

// tensorData writes a bytes field holding t's data, keeping a reference to t instead
// of encoding the data now.
func (e *pbEncoder) tensorData(field protowire.Number, t *onnxTensor) {
	n := t.dataBytes()
	e.buf = protowire.AppendTag(e.buf, field, protowire.BytesType)
	e.buf = protowire.AppendVarint(e.buf, uint64(n))
	e.flush()
	e.parts = append(e.parts, pbPart{t: t})
	e.size += n
}

// message splices the nested message m in as field.
func (e *pbEncoder) message(field protowire.Number, m *pbEncoder) {
	e.buf = protowire.AppendTag(e.buf, field, protowire.BytesType)
	e.buf = protowire.AppendVarint(e.buf, uint64(m.len()))
	e.flush()
	m.flush()
	e.parts = append(e.parts, m.parts...)
	e.size += m.size
}

// writeTo streams the encoded message to w, generating tensors in scratch.
func (e *pbEncoder) writeTo(w io.Writer, scratch *[]float32) error {
	e.flush()
	for _, p := range e.parts {
		if p.t != nil {
			if err := p.t.writeData(w, scratch); err != nil {
				return err
			}
			continue
		}
		if _, err := w.Write(p.b); err != nil {
			return err
		}
	}
	return nil
}

// writeFloat32s writes vs to w as little-endian float32 values.
func writeFloat32s(w io.Writer, vs []float32) error {
	var buf [16 << 10]byte
	for len(vs) > 0 {
		n := min(len(vs), len(buf)/4)
		for i, v := range vs[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
		}
		if _, err := w.Write(buf[:4*n]); err != nil {
			return err
		}
		vs = vs[n:]
	}
	return nil
}

func encodeModel(m *onnxModel, dataFile string) *pbEncoder {
	e := &pbEncoder{}
	e.int64(1, m.IRVersion)
	if m.ProducerName != "" {
		e.str(2, m.ProducerName)
	}
	if m.ProducerVersion != "" {
		e.str(3, m.ProducerVersion)
	}
	if m.DocString != "" {
		e.str(6, m.DocString)
	}
	e.message(7, encodeGraph(m.Graph, dataFile))
	for _, o := range m.Opsets {
		oe := &pbEncoder{}
		if o.Domain != "" {
			oe.str(1, o.Domain)
		}
		oe.int64(2, o.Version)
		e.message(8, oe)
	}
	for _, kv := range m.Metadata {
		me := &pbEncoder{}
		me.str(1, kv[0])
		me.str(2, kv[1])
		e.message(14, me)
	}
	return e
}

func encodeGraph(g *onnxGraph, dataFile string) *pbEncoder {
	e := &pbEncoder{}
	for _, n := range g.Nodes {
		e.message(1, encodeNode(n, dataFile))
	}
	e.str(2, g.Name)
	for _, t := range g.Initializers {
		e.message(5, encodeTensor(t, dataFile))
	}
	for _, v := range g.Inputs {
		e.message(11, encodeValueInfo(v))
	}
	for _, v := range g.Outputs {
		e.message(12, encodeValueInfo(v))
	}
	return e
}

func encodeNode(n *onnxNode, dataFile string) *pbEncoder {
	e := &pbEncoder{}
	for _, in := range n.Inputs {
		e.str(1, in)
	}
	for _, out := range n.Outputs {
		e.str(2, out)
	}
	if n.Name != "" {
		e.str(3, n.Name)
	}
	e.str(4, n.OpType)
	for _, a := range n.Attrs {
		e.message(5, encodeAttr(a, dataFile))
	}
	if n.Domain != "" {
		e.str(7, n.Domain)
	}
	return e
}

func encodeAttr(a onnxAttr, dataFile string) *pbEncoder {
	e := &pbEncoder{}
	e.str(1, a.Name)
	switch a.Type {
	case attrFloat:
		e.float32(2, a.F)
	case attrInt:
		e.int64(3, a.I)
	case attrString:
		e.str(4, a.S)
	case attrTensor:
		e.message(5, encodeTensor(a.T, dataFile))
	case attrFloats:
		e.packedFloat32(7, a.Floats)
	case attrInts:
		e.packedInt64(8, a.Ints)
	}
	e.int64(20, int64(a.Type))
	return e
}

func encodeTensor(t *onnxTensor, dataFile string) *pbEncoder {
	e := &pbEncoder{}
	if len(t.Dims) > 0 {
		e.packedInt64(1, t.Dims)
	}
	e.int64(2, int64(t.DataType))
	e.str(8, t.Name)
	if t.external {
		for _, kv := range [][2]string{
			{"location", dataFile},
			{"offset", fmt.Sprint(t.extOffsetBytes)},
			{"length", fmt.Sprint(t.dataBytes())},
		} {
			ke := &pbEncoder{}
			ke.str(1, kv[0])
			ke.str(2, kv[1])
			e.message(13, ke)
		}
		e.int64(14, 1) // data_location = EXTERNAL
		return e
	}
	e.tensorData(9, t)
	return e
}

func encodeValueInfo(v onnxValueInfo) *pbEncoder {
	shape := &pbEncoder{}
	for _, d := range v.Dims {
		de := &pbEncoder{}
		if d.Param != "" {
			de.str(2, d.Param)
		} else {
			de.int64(1, d.Value)
		}
		shape.message(1, de)
	}
	tt := &pbEncoder{}
	tt.int64(1, int64(v.ElemType))
	tt.message(2, shape)
	typ := &pbEncoder{}
	typ.message(1, tt)
	e := &pbEncoder{}
	e.str(1, v.Name)
	e.message(2, typ)
	return e
}

// maxInlineModelBytes is the most initializer data a model.onnx holds itself; protobuf
// messages cannot exceed 2 GiB, so beyond this the weights go to an external file.
const maxInlineModelBytes = 1800 << 20

// minExternalTensorBytes is the smallest tensor moved to the external data file;
// smaller ones (norm weights, shape constants) stay inline.
const minExternalTensorBytes = 1024

// externalAlignBytes aligns each tensor in the external data file so that ONNX
// Runtime can map it directly.
const externalAlignBytes = 4096

// writeOptions controls where writeONNXModel puts tensor data.
type writeOptions struct {
	// externalAboveBytes moves data to an external file when the model's total
	// initializer bytes exceed it (0 = maxInlineModelBytes; negative = always).
	externalAboveBytes int64
	// scratch, when set, is the buffer generated tensors are computed in, shared by
	// every model one build writes (so that no model leaves one behind as garbage).
	scratch *[]float32
}

// writeONNXModel writes m to dir/name, and its large initializers to
// dir/name+".data" when the model is too big to hold them inline. It returns the paths
// written.
func writeONNXModel(m *onnxModel, dir, name string, opts writeOptions) ([]string, error) {
	scratch := opts.scratch
	if scratch == nil {
		scratch = new([]float32)
	}
	limit := opts.externalAboveBytes
	if limit == 0 {
		limit = maxInlineModelBytes
	}
	var total int64
	for _, t := range m.Graph.Initializers {
		total += t.dataBytes()
	}
	path := filepath.Join(dir, name)
	dataName := name + ".data"
	dataPath := filepath.Join(dir, dataName)
	written := []string{path}
	useExternal := limit < 0 || total > limit
	for _, t := range m.Graph.Initializers {
		t.external = false
	}
	if useExternal {
		var off int64
		for _, t := range m.Graph.Initializers {
			if t.dataBytes() < minExternalTensorBytes {
				continue
			}
			off = (off + externalAlignBytes - 1) / externalAlignBytes * externalAlignBytes
			t.external, t.extOffsetBytes = true, off
			off += t.dataBytes()
		}
		if err := writeExternalData(dataPath, m.Graph.Initializers, scratch); err != nil {
			return nil, err
		}
		written = append(written, dataPath)
	} else if err := os.Remove(dataPath); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("models: remove stale %s: %w", dataPath, err)
	}
	enc := encodeModel(m, dataName)
	if enc.len() >= math.MaxInt32 {
		return nil, fmt.Errorf("models: encoded model is %d bytes, over the 2 GiB protobuf limit", enc.len())
	}
	if err := writeFileAtomic(path, func(w io.Writer) error { return enc.writeTo(w, scratch) }); err != nil {
		return nil, err
	}
	return written, nil
}

// writeExternalData writes the external tensors' data at their offsets.
func writeExternalData(path string, ts []*onnxTensor, scratch *[]float32) error {
	return writeFileAtomic(path, func(w io.Writer) error {
		var off int64
		zeros := make([]byte, externalAlignBytes)
		for _, t := range ts {
			if !t.external {
				continue
			}
			if pad := t.extOffsetBytes - off; pad > 0 {
				if _, err := w.Write(zeros[:pad]); err != nil {
					return err
				}
			}
			if err := t.writeData(w, scratch); err != nil {
				return err
			}
			off = t.extOffsetBytes + t.dataBytes()
		}
		return nil
	})
}

// writeFileAtomic writes path through a temporary file in the same directory and
// renames it into place, so a failed build never leaves a truncated file behind.
func writeFileAtomic(path string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("models: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("models: %w", err)
	}
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err := write(bw); err != nil {
		tmp.Close()
		return fmt.Errorf("models: write %s: %w", path, err)
	}
	if err := bw.Flush(); err != nil {
		tmp.Close()
		return fmt.Errorf("models: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("models: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("models: %w", err)
	}
	return nil
}
