package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"sort"
)

const (
	// magic is the first four bytes of every GGUF file.
	magic = "GGUF"
	// defaultAlignment is the data alignment of a file without general.alignment.
	defaultAlignment = 32
	// alignmentKey names the metadata entry that overrides the alignment.
	alignmentKey = "general.alignment"
	// maxDims is ggml's GGML_MAX_DIMS.
	maxDims = 4
	// maxArrayDepth bounds the nesting of arrays in metadata. The format allows arrays of
	// arrays, which no model uses (ggml itself refuses them); the bound keeps a file of
	// nested empty arrays from recursing as deep as its size allows.
	maxArrayDepth = 8
	// minKVBytes is the smallest encoding of a key/value pair: the key's length (8), one
	// key byte, the value type (4) and a one-byte value.
	minKVBytes = 8 + 1 + 4 + 1
	// minTensorInfoBytes is the smallest encoding of a tensor info: the name's length (8),
	// the number of dimensions (4), the type (4) and the offset (8).
	minTensorInfoBytes = 8 + 4 + 4 + 8
)

// parser reads the header, metadata and tensor infos front to back. Every count and length
// is checked against the bytes left before anything is allocated for it, so a lying file
// costs at most a small multiple of its own size.
type parser struct {
	r       *bufio.Reader
	off     int64 // bytes consumed
	size    int64 // file size
	scratch [8]byte
}

// left returns the number of bytes not yet read.
func (p *parser) left() int64 { return p.size - p.off }

// fill reads len(b) bytes, returning io.ErrUnexpectedEOF when the file ends first.
func (p *parser) fill(b []byte) error {
	if int64(len(b)) > p.left() {
		return io.ErrUnexpectedEOF
	}
	n, err := io.ReadFull(p.r, b)
	p.off += int64(n)
	return err
}

// fail turns an error of fill into the error of reading the field called what.
func (p *parser) fail(err error, what string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return invalidf("file ends at byte %d, inside %s", p.size, what)
	}
	return fmt.Errorf("gguf: reading %s: %w", what, err)
}

// full reads len(b) bytes; what names the field in the error.
func (p *parser) full(b []byte, what string) error {
	return p.fail(p.fill(b), what)
}

// u8, u16, u32 and u64 read a little-endian unsigned integer; what names it in errors.
func (p *parser) u8(what string) (uint8, error) {
	err := p.full(p.scratch[:1], what)
	return p.scratch[0], err
}

func (p *parser) u16(what string) (uint16, error) {
	err := p.full(p.scratch[:2], what)
	return binary.LittleEndian.Uint16(p.scratch[:2]), err
}

func (p *parser) u32(what string) (uint32, error) {
	err := p.full(p.scratch[:4], what)
	return binary.LittleEndian.Uint32(p.scratch[:4]), err
}

func (p *parser) u64(what string) (uint64, error) {
	err := p.full(p.scratch[:8], what)
	return binary.LittleEndian.Uint64(p.scratch[:8]), err
}

// str reads a length-prefixed string, refusing a length beyond the bytes left. describe
// names the string in errors; it is called only when there is one, so that reading the
// hundreds of thousands of strings of a vocabulary formats no messages.
func (p *parser) str(describe func() string) (string, error) {
	if err := p.fill(p.scratch[:8]); err != nil {
		return "", p.fail(err, describe()+" length")
	}
	n := binary.LittleEndian.Uint64(p.scratch[:8])
	if n > uint64(p.left()) {
		return "", invalidf("%s has length %d but only %d bytes are left in the file", describe(), n, p.left())
	}
	if n <= uint64(p.r.Size()) {
		// Short strings are copied once, straight out of the buffer.
		b, err := p.r.Peek(int(n))
		if err != nil {
			return "", p.fail(err, describe())
		}
		s := string(b)
		p.r.Discard(len(b))
		p.off += int64(n)
		return s, nil
	}
	b := make([]byte, n)
	if err := p.fill(b); err != nil {
		return "", p.fail(err, describe())
	}
	return string(b), nil
}

// count reads a count of items of at least minBytes bytes each, refusing one the bytes left
// cannot hold.
func (p *parser) count(what string, minBytes int64) (int, error) {
	n, err := p.u64(what)
	if err != nil {
		return 0, err
	}
	if n > uint64(p.left()/minBytes) {
		return 0, invalidf("%s is %d but the %d bytes left in the file hold at most %d", what, n, p.left(), p.left()/minBytes)
	}
	if n > math.MaxInt {
		return 0, invalidf("%s is %d, more than this platform can index", what, n)
	}
	return int(n), nil
}

