package gguf

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// everyValue is metadata of every value type the format has, scalars and arrays, including
// empty ones, non-ASCII strings and arrays of arrays.
func everyValue() []KeyValue {
	return []KeyValue{
		{"general.architecture", scalar(TypeString, "llama")},
		{"llama.context_length", scalar(TypeUint32, uint32(4096))},
		{"llama.rope.freq_base", scalar(TypeFloat32, float32(500000))},
		{"v.u8", scalar(TypeUint8, uint8(255))},
		{"v.i8", scalar(TypeInt8, int8(-128))},
		{"v.u16", scalar(TypeUint16, uint16(65535))},
		{"v.i16", scalar(TypeInt16, int16(-32768))},
		{"v.u32", scalar(TypeUint32, uint32(math.MaxUint32))},
		{"v.i32", scalar(TypeInt32, int32(math.MinInt32))},
		{"v.i32pos", scalar(TypeInt32, int32(7))},
		{"v.u64", scalar(TypeUint64, uint64(math.MaxUint64))},
		{"v.i64", scalar(TypeInt64, int64(math.MinInt64))},
		{"v.f32", scalar(TypeFloat32, float32(-0.1))},
		{"v.f64", scalar(TypeFloat64, 1e300)},
		{"v.true", scalar(TypeBool, true)},
		{"v.false", scalar(TypeBool, false)},
		{"v.empty", scalar(TypeString, "")},
		{"v.utf8", scalar(TypeString, "▁ünï✓ 🙂")},
		{"a.u8", array(TypeUint8, []uint8{0, 1, 255})},
		{"a.i8", array(TypeInt8, []int8{-128, 0, 127})},
		{"a.u16", array(TypeUint16, []uint16{1, 65535})},
		{"a.i16", array(TypeInt16, []int16{-32768, 32767})},
		{"a.u32", array(TypeUint32, []uint32{0, math.MaxUint32})},
		{"a.i32", array(TypeInt32, []int32{1, 1, 3, 6})},
		{"a.u64", array(TypeUint64, []uint64{5, math.MaxUint64})},
		{"a.i64", array(TypeInt64, []int64{math.MinInt64, math.MaxInt64})},
		{"a.f32", array(TypeFloat32, []float32{0, -1.5, 3.25})},
		{"a.f64", array(TypeFloat64, []float64{1e-300, -2.5})},
		{"a.bool", array(TypeBool, []bool{true, false, true})},
		{"a.str", array(TypeString, []string{"<s>", "", "▁the"})},
		{"a.empty", array(TypeInt32, []int32{})},
		{"a.nested", array(TypeArray, []Value{
			array(TypeInt32, []int32{1, 2}),
			array(TypeString, []string{"x"}),
			array(TypeArray, []Value{array(TypeUint8, []uint8{})}),
		})},
	}
}

// fixtureTensors returns the ggml fixtures as tensors to write, plus a tensor of a type the
// package does not decode and one without elements.
func fixtureTensors(t *testing.T) []testTensor {
	var out []testTensor
	for _, fx := range fixtures {
		raw, _ := loadFixture(t, fx.name)
		dims := make([]uint64, len(fx.dims))
		for i, d := range fx.dims {
			dims[i] = uint64(d)
		}
		out = append(out, testTensor{name: "t." + fx.name, typ: fx.typ, dims: dims, data: raw})
	}
	out = append(out,
		testTensor{name: "blk.0.ffn_down.weight", typ: TypeIQ2_XXS, dims: []uint64{256, 2}, data: bytes.Repeat([]byte{7}, 2*66)},
		testTensor{name: "empty", typ: TypeF32, dims: []uint64{0, 5}},
	)
	return out
}

// TestRoundTrip writes files with every value type and a tensor of every supported type,
// in both versions and with the default and a custom alignment, and reads them back.
func TestRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name      string
		version   uint32
		alignment int64
	}{
		{"v3", 3, 0},
		{"v2", 2, 0},
		{"v3 aligned 64", 3, 64},
	} {
		t.Run(c.name, func(t *testing.T) {
			kvs := everyValue()
			if c.alignment != 0 {
				kvs = append(kvs, KeyValue{alignmentKey, scalar(TypeUint32, uint32(c.alignment))})
			}
			tensors := fixtureTensors(t)
			data := testFile{version: c.version, alignment: c.alignment, kvs: kvs, tensors: tensors}.bytes()
			f, err := NewFile(bytes.NewReader(data), int64(len(data)))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()

			if f.Version != c.version {
				t.Errorf("Version = %d, want %d", f.Version, c.version)
			}
			wantAlign := max(c.alignment, defaultAlignment)
			if f.Alignment != wantAlign || f.DataOffset%wantAlign != 0 {
				t.Errorf("Alignment %d, DataOffset %d; want alignment %d", f.Alignment, f.DataOffset, wantAlign)
			}
			checkMetadata(t, &f.Metadata, kvs)
			checkTensors(t, f, tensors, data)
		})
	}
}

