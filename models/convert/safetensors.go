package convert

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// ErrBadSafetensors marks a safetensors file or index that is malformed or uses a
// feature Conveyor does not read.
var ErrBadSafetensors = errors.New("convert: bad safetensors")

// Tensor is a named float32 tensor in row-major order.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
	// SourceBits is the bits per weight of the quantized format the tensor was read from
	// (a GGUF file's Q4_K is 4, Q6_K 6, Q8_0 8, F16 16), or 0 when it was stored as floats
	// in a checkpoint. Quantization.WideInt8 reads it.
	SourceBits int
}

// NumElements returns the product of t's dimensions.
func (t *Tensor) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Weights maps Hugging Face parameter names (model.embed_tokens.weight,
// model.layers.0.self_attn.q_proj.weight, ...) to tensors.
type Weights map[string]*Tensor

// Names returns the tensor names in sorted order.
func (w Weights) Names() []string {
	names := make([]string, 0, len(w))
	for n := range w {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// maxSafetensorsHeaderBytes bounds the JSON header, as the reference implementation does.
const maxSafetensorsHeaderBytes = 100 << 20

// stDType is a safetensors dtype string.
type stDType string

const (
	stF32  stDType = "F32"
	stF16  stDType = "F16"
	stBF16 stDType = "BF16"
)

func (d stDType) size() int {
	switch d {
	case stF32:
		return 4
	case stF16, stBF16:
		return 2
	}
	return 0
}

// stEntry is one tensor of a safetensors header.
type stEntry struct {
	Name  string
	DType stDType
	Shape []int
	Begin int64 // byte offset into the data section
	End   int64
}

// stHeaderEntry is the JSON form of one tensor's header entry.
type stHeaderEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// parseSafetensorsHeader parses and validates a safetensors JSON header against a data
// section of dataBytes bytes. Entries come back sorted by offset; metadata may be nil.
func parseSafetensorsHeader(header []byte, dataBytes int64) ([]stEntry, map[string]string, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadSafetensors, fmt.Sprintf(format, args...))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(header, &raw); err != nil {
		return nil, nil, bad("header is not a JSON object: %v", err)
	}
	if raw == nil {
		return nil, nil, bad("header is not a JSON object")
	}
	var meta map[string]string
	entries := make([]stEntry, 0, len(raw))
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, nil, bad("__metadata__ must map strings to strings: %v", err)
			}
			continue
		}
		var h stHeaderEntry
		if err := json.Unmarshal(msg, &h); err != nil {
			return nil, nil, bad("tensor %q: %v", name, err)
		}
		dt := stDType(h.DType)
		if dt.size() == 0 {
			return nil, nil, bad("tensor %q: unsupported dtype %q (want F32, F16 or BF16)", name, h.DType)
		}
		if len(h.DataOffsets) != 2 {
			return nil, nil, bad("tensor %q: data_offsets must hold 2 numbers, got %d", name, len(h.DataOffsets))
		}
		begin, end := h.DataOffsets[0], h.DataOffsets[1]
		if begin < 0 || end < begin || end > dataBytes {
			return nil, nil, bad("tensor %q: data_offsets [%d,%d] outside the %d-byte data section", name, begin, end, dataBytes)
		}
		shape := make([]int, len(h.Shape))
		n := int64(1)
		for i, d := range h.Shape {
			if d < 0 {
				return nil, nil, bad("tensor %q: negative dimension %d", name, d)
			}
			if d > 0 && n > math.MaxInt64/d/8 {
				return nil, nil, bad("tensor %q: shape %v is too large", name, h.Shape)
			}
			n *= d
			shape[i] = int(d)
		}
		if want := n * int64(dt.size()); end-begin != want {
			return nil, nil, bad("tensor %q: shape %v of %s needs %d bytes but data_offsets span %d", name, h.Shape, dt, want, end-begin)
		}
		entries = append(entries, stEntry{Name: name, DType: dt, Shape: shape, Begin: begin, End: end})
	}
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].Begin != entries[j].Begin {
			return entries[i].Begin < entries[j].Begin
		}
		return entries[i].End < entries[j].End
	})
	for i := 1; i < len(entries); i++ {
		prev, cur := entries[i-1], entries[i]
		if cur.Begin < prev.End {
			return nil, nil, bad("tensors %q and %q overlap", prev.Name, cur.Name)
		}
	}
	return entries, meta, nil
}