// file reads the header, the metadata and the tensor infos, and checks the tensors' extents.
func (p *parser) file() (*File, error) {
	var m [4]byte
	if p.size < 4 {
		return nil, invalidf("not a GGUF file: %d bytes", p.size)
	}
	if err := p.full(m[:], "magic"); err != nil {
		return nil, err
	}
	if string(m[:]) != magic {
		return nil, invalidf("not a GGUF file: magic %q, want %q", m[:], magic)
	}
	version, err := p.u32("version")
	if err != nil {
		return nil, err
	}
	switch {
	case version == 2 || version == 3:
	case version == 1:
		return nil, unsupportedf("GGUF version 1 is not supported (versions 2 and 3 are)")
	case version != 0 && version&0xFFFF == 0:
		return nil, unsupportedf("version field 0x%08x looks byte-swapped: big-endian GGUF files are not supported", version)
	default:
		return nil, unsupportedf("GGUF version %d is not supported (versions 2 and 3 are)", version)
	}
	f := &File{Version: version}

	nTensors, err := p.count("tensor count", minTensorInfoBytes)
	if err != nil {
		return nil, err
	}
	nKV, err := p.count("metadata count", minKVBytes)
	if err != nil {
		return nil, err
	}
	if err := p.metadata(&f.Metadata, nKV); err != nil {
		return nil, err
	}
	if f.Alignment, err = alignment(&f.Metadata); err != nil {
		return nil, err
	}
	if uint64(nTensors) > uint64(p.left()/minTensorInfoBytes) {
		return nil, invalidf("tensor count is %d but the %d bytes left after the metadata hold at most %d", nTensors, p.left(), p.left()/minTensorInfoBytes)
	}
	if err := p.tensorInfos(f, nTensors); err != nil {
		return nil, err
	}
	// The data section starts at the first aligned offset after the tensor infos.
	data := (uint64(p.off) + uint64(f.Alignment) - 1) &^ (uint64(f.Alignment) - 1)
	if nTensors > 0 && data > uint64(p.size) {
		return nil, invalidf("data section would start at byte %d, past the end of the file (%d bytes)", data, p.size)
	}
	if data > math.MaxInt64 {
		data = math.MaxInt64
	}
	f.DataOffset = int64(data)
	if err := checkExtents(f, p.size); err != nil {
		return nil, err
	}
	return f, nil
}

// metadata reads n key/value pairs into md.
func (p *parser) metadata(md *Metadata, n int) error {
	md.kvs = make([]KeyValue, 0, n)
	md.index = make(map[string]int, n)
	for i := range n {
		key, err := p.str(func() string { return fmt.Sprintf("metadata key %d", i) })
		if err != nil {
			return err
		}
		if key == "" {
			return invalidf("metadata key %d is empty", i)
		}
		shown := quoteKey(key)
		if _, dup := md.index[key]; dup {
			return invalidf("metadata key %s appears twice", shown)
		}
		t, err := p.u32("type of metadata key " + shown)
		if err != nil {
			return err
		}
		v, err := p.value(ValueType(t), shown, 0)
		if err != nil {
			return err
		}
		md.index[key] = len(md.kvs)
		md.kvs = append(md.kvs, KeyValue{Key: key, Value: v})
	}
	return nil
}

// value reads one value of type t for the key shown in errors as key; depth counts the arrays
// it is nested in.
func (p *parser) value(t ValueType, key string, depth int) (Value, error) {
	what := fmt.Sprintf("value of metadata key %s", key)
	var v any
	var err error
	switch t {
	case TypeUint8:
		v, err = p.u8(what)
	case TypeInt8:
		var x uint8
		x, err = p.u8(what)
		v = int8(x)
	case TypeUint16:
		v, err = p.u16(what)
	case TypeInt16:
		var x uint16
		x, err = p.u16(what)
		v = int16(x)
	case TypeUint32:
		v, err = p.u32(what)
	case TypeInt32:
		var x uint32
		x, err = p.u32(what)
		v = int32(x)
	case TypeUint64:
		v, err = p.u64(what)
	case TypeInt64:
		var x uint64
		x, err = p.u64(what)
		v = int64(x)
	case TypeFloat32:
		var x uint32
		x, err = p.u32(what)
		v = math.Float32frombits(x)
	case TypeFloat64:
		var x uint64
		x, err = p.u64(what)
		v = math.Float64frombits(x)
	case TypeBool:
		var x uint8
		x, err = p.u8(what)
		v = x != 0 // as ggml reads it: any nonzero byte is true
	case TypeString:
		v, err = p.str(func() string { return what })
	case TypeArray:
		return p.array(key, depth+1)
	default:
		return Value{}, invalidf("metadata key %s has unknown value type %d", key, uint32(t))
	}
	if err != nil {
		return Value{}, err
	}
	return Value{typ: t, v: v}, nil
}