func checkMetadata(t *testing.T, md *Metadata, kvs []KeyValue) {
	t.Helper()
	keys := make([]string, len(kvs))
	for i, kv := range kvs {
		keys[i] = kv.Key
	}
	if got := md.Keys(); !slices.Equal(got, keys) || md.Len() != len(kvs) {
		t.Fatalf("Keys() = %q, want %q", got, keys)
	}
	for _, kv := range kvs {
		v, ok := md.Value(kv.Key)
		if !ok || !reflect.DeepEqual(v, kv.Value) {
			t.Errorf("Value(%q) = %#v, %v; want %#v", kv.Key, v, ok, kv.Value)
		}
	}

	if a := md.Architecture(); a != "llama" {
		t.Errorf("Architecture() = %q", a)
	}
	for key, want := range map[string]uint64{
		"v.u8": 255, "v.u16": 65535, "v.u32": math.MaxUint32, "v.u64": math.MaxUint64,
		"v.i32pos": 7, "llama.context_length": 4096,
	} {
		if got, ok := md.Uint(key); !ok || got != want {
			t.Errorf("Uint(%q) = %d, %v; want %d", key, got, ok, want)
		}
	}
	for _, key := range []string{"v.i8", "v.i64", "v.f32", "v.utf8", "missing"} {
		if got, ok := md.Uint(key); ok {
			t.Errorf("Uint(%q) = %d, want not ok", key, got)
		}
	}
	if got, ok := md.Float("llama.rope.freq_base"); !ok || got != 500000 {
		t.Errorf("Float(freq_base) = %g, %v", got, ok)
	}
	if got, ok := md.Float("v.f64"); !ok || got != 1e300 {
		t.Errorf("Float(v.f64) = %g, %v", got, ok)
	}
	if _, ok := md.Float("v.u8"); ok {
		t.Error("Float of an integer is ok")
	}
	if got, ok := md.String("v.utf8"); !ok || got != "▁ünï✓ 🙂" {
		t.Errorf("String(v.utf8) = %q, %v", got, ok)
	}
	if got, ok := md.Bool("v.true"); !ok || !got {
		t.Errorf("Bool(v.true) = %v, %v", got, ok)
	}
	if got, ok := md.Strings("a.str"); !ok || !slices.Equal(got, []string{"<s>", "", "▁the"}) {
		t.Errorf("Strings(a.str) = %q, %v", got, ok)
	}
	if got, ok := md.Ints("a.i32"); !ok || !slices.Equal(got, []int64{1, 1, 3, 6}) {
		t.Errorf("Ints(a.i32) = %d, %v", got, ok)
	}
	if got, ok := md.Ints("a.i8"); !ok || !slices.Equal(got, []int64{-128, 0, 127}) {
		t.Errorf("Ints(a.i8) = %d, %v", got, ok)
	}
	if _, ok := md.Ints("a.u64"); ok {
		t.Error("Ints of a uint64 array holding 2^64-1 is ok")
	}
	if got, ok := md.Floats("a.f32"); !ok || !slices.Equal(got, []float64{0, -1.5, 3.25}) {
		t.Errorf("Floats(a.f32) = %g, %v", got, ok)
	}
	if _, ok := md.Strings("a.i32"); ok {
		t.Error("Strings of an int32 array is ok")
	}
	if v, _ := md.Value("a.nested"); v.Len() != 3 || v.ElemType() != TypeArray || v.String() != "[3]array" {
		t.Errorf("a.nested: Len %d, ElemType %s, String %q", v.Len(), v.ElemType(), v.String())
	}
	// The accessors hand out copies: changing one leaves the file's metadata as it was.
	s, _ := md.Strings("a.str")
	s[0] = "changed"
	if again, _ := md.Strings("a.str"); again[0] != "<s>" {
		t.Error("Strings returned the metadata's own slice")
	}
}

