package gguf

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzOpen feeds arbitrary bytes to the reader. Whatever the input, NewFile must return a
// File or one "gguf: " error line, never panic or hang; a File it returns must hold only
// tensors inside the input, and reading and decoding each of them must work.
func FuzzOpen(f *testing.F) {
	ggml, err := os.ReadFile(filepath.Join("testdata", "ggml.gguf"))
	if err != nil {
		f.Fatal(err)
	}
	q4k, err := os.ReadFile(filepath.Join("testdata", "dequant", "q4_k.raw"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ggml)
	f.Add(testFile{version: 3, kvs: everyValue()}.bytes())
	f.Add(testFile{version: 2, alignment: 64,
		kvs: []KeyValue{{alignmentKey, scalar(TypeUint32, uint32(64))}, {"a", nested(3)}},
		tensors: []testTensor{
			{name: "k", typ: TypeQ4_K, dims: []uint64{256, 4}, data: q4k},
			{name: "s", typ: TypeF16, dims: []uint64{}, data: []byte{0, 0x3C}},
		}}.bytes())
	f.Add(hdr(0, 0).b)
	f.Add(hdr(1<<60, 1<<60).b)
	f.Add(f32Tensor([]uint64{4, 4}, 0, 64))

	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := NewFile(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "gguf: ") || strings.Contains(msg, "\n") {
				t.Fatalf("error is not one gguf line: %q", msg)
			}
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("error wraps neither ErrInvalid nor ErrUnsupported: %q", msg)
			}
			return
		}
		for _, info := range file.Tensors() {
			end := file.DataOffset + info.Offset + info.Size
			if info.Offset%file.Alignment != 0 || end > int64(len(data)) || end < file.DataOffset {
				t.Fatalf("tensor %s (%d bytes at %d) lies outside the %d-byte input", info.Name, info.Size, info.Offset, len(data))
			}
			raw, err := file.ReadRaw(info.Name)
			if err != nil || int64(len(raw)) != info.Size {
				t.Fatalf("ReadRaw(%s) = %d bytes, %v; want %d", info.Name, len(raw), err, info.Size)
			}
			values, err := file.ReadFloat32(info.Name)
			if info.Type.Supported() {
				if err != nil || int64(len(values)) != info.Elements() {
					t.Fatalf("ReadFloat32(%s) = %d values, %v; want %d", info.Name, len(values), err, info.Elements())
				}
			} else if !errors.Is(err, ErrUnsupported) {
				t.Fatalf("ReadFloat32(%s) of type %s: %v", info.Name, info.Type, err)
			}
		}
		for _, key := range file.Metadata.Keys() {
			v, _ := file.Metadata.Value(key)
			_ = v.String()
			file.Metadata.Uint(key)
			file.Metadata.Strings(key)
			file.Metadata.Ints(key)
			file.Metadata.Floats(key)
		}
	})
}
