package gguf

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"
)

// hdr starts a version 3 file with the given counts.
func hdr(nTensors, nKV uint64) *enc { return (&enc{}).header(3, nTensors, nKV) }

// f32Tensor is a version 3 file with one F32 tensor info of the given shape and offset,
// padded to the data section, followed by dataBytes bytes of data.
func f32Tensor(dims []uint64, offset uint64, dataBytes int) []byte {
	return tensorFile(TypeF32, dims, offset, dataBytes)
}

func tensorFile(typ GGMLType, dims []uint64, offset uint64, dataBytes int) []byte {
	e := hdr(1, 0).str("w").u32(uint32(len(dims)))
	for _, d := range dims {
		e.u64(d)
	}
	e.u32(uint32(typ)).u64(offset)
	for len(e.b)%defaultAlignment != 0 {
		e.u8(0)
	}
	return e.raw(make([]byte, dataBytes)).b
}

// nested returns an array value nested depth levels deep.
func nested(depth int) Value {
	v := array(TypeUint8, []uint8{})
	for range depth - 1 {
		v = array(TypeArray, []Value{v})
	}
	return v
}

// TestMalformed feeds files that are wrong in one way each: every one must be refused with
// one line that starts with "gguf: ", wraps ErrInvalid or ErrUnsupported and says what is
// wrong, and reading it must not allocate more than a small multiple of its size.
func TestMalformed(t *testing.T) {
	const big = 1 << 60
	cases := []struct {
		name string
		data []byte
		kind error
		want string
	}{
		{"empty file", nil, ErrInvalid, "not a GGUF file: 0 bytes"},
		{"bad magic", append([]byte("GGML"), make([]byte, 20)...), ErrInvalid, `magic "GGML"`},
		{"version 1", (&enc{}).header(1, 0, 0).b, ErrUnsupported, "version 1 is not supported"},
		{"version 4", (&enc{}).header(4, 0, 0).b, ErrUnsupported, "version 4 is not supported"},
		{"version 0", (&enc{}).header(0, 0, 0).b, ErrUnsupported, "version 0 is not supported"},
		{"big-endian", (&enc{}).header(3<<24, 0, 0).b, ErrUnsupported, "big-endian"},
		{"header cut", hdr(0, 0).b[:12], ErrInvalid, "file ends at byte 12, inside tensor count"},
		{"tensor count lies", hdr(big, 0).b, ErrInvalid, "tensor count is 1152921504606846976"},
		{"metadata count lies", hdr(0, big).b, ErrInvalid, "metadata count is 1152921504606846976"},
		{"key length beyond file", hdr(0, 1).u64(1 << 40).raw(make([]byte, 20)).b, ErrInvalid, "metadata key 0 has length 1099511627776 but only 20 bytes are left"},
		{"string length beyond file", hdr(0, 1).str("k").u32(uint32(TypeString)).u64(1000).raw([]byte("abc")).b, ErrInvalid, `value of metadata key "k" has length 1000`},
		{"array length lies", hdr(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeUint64)).u64(big).b, ErrInvalid, `array length of metadata key "k" is 1152921504606846976`},
		{"bool array length lies", hdr(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeBool)).u64(1 << 61).u8(1).b, ErrInvalid, "array length"},
		{"string array length lies", hdr(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(big).b, ErrInvalid, "array length"},
		{"nested array length lies", hdr(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeArray)).u64(big).b, ErrInvalid, "array length"},
		{"array element cut", hdr(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeUint32)).u64(2).u32(1).u16(0).b, ErrInvalid, "array length"},
		{"string element cut", hdr(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(2).str("a").u64(5).u8('b').b, ErrInvalid, `element 1 of metadata key "k" has length 5`},
		{"unknown value type", hdr(0, 1).str("k").u32(13).u8(0).b, ErrInvalid, `metadata key "k" has unknown value type 13`},
		{"unknown array type", hdr(0, 1).str("k").u32(uint32(TypeArray)).u32(42).u64(0).b, ErrInvalid, "array of unknown value type 42"},
		{"empty key", hdr(0, 1).str("").u32(uint32(TypeUint8)).u8(1).u8(0).b, ErrInvalid, "metadata key 0 is empty"},
		{"duplicate key", hdr(0, 2).kv("a", scalar(TypeUint8, uint8(1))).kv("a", scalar(TypeUint8, uint8(2))).b, ErrInvalid, `metadata key "a" appears twice`},
		{"arrays nested too deep", hdr(0, 1).kv("k", nested(9)).b, ErrInvalid, "nests arrays deeper than 8"},
		{"alignment not uint32", hdr(0, 1).kv(alignmentKey, scalar(TypeUint64, uint64(32))).b, ErrInvalid, "general.alignment has type uint64, want uint32"},
		{"alignment zero", hdr(0, 1).kv(alignmentKey, scalar(TypeUint32, uint32(0))).b, ErrInvalid, "general.alignment is 0, not a power of two"},
		{"alignment 48", hdr(0, 1).kv(alignmentKey, scalar(TypeUint32, uint32(48))).b, ErrInvalid, "general.alignment is 48, not a power of two"},
		{"tensor count lies after the metadata", hdr(3, 1).kv("k", scalar(TypeString, strings.Repeat("x", 60))).b, ErrInvalid, "tensor count is 3 but the 0 bytes left after the metadata"},
		{"tensor name beyond file", hdr(1, 0).u64(1 << 50).raw(make([]byte, 30)).b, ErrInvalid, "name of tensor 0 has length 1125899906842624"},
		{"tensor info cut", f32Tensor([]uint64{4}, 0, 0)[:48], ErrInvalid, "file ends at byte 48, inside type of tensor w"},
		{"five dimensions", f32Tensor([]uint64{1, 1, 1, 1, 1}, 0, 4), ErrInvalid, "tensor w has 5 dimensions, more than 4"},
		{"dimension above int64", f32Tensor([]uint64{1 << 63}, 0, 0), ErrInvalid, "tensor w dimension 0 is 9223372036854775808"},
		{"element count overflows", f32Tensor([]uint64{1 << 32, 1 << 32}, 0, 0), ErrInvalid, "element count overflows int64"},
		{"element count overflows past int64", f32Tensor([]uint64{1 << 31, 1 << 31, 4}, 0, 0), ErrInvalid, "element count overflows int64"},
		{"byte size overflows", f32Tensor([]uint64{1 << 62, 1}, 0, 0), ErrInvalid, "byte size that overflows int64"},
		{"unknown type id", tensorFile(99, []uint64{32}, 0, 0), ErrInvalid, "tensor w has unknown type id 99"},
		{"removed type", tensorFile(TypeQ4_2, []uint64{32}, 0, 0), ErrUnsupported, "tensor w has type Q4_2 (id 4), a layout ggml has removed"},
		{"row not whole blocks", tensorFile(TypeQ4_0, []uint64{48, 2}, 0, 64), ErrInvalid, "tensor w of type Q4_0 has 48 values per row, not a multiple of the block size 32"},
		{"unaligned offset", f32Tensor([]uint64{4}, 16, 64), ErrInvalid, "tensor w has offset 16, not a multiple of the alignment 32"},
		{"offset above int64", f32Tensor([]uint64{4}, 1<<63, 64), ErrInvalid, "tensor w has offset 9223372036854775808"},
		{"offset past the end", f32Tensor([]uint64{4}, 1<<40, 64), ErrInvalid, "tensor w (16 bytes at data offset 1099511627776) extends past the end of the file (64 bytes of data)"},
		{"data past the end", f32Tensor([]uint64{1000}, 0, 16), ErrInvalid, "tensor w (4000 bytes at data offset 0) extends past the end of the file (16 bytes of data)"},
		{"no data section", f32Tensor([]uint64{4}, 0, 0)[:60], ErrInvalid, "data section would start at byte 64, past the end of the file (60 bytes)"},
		{"overlapping tensors", testFile{version: 3, tensors: []testTensor{
			{name: "a", typ: TypeF32, dims: []uint64{16}, data: make([]byte, 64)},
			{name: "b", typ: TypeF32, dims: []uint64{16}, data: make([]byte, 64), fixed: true, offset: 32},
		}}.bytes(), ErrInvalid, "tensors a (bytes 0-64) and b (from byte 32) of the data section overlap"},
		{"name with a newline", hdr(1, 0).str("a\nb").u32(5).raw(make([]byte, 60)).b, ErrInvalid, `tensor "a\nb" has 5 dimensions`},
		{"long key with a newline", hdr(0, 2).kv(strings.Repeat("k", 500)+"\n", scalar(TypeUint8, uint8(1))).kv(strings.Repeat("k", 500)+"\n", scalar(TypeUint8, uint8(1))).b, ErrInvalid, `metadata key "` + strings.Repeat("k", 120) + `..." appears twice`},
		{"duplicate tensor name", testFile{version: 3, tensors: []testTensor{
			{name: "a", typ: TypeF32, dims: []uint64{4}, data: make([]byte, 16)},
			{name: "a", typ: TypeF32, dims: []uint64{4}, data: make([]byte, 16)},
		}}.bytes(), ErrInvalid, "tensor a appears twice"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			allocated := allocatedBy(func() {
				_, err = NewFile(bytes.NewReader(c.data), int64(len(c.data)))
			})
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "gguf: ") || strings.Contains(msg, "\n") || !strings.Contains(msg, c.want) {
				t.Errorf("error %q\nwant one line containing %q", msg, c.want)
			}
			if !errors.Is(err, c.kind) {
				t.Errorf("error %q does not wrap %v", msg, c.kind)
			}
			// The parser's buffer is 64 KiB; a count believed would cost gigabytes.
			if allocated > 1<<20 {
				t.Errorf("reading %d bytes allocated %d bytes", len(c.data), allocated)
			}
		})
	}
}