func checkTensors(t *testing.T, f *File, tensors []testTensor, data []byte) {
	t.Helper()
	infos := f.Tensors()
	if len(infos) != len(tensors) {
		t.Fatalf("%d tensors, want %d", len(infos), len(tensors))
	}
	for i, want := range tensors {
		got := infos[i]
		dims := make([]int64, len(want.dims))
		for j, d := range want.dims {
			dims[j] = int64(d)
		}
		if got.Name != want.name || got.Type != want.typ || !slices.Equal(got.Dims, dims) || got.Size != int64(len(want.data)) {
			t.Errorf("tensor %d = %+v, want %s %s %v of %d bytes", i, got, want.name, want.typ, dims, len(want.data))
		}
		if got.Offset%f.Alignment != 0 || !bytes.Equal(data[f.DataOffset+got.Offset:][:got.Size], want.data) {
			t.Errorf("tensor %s: offset %d does not hold its data", got.Name, got.Offset)
		}
		raw, err := f.ReadRaw(want.name)
		if err != nil || !bytes.Equal(raw, want.data) {
			t.Errorf("ReadRaw(%s) = %d bytes, %v; want the %d bytes written", want.name, len(raw), err, len(want.data))
		}
	}
	for _, fx := range fixtures {
		_, want := loadFixture(t, fx.name)
		got, err := f.ReadFloat32("t." + fx.name)
		if err != nil {
			t.Fatal(err)
		}
		sameBits(t, "ReadFloat32(t."+fx.name+")", got, want)
	}
	if got, err := f.ReadFloat32("empty"); err != nil || len(got) != 0 {
		t.Errorf("ReadFloat32(empty) = %d values, %v", len(got), err)
	}

	_, err := f.ReadFloat32("blk.0.ffn_down.weight")
	const want = "gguf: tensor blk.0.ffn_down.weight: type IQ2_XXS is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"
	if err == nil || err.Error() != want || !errors.Is(err, ErrUnsupported) {
		t.Errorf("ReadFloat32 of IQ2_XXS: %v\nwant %s", err, want)
	}
	if _, err := f.ReadRaw("missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadRaw(missing): %v", err)
	}
	if _, ok := f.Tensor("missing"); ok {
		t.Error("Tensor(missing) is ok")
	}
	// Tensors and Tensor hand out copies of the shapes.
	infos[0].Dims[0] = -1
	if t0, _ := f.Tensor(infos[0].Name); t0.Dims[0] == -1 {
		t.Error("Tensors returned the file's own Dims")
	}
}