// array reads an array's element type, length and elements, for the key shown in errors as
// key.
func (p *parser) array(key string, depth int) (Value, error) {
	if depth > maxArrayDepth {
		return Value{}, invalidf("metadata key %s nests arrays deeper than %d levels", key, maxArrayDepth)
	}
	et, err := p.u32(fmt.Sprintf("array type of metadata key %s", key))
	if err != nil {
		return Value{}, err
	}
	elem := ValueType(et)
	if !elem.valid() {
		return Value{}, invalidf("metadata key %s is an array of unknown value type %d", key, et)
	}
	minBytes := elem.fixedSize()
	switch elem {
	case TypeString:
		minBytes = 8
	case TypeArray:
		minBytes = 4 + 8
	}
	n, err := p.count(fmt.Sprintf("array length of metadata key %s", key), minBytes)
	if err != nil {
		return Value{}, err
	}
	out := Value{typ: TypeArray, elem: elem}
	switch elem {
	case TypeString:
		a := make([]string, n)
		for i := range a {
			if a[i], err = p.str(func() string { return fmt.Sprintf("element %d of metadata key %s", i, key) }); err != nil {
				return Value{}, err
			}
		}
		out.v = a
	case TypeArray:
		a := make([]Value, n)
		for i := range a {
			if a[i], err = p.array(key, depth+1); err != nil {
				return Value{}, err
			}
		}
		out.v = a
	default:
		raw := make([]byte, int64(n)*minBytes)
		if err := p.full(raw, fmt.Sprintf("array of metadata key %s", key)); err != nil {
			return Value{}, err
		}
		out.v = decodeScalars(elem, raw, n)
	}
	return out, nil
}

// decodeScalars converts n little-endian scalars of type t to a typed slice.
func decodeScalars(t ValueType, raw []byte, n int) any {
	le := binary.LittleEndian
	switch t {
	case TypeUint8:
		return raw
	case TypeInt8:
		return convert(n, func(i int) int8 { return int8(raw[i]) })
	case TypeBool:
		return convert(n, func(i int) bool { return raw[i] != 0 })
	case TypeUint16:
		return convert(n, func(i int) uint16 { return le.Uint16(raw[2*i:]) })
	case TypeInt16:
		return convert(n, func(i int) int16 { return int16(le.Uint16(raw[2*i:])) })
	case TypeUint32:
		return convert(n, func(i int) uint32 { return le.Uint32(raw[4*i:]) })
	case TypeInt32:
		return convert(n, func(i int) int32 { return int32(le.Uint32(raw[4*i:])) })
	case TypeFloat32:
		return convert(n, func(i int) float32 { return math.Float32frombits(le.Uint32(raw[4*i:])) })
	case TypeUint64:
		return convert(n, func(i int) uint64 { return le.Uint64(raw[8*i:]) })
	case TypeInt64:
		return convert(n, func(i int) int64 { return int64(le.Uint64(raw[8*i:])) })
	case TypeFloat64:
		return convert(n, func(i int) float64 { return math.Float64frombits(le.Uint64(raw[8*i:])) })
	}
	panic("gguf: decodeScalars called for " + t.String())
}

// convert returns the n values at(0), ..., at(n-1).
func convert[T any](n int, at func(int) T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = at(i)
	}
	return out
}

// alignment returns general.alignment, which must be a uint32 power of two, or the default.
func alignment(md *Metadata) (int64, error) {
	v, ok := md.Value(alignmentKey)
	if !ok {
		return defaultAlignment, nil
	}
	a, isU32 := v.v.(uint32)
	if !isU32 {
		return 0, invalidf("%s has type %s, want uint32", alignmentKey, v.typ)
	}
	if a == 0 || a&(a-1) != 0 {
		return 0, invalidf("%s is %d, not a power of two", alignmentKey, a)
	}
	return int64(a), nil
}