// ReadSafetensors reads every tensor of one .safetensors file, converting F16 and BF16
// to float32.
func ReadSafetensors(path string) (Weights, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("models: open %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("models: stat %s: %w", path, err)
	}
	w, err := readSafetensors(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return w, nil
}

// readSafetensors parses a safetensors file of size bytes read through r.
func readSafetensors(r io.ReaderAt, size int64) (Weights, error) {
	if size < 8 {
		return nil, fmt.Errorf("%w: file is %d bytes, shorter than the 8-byte header length", ErrBadSafetensors, size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("models: read header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > maxSafetensorsHeaderBytes {
		return nil, fmt.Errorf("%w: header length %d exceeds the %d-byte limit", ErrBadSafetensors, n, maxSafetensorsHeaderBytes)
	}
	if int64(n) > size-8 {
		return nil, fmt.Errorf("%w: header length %d exceeds the file's remaining %d bytes", ErrBadSafetensors, n, size-8)
	}
	header := make([]byte, n)
	if _, err := r.ReadAt(header, 8); err != nil {
		return nil, fmt.Errorf("models: read header: %w", err)
	}
	dataStart := 8 + int64(n)
	entries, _, err := parseSafetensorsHeader(header, size-dataStart)
	if err != nil {
		return nil, err
	}
	w := make(Weights, len(entries))
	var buf []byte
	for _, e := range entries {
		nb := int(e.End - e.Begin)
		if cap(buf) < nb {
			buf = make([]byte, nb)
		}
		buf = buf[:nb]
		if _, err := r.ReadAt(buf, dataStart+e.Begin); err != nil {
			return nil, fmt.Errorf("models: read tensor %q: %w", e.Name, err)
		}
		w[e.Name] = &Tensor{Name: e.Name, Shape: e.Shape, Data: decodeFloats(buf, e.DType)}
	}
	return w, nil
}

// decodeFloats converts little-endian raw values of dtype dt to float32.
func decodeFloats(b []byte, dt stDType) []float32 {
	out := make([]float32, len(b)/dt.size())
	switch dt {
	case stF32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case stF16:
		for i := range out {
			out[i] = kvcache.Float16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case stBF16:
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		}
	}
	return out
}

// safetensorsIndex is model.safetensors.index.json.
type safetensorsIndex struct {
	WeightMap map[string]string `json:"weight_map"`
}

// LoadSafetensorsDir reads a checkpoint directory's weights: the shards named by
// model.safetensors.index.json when present, else model.safetensors, else the single
// *.safetensors file in dir.
func LoadSafetensorsDir(dir string) (Weights, error) {
	indexPath := filepath.Join(dir, "model.safetensors.index.json")
	var idx safetensorsIndex
	err := readJSONFile(indexPath, &idx)
	switch {
	case err == nil:
		return loadSharded(dir, indexPath, idx)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%w: %v", ErrBadSafetensors, err)
	}
	single := filepath.Join(dir, "model.safetensors")
	if _, err := os.Stat(single); err == nil {
		return ReadSafetensors(single)
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	switch len(matches) {
	case 1:
		return ReadSafetensors(matches[0])
	case 0:
		return nil, fmt.Errorf("%w: %s holds neither model.safetensors.index.json nor a .safetensors file", ErrBadSafetensors, dir)
	default:
		return nil, fmt.Errorf("%w: %s holds %d .safetensors files but no model.safetensors.index.json", ErrBadSafetensors, dir, len(matches))
	}
}

func loadSharded(dir, indexPath string, idx safetensorsIndex) (Weights, error) {
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%w: %s has an empty weight_map", ErrBadSafetensors, indexPath)
	}
	files := map[string]bool{}
	for name, file := range idx.WeightMap {
		if file == "" || filepath.Base(file) != file || strings.HasPrefix(file, ".") {
			return nil, fmt.Errorf("%w: %s maps %q to %q, which is not a file name in the same directory", ErrBadSafetensors, indexPath, name, file)
		}
		files[file] = true
	}
	shardNames := make([]string, 0, len(files))
	for f := range files {
		shardNames = append(shardNames, f)
	}
	sort.Strings(shardNames)
	all := Weights{}
	for _, file := range shardNames {
		w, err := ReadSafetensors(filepath.Join(dir, file))
		if err != nil {
			return nil, err
		}
		for name, t := range w {
			if _, dup := all[name]; dup {
				return nil, fmt.Errorf("%w: tensor %q appears in more than one shard", ErrBadSafetensors, name)
			}
			all[name] = t
		}
	}
	for name, file := range idx.WeightMap {
		if _, ok := all[name]; !ok {
			return nil, fmt.Errorf("%w: %s lists tensor %q in %s, which does not hold it", ErrBadSafetensors, indexPath, name, file)
		}
	}
	return all, nil
}

// WriteSafetensors writes tensors to path in safetensors format, storing values as
// dtype (Float32 or Float16). Tensors are laid out in name order.
func WriteSafetensors(path string, tensors Weights, dtype DType) error {
	var dt stDType
	switch dtype {
	case Float32:
		dt = stF32
	case Float16:
		dt = stF16
	case BFloat16:
		dt = stBF16
	default:
		return fmt.Errorf("models: WriteSafetensors: unsupported dtype %v", dtype)
	}
	return writeSafetensors(path, tensors, dt)
}

func writeSafetensors(path string, tensors Weights, dt stDType) error {
	names := tensors.Names()
	header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var offset int64
	for _, name := range names {
		t := tensors[name]
		if t == nil {
			return fmt.Errorf("models: WriteSafetensors: tensor %q is nil", name)
		}
		if t.NumElements() != len(t.Data) {
			return fmt.Errorf("models: WriteSafetensors: tensor %q has shape %v but %d values", name, t.Shape, len(t.Data))
		}
		n := int64(len(t.Data) * dt.size())
		header[name] = stHeaderEntry{DType: string(dt), Shape: intsTo64(t.Shape), DataOffsets: []int64{offset, offset + n}}
		offset += n
	}
	hb, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("models: WriteSafetensors: %w", err)
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("models: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hb)))
	bw.Write(lenBuf[:])
	bw.Write(hb)
	for _, name := range names {
		writeFloats(bw, tensors[name].Data, dt)
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("models: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("models: write %s: %w", path, err)
	}
	return nil
}

// writeFloats encodes data as little-endian dt values into w (bufio errors are sticky).
func writeFloats(w *bufio.Writer, data []float32, dt stDType) {
	var b [4]byte
	for _, v := range data {
		switch dt {
		case stF32:
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
			w.Write(b[:4])
		case stF16:
			binary.LittleEndian.PutUint16(b[:], kvcache.Float32ToFloat16(v))
			w.Write(b[:2])
		case stBF16:
			binary.LittleEndian.PutUint16(b[:], float32ToBF16(v))
			w.Write(b[:2])
		}
	}
}

func intsTo64(s []int) []int64 {
	out := make([]int64, len(s))
	for i, v := range s {
		out[i] = int64(v)
	}
	return out
}

// float32ToBF16 converts f to bfloat16, rounding to nearest even.
func float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}