// TestOpenPath opens a file from disk and checks that Close closes it.
func TestOpenPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "model.gguf")
	data := testFile{version: 3, kvs: everyValue(), tensors: fixtureTensors(t)}.bytes()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFloat32("t.q4_k"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadRaw("t.q4_k"); err == nil {
		t.Error("ReadRaw after Close succeeded")
	}

	if err := os.WriteFile(path, data[:100], 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Open(path)
	if err == nil || !strings.HasPrefix(err.Error(), "gguf: "+path+": ") || !errors.Is(err, ErrInvalid) {
		t.Errorf("Open of a truncated file: %v", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.gguf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open of a missing file: %v", err)
	}
}

// TestGGMLWrittenFile reads testdata/ggml.gguf, written by ggml's own GGUF writer
// (testdata/gen_fixtures.c): its metadata and every tensor must read back as ggml wrote and
// decodes them.
func TestGGMLWrittenFile(t *testing.T) {
	f, err := Open(filepath.Join("testdata", "ggml.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Version != 3 || f.Alignment != 32 || f.DataOffset%32 != 0 {
		t.Errorf("version %d, alignment %d, data offset %d", f.Version, f.Alignment, f.DataOffset)
	}

	md := &f.Metadata
	want := map[string]Value{
		"general.architecture":      scalar(TypeString, "llama"),
		"general.alignment":         scalar(TypeUint32, uint32(32)),
		"llama.context_length":      scalar(TypeUint32, uint32(4096)),
		"llama.rope.freq_base":      scalar(TypeFloat32, float32(10000)),
		"test.u8":                   scalar(TypeUint8, uint8(200)),
		"test.i8":                   scalar(TypeInt8, int8(-100)),
		"test.u16":                  scalar(TypeUint16, uint16(60000)),
		"test.i16":                  scalar(TypeInt16, int16(-30000)),
		"test.u32":                  scalar(TypeUint32, uint32(4000000000)),
		"test.i32":                  scalar(TypeInt32, int32(-2000000000)),
		"test.f32":                  scalar(TypeFloat32, float32(0.1)),
		"test.bool":                 scalar(TypeBool, true),
		"test.str":                  scalar(TypeString, "héllo wörld"),
		"test.u64":                  scalar(TypeUint64, uint64(9223372036854775813)),
		"test.i64":                  scalar(TypeInt64, int64(-4611686018427387904)),
		"test.f64":                  scalar(TypeFloat64, 3.141592653589793),
		"test.arr.u8":               array(TypeUint8, []uint8{1, 2, 255}),
		"test.arr.i8":               array(TypeInt8, []int8{-128, 0, 127}),
		"test.arr.u16":              array(TypeUint16, []uint16{0, 65535}),
		"test.arr.i16":              array(TypeInt16, []int16{-32768, 32767}),
		"test.arr.u32":              array(TypeUint32, []uint32{7, 4294967295}),
		"test.arr.i32":              array(TypeInt32, []int32{-1, 0, 7}),
		"test.arr.f32":              array(TypeFloat32, []float32{0.5, -1.25}),
		"test.arr.bool":             array(TypeBool, []bool{true, false, true}),
		"test.arr.u64":              array(TypeUint64, []uint64{18446744073709551615}),
		"test.arr.i64":              array(TypeInt64, []int64{math.MinInt64, 5}),
		"test.arr.f64":              array(TypeFloat64, []float64{1e-300, -2.5}),
		"test.arr.empty":            array(TypeInt32, []int32{}),
		"tokenizer.ggml.model":      scalar(TypeString, "llama"),
		"tokenizer.ggml.tokens":     array(TypeString, []string{"<s>", "</s>", "▁the", ""}),
		"tokenizer.ggml.scores":     array(TypeFloat32, []float32{0, 0, -1.5, -3.25}),
		"tokenizer.ggml.token_type": array(TypeInt32, []int32{3, 3, 1, 5}),
		"tokenizer.ggml.merges":     array(TypeString, []string{"▁ t", "h e"}),
	}
	if md.Len() != len(want) {
		t.Errorf("%d keys, want %d: %q", md.Len(), len(want), md.Keys())
	}
	for key, w := range want {
		if v, ok := md.Value(key); !ok || !reflect.DeepEqual(v, w) {
			t.Errorf("%s = %#v, want %#v", key, v, w)
		}
	}
	if types, ok := md.Ints("tokenizer.ggml.token_type"); !ok || !slices.Equal(types, []int64{3, 3, 1, 5}) {
		t.Errorf("Ints(token_type) = %d, %v", types, ok)
	}
	if scores, ok := md.Floats("tokenizer.ggml.scores"); !ok || !slices.Equal(scores, []float64{0, 0, -1.5, -3.25}) {
		t.Errorf("Floats(scores) = %g, %v", scores, ok)
	}

	infos := f.Tensors()
	if len(infos) != len(fixtures) {
		t.Fatalf("%d tensors, want %d", len(infos), len(fixtures))
	}
	for i, fx := range fixtures {
		info := infos[i]
		if info.Name != fx.name || info.Type != fx.typ || !slices.Equal(info.Dims, fx.dims) {
			t.Errorf("tensor %d = %s %s %v, want %s %s %v", i, info.Name, info.Type, info.Dims, fx.name, fx.typ, fx.dims)
		}
		raw, want := loadFixture(t, fx.name)
		got, err := f.ReadRaw(fx.name)
		if err != nil || !bytes.Equal(got, raw) {
			t.Errorf("ReadRaw(%s) = %d bytes, %v; want the fixture's %d", fx.name, len(got), err, len(raw))
		}
		values, err := f.ReadFloat32(fx.name)
		if err != nil {
			t.Fatal(err)
		}
		sameBits(t, "ReadFloat32("+fx.name+")", values, want)
	}
}

// TestReadFloat32Chunks decodes a tensor larger than one read chunk, so the chunked reading
// of ReadFloat32 is exercised across a chunk boundary.
func TestReadFloat32Chunks(t *testing.T) {
	raw, want := loadFixture(t, "q4_k")
	const copies = readChunkBytes/144 + 3 // more Q4_K blocks than one chunk holds
	var data []byte
	var values []float32
	for range copies/4 + 1 {
		data = append(data, raw...)
		values = append(values, want...)
	}
	file := testFile{version: 3, tensors: []testTensor{
		{name: "big", typ: TypeQ4_K, dims: []uint64{256, uint64(len(data) / 144)}, data: data},
	}}.bytes()
	f, err := NewFile(bytes.NewReader(file), int64(len(file)))
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(data)) <= readChunkBytes {
		t.Fatalf("tensor of %d bytes fits one chunk", len(data))
	}
	got, err := f.ReadFloat32("big")
	if err != nil {
		t.Fatal(err)
	}
	sameBits(t, "big", got, values)
}
