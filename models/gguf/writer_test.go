package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
)

// enc appends little-endian GGUF fields to a byte slice. Tests use it directly to build
// malformed files field by field, and through testFile to build well-formed ones.
type enc struct{ b []byte }

func (e *enc) u8(v uint8) *enc   { e.b = append(e.b, v); return e }
func (e *enc) u16(v uint16) *enc { e.b = binary.LittleEndian.AppendUint16(e.b, v); return e }
func (e *enc) u32(v uint32) *enc { e.b = binary.LittleEndian.AppendUint32(e.b, v); return e }
func (e *enc) u64(v uint64) *enc { e.b = binary.LittleEndian.AppendUint64(e.b, v); return e }
func (e *enc) str(s string) *enc { e.u64(uint64(len(s))); e.b = append(e.b, s...); return e }
func (e *enc) raw(b []byte) *enc { e.b = append(e.b, b...); return e }

// header appends the magic, the version and the two counts.
func (e *enc) header(version uint32, nTensors, nKV uint64) *enc {
	e.b = append(e.b, "GGUF"...)
	return e.u32(version).u64(nTensors).u64(nKV)
}

// payload appends a value without its type: a scalar's bytes, or an array's element type,
// length and elements.
func (e *enc) payload(v Value) *enc {
	switch x := v.v.(type) {
	case uint8:
		e.u8(x)
	case int8:
		e.u8(uint8(x))
	case uint16:
		e.u16(x)
	case int16:
		e.u16(uint16(x))
	case uint32:
		e.u32(x)
	case int32:
		e.u32(uint32(x))
	case uint64:
		e.u64(x)
	case int64:
		e.u64(uint64(x))
	case float32:
		e.u32(math.Float32bits(x))
	case float64:
		e.u64(math.Float64bits(x))
	case bool:
		if x {
			e.u8(1)
		} else {
			e.u8(0)
		}
	case string:
		e.str(x)
	default:
		// An array: a typed slice, or []Value for an array of arrays.
		rv := reflect.ValueOf(v.v)
		if rv.Kind() != reflect.Slice {
			panic(fmt.Sprintf("test writer: cannot encode %T", v.v))
		}
		e.u32(uint32(v.elem)).u64(uint64(rv.Len()))
		for i := range rv.Len() {
			item := rv.Index(i).Interface()
			if inner, ok := item.(Value); ok {
				e.payload(inner)
			} else {
				e.payload(Value{typ: v.elem, v: item})
			}
		}
	}
	return e
}

// kv appends a key, its value type and its value.
func (e *enc) kv(key string, v Value) *enc {
	return e.str(key).u32(uint32(v.typ)).payload(v)
}

// scalar and array build Values the way the reader returns them.
func scalar(t ValueType, v any) Value { return Value{typ: t, v: v} }
func array(elem ValueType, v any) Value {
	return Value{typ: TypeArray, elem: elem, v: v}
}

// testTensor is one tensor for testFile, placed at offset when fixed is set and at the next
// aligned offset otherwise.
type testTensor struct {
	name   string
	typ    GGMLType
	dims   []uint64
	data   []byte
	fixed  bool
	offset int64
}

// testFile describes a GGUF file to write. The alignment lays out the data section; it is
// written to the metadata only if a general.alignment entry is among kvs.
type testFile struct {
	version   uint32
	alignment int64
	kvs       []KeyValue
	tensors   []testTensor
}

// bytes encodes the file: header, metadata, tensor infos, padding and the tensors' data at
// their offsets, with no padding after the last tensor.
func (tf testFile) bytes() []byte {
	align := tf.alignment
	if align == 0 {
		align = defaultAlignment
	}
	offsets := make([]int64, len(tf.tensors))
	next := int64(0)
	for i, t := range tf.tensors {
		if t.fixed {
			offsets[i] = t.offset
		} else {
			offsets[i] = next
		}
		end := offsets[i] + int64(len(t.data))
		next = max(next, (end+align-1)/align*align)
	}

	e := &enc{}
	e.header(tf.version, uint64(len(tf.tensors)), uint64(len(tf.kvs)))
	for _, kv := range tf.kvs {
		e.kv(kv.Key, kv.Value)
	}
	for i, t := range tf.tensors {
		e.str(t.name).u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			e.u64(d)
		}
		e.u32(uint32(t.typ)).u64(uint64(offsets[i]))
	}
	for int64(len(e.b))%align != 0 {
		e.u8(0)
	}
	data := int64(len(e.b))
	for i, t := range tf.tensors {
		at := data + offsets[i]
		for int64(len(e.b)) < at+int64(len(t.data)) {
			e.u8(0)
		}
		copy(e.b[at:], t.data)
	}
	return e.b
}