// allocatedBy returns the bytes allocated while f runs.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestTruncated cuts a well-formed file at every length: every prefix must be refused with an
// error, and none may panic.
func TestTruncated(t *testing.T) {
	full := testFile{version: 3, kvs: everyValue(), tensors: []testTensor{
		{name: "a", typ: TypeQ4_0, dims: []uint64{64}, data: make([]byte, 36)},
		{name: "b", typ: TypeF32, dims: []uint64{3}, data: make([]byte, 12)},
	}}.bytes()
	if _, err := NewFile(bytes.NewReader(full), int64(len(full))); err != nil {
		t.Fatalf("full file: %v", err)
	}
	for n := range len(full) {
		_, err := NewFile(bytes.NewReader(full[:n]), int64(n))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "gguf: ") {
			t.Fatalf("file cut to %d of %d bytes: err = %v", n, len(full), err)
		}
	}
}

// TestShrunkAfterOpen reads tensors of a file that is shorter than the size it was opened
// with, as when the file is truncated after Open: reads fail with an error, not a panic.
func TestShrunkAfterOpen(t *testing.T) {
	full := testFile{version: 3, tensors: []testTensor{
		{name: "a", typ: TypeF32, dims: []uint64{64}, data: make([]byte, 256)},
	}}.bytes()
	short := full[:len(full)-100]
	f, err := NewFile(bytes.NewReader(short), int64(len(full)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadRaw("a"); err == nil || !strings.Contains(err.Error(), "tensor a: file ends at byte") {
		t.Errorf("ReadRaw: %v", err)
	}
	if _, err := f.ReadFloat32("a"); err == nil || !errors.Is(err, ErrInvalid) {
		t.Errorf("ReadFloat32: %v", err)
	}
}

// TestLayoutAccepted checks what Open accepts beyond ggml's packed layout: tensors out of file
// order and with gaps, a tensor without dimensions (a scalar) and one without elements.
func TestLayoutAccepted(t *testing.T) {
	data := testFile{version: 3, tensors: []testTensor{
		{name: "late", typ: TypeF32, dims: []uint64{4}, data: bytes.Repeat([]byte{1}, 16), fixed: true, offset: 256},
		{name: "early", typ: TypeF32, dims: []uint64{4}, data: bytes.Repeat([]byte{2}, 16), fixed: true, offset: 0},
		{name: "scalar", typ: TypeF32, dims: []uint64{}, data: bytes.Repeat([]byte{3}, 4), fixed: true, offset: 64},
		{name: "none", typ: TypeQ4_K, dims: []uint64{256, 0}, fixed: true, offset: 64},
	}}.bytes()
	f, err := NewFile(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]byte{"late": 1, "early": 2, "scalar": 3} {
		raw, err := f.ReadRaw(name)
		if err != nil || len(raw) == 0 || !bytes.Equal(raw, bytes.Repeat([]byte{b}, len(raw))) {
			t.Errorf("ReadRaw(%s) = %v, %v", name, raw, err)
		}
	}
	if info, _ := f.Tensor("scalar"); info.Elements() != 1 || info.Size != 4 {
		t.Errorf("scalar: %+v", info)
	}
	if info, _ := f.Tensor("none"); info.Elements() != 0 || info.Size != 0 {
		t.Errorf("none: %+v", info)
	}
}
