package gguf

import (
	"fmt"
	"math"
	"slices"
)

// ValueType is the type of a metadata value as stored in the file (gguf_type).
type ValueType uint32

// The metadata value types of the GGUF format.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{
	TypeUint8: "uint8", TypeInt8: "int8", TypeUint16: "uint16", TypeInt16: "int16",
	TypeUint32: "uint32", TypeInt32: "int32", TypeFloat32: "float32", TypeBool: "bool",
	TypeString: "string", TypeArray: "array", TypeUint64: "uint64", TypeInt64: "int64",
	TypeFloat64: "float64",
}

// String returns the type's name ("uint32", "array"), or "value_type(N)" for an id the
// format does not define.
func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("value_type(%d)", uint32(t))
}

// valid reports whether the format defines the type.
func (t ValueType) valid() bool {
	return int(t) < len(valueTypeNames)
}

// fixedSize returns the size in bytes of a scalar of the type, or 0 for strings and arrays,
// whose size depends on their content.
func (t ValueType) fixedSize() int64 {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// Value is one metadata value. A scalar holds the Go type of its ValueType (uint8 for
// TypeUint8, ..., float64 for TypeFloat64, bool, string); an array holds a slice of its
// element type ([]uint8, ..., []string), or []Value when its elements are arrays themselves.
type Value struct {
	typ  ValueType
	elem ValueType // the element type, for arrays
	v    any
}

// Type returns the value's type; TypeArray for an array.
func (v Value) Type() ValueType { return v.typ }

// ElemType returns the type of an array's elements (TypeArray for an array of arrays); it is
// meaningless for a scalar.
func (v Value) ElemType() ValueType { return v.elem }

// Any returns the value as a Go value: uint8, int8, uint16, int16, uint32, int32, uint64,
// int64, float32, float64, bool or string for a scalar, and []T of those (or []Value for an
// array of arrays) for an array. Slices are shared with the File: do not modify them.
func (v Value) Any() any { return v.v }

// Len returns the number of elements of an array, and 0 for a scalar.
func (v Value) Len() int {
	if v.typ != TypeArray {
		return 0
	}
	switch a := v.v.(type) {
	case []uint8:
		return len(a)
	case []int8:
		return len(a)
	case []uint16:
		return len(a)
	case []int16:
		return len(a)
	case []uint32:
		return len(a)
	case []int32:
		return len(a)
	case []uint64:
		return len(a)
	case []int64:
		return len(a)
	case []float32:
		return len(a)
	case []float64:
		return len(a)
	case []bool:
		return len(a)
	case []string:
		return len(a)
	case []Value:
		return len(a)
	}
	return 0
}

// String returns the value in a form for logs: the scalar, or the array's element type and
// length.
func (v Value) String() string {
	if v.typ == TypeArray {
		return fmt.Sprintf("[%d]%s", v.Len(), v.elem)
	}
	return fmt.Sprint(v.v)
}

// KeyValue is one metadata entry.
type KeyValue struct {
	Key   string
	Value Value
}

// Metadata holds a file's key/value pairs in file order, with typed accessors. The accessors
// return ok == false when the key is missing or its value has another type; the zero
// Metadata is empty.
type Metadata struct {
	kvs   []KeyValue
	index map[string]int
}

// Len returns the number of key/value pairs.
func (m *Metadata) Len() int { return len(m.kvs) }

// Keys returns the keys in file order.
func (m *Metadata) Keys() []string {
	keys := make([]string, len(m.kvs))
	for i, kv := range m.kvs {
		keys[i] = kv.Key
	}
	return keys
}

// Value returns the value stored under key.
func (m *Metadata) Value(key string) (Value, bool) {
	i, ok := m.index[key]
	if !ok {
		return Value{}, false
	}
	return m.kvs[i].Value, true
}

// String returns a string value.
func (m *Metadata) String(key string) (string, bool) {
	v, ok := m.Value(key)
	if !ok || v.typ != TypeString {
		return "", false
	}
	return v.v.(string), true
}

// Uint returns an integer value of any width and signedness, widened to uint64; a negative
// signed value is reported as not ok.
func (m *Metadata) Uint(key string) (uint64, bool) {
	v, ok := m.Value(key)
	if !ok {
		return 0, false
	}
	switch x := v.v.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	case int8, int16, int32, int64:
		i, _ := signedOf(x)
		if i < 0 {
			return 0, false
		}
		return uint64(i), true
	}
	return 0, false
}

// Float returns a float32 or float64 value, widened to float64.
func (m *Metadata) Float(key string) (float64, bool) {
	v, ok := m.Value(key)
	if !ok {
		return 0, false
	}
	switch x := v.v.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// Bool returns a bool value.
func (m *Metadata) Bool(key string) (bool, bool) {
	v, ok := m.Value(key)
	if !ok || v.typ != TypeBool {
		return false, false
	}
	return v.v.(bool), true
}

// Strings returns a copy of an array of strings, such as tokenizer.ggml.tokens or
// tokenizer.ggml.merges.
func (m *Metadata) Strings(key string) ([]string, bool) {
	v, ok := m.Value(key)
	if !ok {
		return nil, false
	}
	a, ok := v.v.([]string)
	if !ok {
		return nil, false
	}
	return slices.Clone(a), true
}

// Ints returns an array of integers of any width and signedness (tokenizer.ggml.token_type),
// widened to int64; an array holding a uint64 above math.MaxInt64 is reported as not ok.
func (m *Metadata) Ints(key string) ([]int64, bool) {
	v, ok := m.Value(key)
	if !ok {
		return nil, false
	}
	switch a := v.v.(type) {
	case []uint8:
		return widen(a), true
	case []int8:
		return widen(a), true
	case []uint16:
		return widen(a), true
	case []int16:
		return widen(a), true
	case []uint32:
		return widen(a), true
	case []int32:
		return widen(a), true
	case []int64:
		return slices.Clone(a), true
	case []uint64:
		out := make([]int64, len(a))
		for i, x := range a {
			if x > math.MaxInt64 {
				return nil, false
			}
			out[i] = int64(x)
		}
		return out, true
	}
	return nil, false
}

// Floats returns an array of float32 or float64 values (tokenizer.ggml.scores), widened to
// float64.
func (m *Metadata) Floats(key string) ([]float64, bool) {
	v, ok := m.Value(key)
	if !ok {
		return nil, false
	}
	switch a := v.v.(type) {
	case []float32:
		out := make([]float64, len(a))
		for i, x := range a {
			out[i] = float64(x)
		}
		return out, true
	case []float64:
		return slices.Clone(a), true
	}
	return nil, false
}

// Architecture returns general.architecture ("llama", "qwen2"), the prefix of the model's
// hyperparameter keys, or "" when the file has none.
func (m *Metadata) Architecture() string {
	s, _ := m.String("general.architecture")
	return s
}

// signedOf returns a signed scalar widened to int64.
func signedOf(x any) (int64, bool) {
	switch i := x.(type) {
	case int8:
		return int64(i), true
	case int16:
		return int64(i), true
	case int32:
		return int64(i), true
	case int64:
		return i, true
	}
	return 0, false
}

// widen converts an array of integers that all fit int64.
func widen[T uint8 | int8 | uint16 | int16 | uint32 | int32](a []T) []int64 {
	out := make([]int64, len(a))
	for i, x := range a {
		out[i] = int64(x)
	}
	return out
}