// tensorInfos reads n tensor infos into f.
func (p *parser) tensorInfos(f *File, n int) error {
	f.tensors = make([]TensorInfo, 0, n)
	f.byName = make(map[string]int, n)
	for i := range n {
		name, err := p.str(func() string { return fmt.Sprintf("name of tensor %d", i) })
		if err != nil {
			return err
		}
		if _, dup := f.byName[name]; dup {
			return invalidf("tensor %s appears twice", showName(name))
		}
		t, err := p.tensorInfo(name)
		if err != nil {
			return err
		}
		f.byName[name] = len(f.tensors)
		f.tensors = append(f.tensors, t)
	}
	return nil
}

// tensorInfo reads the shape, type and offset of the tensor called name and checks that
// its element count and byte size are representable.
func (p *parser) tensorInfo(name string) (TensorInfo, error) {
	t := TensorInfo{Name: name}
	name = showName(name)
	nDims, err := p.u32(fmt.Sprintf("dimension count of tensor %s", name))
	if err != nil {
		return t, err
	}
	if nDims > maxDims {
		return t, invalidf("tensor %s has %d dimensions, more than %d", name, nDims, maxDims)
	}
	t.Dims = make([]int64, nDims)
	elements := uint64(1)
	overflow, zero := false, false
	for j := range t.Dims {
		d, err := p.u64(fmt.Sprintf("dimension %d of tensor %s", j, name))
		if err != nil {
			return t, err
		}
		if d > math.MaxInt64 {
			return t, invalidf("tensor %s dimension %d is %d, more than 2^63-1", name, j, d)
		}
		t.Dims[j] = int64(d)
		zero = zero || d == 0
		if hi, lo := bits.Mul64(elements, d); hi != 0 || lo > math.MaxInt64 {
			overflow = true
		} else if !overflow {
			elements = lo
		}
	}
	typ, err := p.u32(fmt.Sprintf("type of tensor %s", name))
	if err != nil {
		return t, err
	}
	t.Type = GGMLType(typ)
	off, err := p.u64(fmt.Sprintf("offset of tensor %s", name))
	if err != nil {
		return t, err
	}
	if off > math.MaxInt64 {
		return t, invalidf("tensor %s has offset %d, more than 2^63-1", name, off)
	}
	t.Offset = int64(off)

	// A dimension of 0 makes the product 0 whatever the others are.
	if zero {
		elements = 0
	} else if overflow {
		return t, invalidf("tensor %s has shape %v, whose element count overflows int64", name, t.Dims)
	}
	if int(t.Type) >= len(typeTable) {
		return t, invalidf("tensor %s has unknown type id %d", name, typ)
	}
	if !t.Type.hasLayout() {
		return t, unsupportedf("tensor %s has type %s (id %d), a layout ggml has removed", name, t.Type, typ)
	}
	bv, bb := t.Type.BlockValues(), t.Type.BlockBytes()
	row := int64(1)
	if len(t.Dims) > 0 {
		row = t.Dims[0]
	}
	if row%bv != 0 {
		return t, invalidf("tensor %s of type %s has %d values per row, not a multiple of the block size %d", name, t.Type, row, bv)
	}
	blocks := int64(elements) / bv
	if blocks > math.MaxInt64/bb {
		return t, invalidf("tensor %s of type %s and shape %v has a byte size that overflows int64", name, t.Type, t.Dims)
	}
	t.Size = blocks * bb
	return t, nil
}

// checkExtents checks that every tensor lies, aligned, inside the data section of a file of
// size bytes, and that no two tensors share a byte.
func checkExtents(f *File, size int64) error {
	dataBytes := size - f.DataOffset
	for _, t := range f.tensors {
		if t.Offset%f.Alignment != 0 {
			return invalidf("tensor %s has offset %d, not a multiple of the alignment %d", showName(t.Name), t.Offset, f.Alignment)
		}
		if t.Offset > dataBytes || t.Size > dataBytes-t.Offset {
			return invalidf("tensor %s (%d bytes at data offset %d) extends past the end of the file (%d bytes of data)", showName(t.Name), t.Size, t.Offset, dataBytes)
		}
	}
	order := make([]int, 0, len(f.tensors))
	for i, t := range f.tensors {
		if t.Size > 0 {
			order = append(order, i)
		}
	}
	sort.Slice(order, func(a, b int) bool { return f.tensors[order[a]].Offset < f.tensors[order[b]].Offset })
	for k := 1; k < len(order); k++ {
		prev, cur := f.tensors[order[k-1]], f.tensors[order[k]]
		if prev.Offset+prev.Size > cur.Offset {
			return invalidf("tensors %s (bytes %d-%d) and %s (from byte %d) of the data section overlap", showName(prev.Name), prev.Offset, prev.Offset+prev.Size, showName(cur.Name), cur.Offset)
		}
	}
	return nil
}
