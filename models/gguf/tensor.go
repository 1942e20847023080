package gguf

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
)

// ErrNotFound is wrapped by the error of ReadRaw and ReadFloat32 for a name the file has no
// tensor of.
var ErrNotFound = errors.New("no such tensor")

// readChunkBytes bounds the bytes ReadFloat32 reads at once, so decoding a tensor needs its
// float32 result and one chunk, not a second copy of the whole tensor.
const readChunkBytes = 4 << 20

// TensorInfo describes one tensor of the file. Open has checked that its block layout is
// known, that Dims[0] is a whole number of blocks and that its bytes lie, aligned, inside the
// data section without overlapping another tensor's.
type TensorInfo struct {
	// Name is the tensor's name, e.g. "blk.0.attn_q.weight".
	Name string
	// Type is the element type.
	Type GGMLType
	// Dims is the shape in GGUF (ggml) order: Dims[0] is the innermost, contiguous
	// dimension, so a weight of PyTorch shape [out, in] has Dims [in, out].
	Dims []int64
	// Offset is the tensor's byte offset from the start of the data section (File.DataOffset).
	Offset int64
	// Size is the tensor's size in bytes as stored.
	Size int64
}

// Elements returns the number of values in the tensor.
func (t TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Tensors returns the file's tensor infos in file order.
func (f *File) Tensors() []TensorInfo {
	out := make([]TensorInfo, len(f.tensors))
	for i, t := range f.tensors {
		t.Dims = slices.Clone(t.Dims)
		out[i] = t
	}
	return out
}

// Tensor returns the info of the tensor called name.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	t := f.tensors[i]
	t.Dims = slices.Clone(t.Dims)
	return t, true
}

// lookup returns the tensor called name, or an ErrNotFound error.
func (f *File) lookup(name string) (TensorInfo, error) {
	i, ok := f.byName[name]
	if !ok {
		return TensorInfo{}, fmt.Errorf("gguf: tensor %s: %w", showName(name), ErrNotFound)
	}
	return f.tensors[i], nil
}

// ReadRaw returns the bytes of the tensor called name as stored: whole blocks of its type,
// rows of Dims[0] values one after another.
func (f *File) ReadRaw(name string) ([]byte, error) {
	t, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	if t.Size > math.MaxInt {
		return nil, unsupportedf("tensor %s: %d bytes do not fit in memory on this platform", showName(name), t.Size)
	}
	b := make([]byte, t.Size)
	if err := f.readAt(b, f.DataOffset+t.Offset, name); err != nil {
		return nil, err
	}
	return b, nil
}

// ReadFloat32 reads the tensor called name and decodes it to float32, row-major with
// Dims[0] contiguous (the order of the stored blocks). A type the package does not decode is
// an ErrUnsupported error naming the type and the tensor.
func (f *File) ReadFloat32(name string) ([]float32, error) {
	t, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	dec := decoderFor(t.Type)
	if dec == nil {
		return nil, unsupportedf("tensor %s: type %s is not supported (supported: %s)", showName(name), t.Type, supportedNames)
	}
	n := t.Elements()
	if n > math.MaxInt/4 {
		return nil, unsupportedf("tensor %s: %d values do not fit in memory on this platform", showName(name), n)
	}
	out := make([]float32, n)
	bv, bb := t.Type.BlockValues(), t.Type.BlockBytes()
	blocks := n / bv
	chunk := max(1, readChunkBytes/bb)
	buf := make([]byte, min(blocks, chunk)*bb)
	for b := int64(0); b < blocks; b += chunk {
		k := min(chunk, blocks-b)
		raw := buf[:k*bb]
		if err := f.readAt(raw, f.DataOffset+t.Offset+b*bb, name); err != nil {
			return nil, err
		}
		dec(out[b*bv:(b+k)*bv], raw)
	}
	return out, nil
}

// readAt fills b from the file at off; a short read means the file shrank after Open.
func (f *File) readAt(b []byte, off int64, tensor string) error {
	n, err := f.r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return invalidf("tensor %s: file ends at byte %d, inside the tensor's data", showName(tensor), off+int64(n))
	}
	return fmt.Errorf("gguf: tensor %s: %w", showName(tensor), err)
}
