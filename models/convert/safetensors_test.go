package convert

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
)

func testWeights() Weights {
	return Weights{
		"a.weight": {Name: "a.weight", Shape: []int{2, 3}, Data: []float32{1, -2, 0.5, 0.25, 1024, -0.125}},
		"b.bias":   {Name: "b.bias", Shape: []int{4}, Data: []float32{0, 3, -7.5, 65504}},
		"scalar":   {Name: "scalar", Shape: []int{}, Data: []float32{42}},
		"empty":    {Name: "empty", Shape: []int{0, 5}, Data: []float32{}},
	}
}

func TestSafetensorsRoundTrip(t *testing.T) {
	// All values are exactly representable in F16 and BF16, so every dtype must give
	// them back unchanged.
	for _, dt := range []stDType{stF32, stF16, stBF16} {
		path := filepath.Join(t.TempDir(), "model.safetensors")
		want := testWeights()
		if dt == stBF16 {
			want["b.bias"].Data[3] = 65536 // 65504 is not a bfloat16 value
		}
		if err := writeSafetensors(path, want, dt); err != nil {
			t.Fatal(err)
		}
		got, err := ReadSafetensors(path)
		if err != nil {
			t.Fatalf("%s: %v", dt, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: got %d tensors, want %d", dt, len(got), len(want))
		}
		for name, w := range want {
			g := got[name]
			if g == nil || !reflect.DeepEqual(g.Shape, w.Shape) || !reflect.DeepEqual(g.Data, w.Data) || g.Name != name {
				t.Errorf("%s: tensor %s = %+v, want %+v", dt, name, g, w)
			}
		}
	}
}

func TestWriteSafetensorsFloat16Rounds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.safetensors")
	in := Weights{"x": {Name: "x", Shape: []int{4}, Data: []float32{0.1, 1e-7, 70000, -3.3333333}}}
	if err := WriteSafetensors(path, in, Float16); err != nil {
		t.Fatal(err)
	}
	got, err := ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	// Nearest binary16 values, computed independently.
	want := []float32{0.0999755859375, 1.1920928955078125e-07, float32(math.Inf(1)), -3.333984375}
	if !reflect.DeepEqual(got["x"].Data, want) {
		t.Errorf("got %v, want %v", got["x"].Data, want)
	}
}

func TestHalfConversionRoundTripsEveryValue(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := kvcache.Float16ToFloat32(uint16(h))
		if math.IsNaN(float64(f)) {
			if back := kvcache.Float32ToFloat16(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back := kvcache.Float32ToFloat16(f); back != uint16(h) {
			t.Fatalf("half %#04x -> %g -> %#04x", h, f, back)
		}
	}
	// Spot values from the IEEE 754 tables.
	for h, want := range map[uint16]float32{0x3c00: 1, 0xc000: -2, 0x7bff: 65504, 0x0001: 5.960464477539063e-08, 0x0400: 6.103515625e-05} {
		if got := kvcache.Float16ToFloat32(h); got != want {
			t.Errorf("kvcache.Float16ToFloat32(%#04x) = %g, want %g", h, got, want)
		}
	}
	if got := float32ToBF16(1.00390625); got != 0x3f80 { // halfway: ties to even
		t.Errorf("float32ToBF16(1.00390625) = %#04x, want 0x3f80", got)
	}
}

func TestLoadSafetensorsDirSharded(t *testing.T) {
	dir := t.TempDir()
	all := testWeights()
	shard1 := Weights{"a.weight": all["a.weight"], "scalar": all["scalar"]}
	shard2 := Weights{"b.bias": all["b.bias"]}
	if err := WriteSafetensors(filepath.Join(dir, "model-00001-of-00002.safetensors"), shard1, Float32); err != nil {
		t.Fatal(err)
	}
	if err := WriteSafetensors(filepath.Join(dir, "model-00002-of-00002.safetensors"), shard2, Float16); err != nil {
		t.Fatal(err)
	}
	index := map[string]any{"metadata": map[string]any{"total_size": 100}, "weight_map": map[string]string{
		"a.weight": "model-00001-of-00002.safetensors",
		"scalar":   "model-00001-of-00002.safetensors",
		"b.bias":   "model-00002-of-00002.safetensors",
	}}
	b, _ := json.Marshal(index)
	writeTestFile(t, dir, "model.safetensors.index.json", string(b))
	got, err := LoadSafetensorsDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || !reflect.DeepEqual(got["b.bias"].Data, all["b.bias"].Data) || !reflect.DeepEqual(got["a.weight"].Data, all["a.weight"].Data) {
		t.Fatalf("sharded load got %v", got.Names())
	}

	// An index naming a tensor its shard does not hold is an error.
	index["weight_map"].(map[string]string)["missing.weight"] = "model-00002-of-00002.safetensors"
	b, _ = json.Marshal(index)
	writeTestFile(t, dir, "model.safetensors.index.json", string(b))
	if _, err := LoadSafetensorsDir(dir); !errors.Is(err, ErrBadSafetensors) || !strings.Contains(err.Error(), "missing.weight") {
		t.Errorf("want error naming missing.weight, got %v", err)
	}
	// Shard names must stay inside the directory.
	writeTestFile(t, dir, "model.safetensors.index.json", `{"weight_map": {"a.weight": "../model-00001-of-00002.safetensors"}}`)
	if _, err := LoadSafetensorsDir(dir); !errors.Is(err, ErrBadSafetensors) {
		t.Errorf("path escaping the directory: got %v", err)
	}
	writeTestFile(t, dir, "model.safetensors.index.json", `{"weight_map": `)
	if _, err := LoadSafetensorsDir(dir); err == nil || !strings.Contains(err.Error(), "index.json") {
		t.Errorf("malformed index: got %v", err)
	}
}

func TestLoadSafetensorsDirSingleAndEmpty(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadSafetensorsDir(dir); !errors.Is(err, ErrBadSafetensors) {
		t.Errorf("empty dir: got %v", err)
	}
	if err := WriteSafetensors(filepath.Join(dir, "model.safetensors"), testWeights(), Float32); err != nil {
		t.Fatal(err)
	}
	if w, err := LoadSafetensorsDir(dir); err != nil || len(w) != 4 {
		t.Fatalf("single file: %d tensors, %v", len(w), err)
	}
}

// rawSafetensors assembles a file from a header string and a data section.
func rawSafetensors(header string, data []byte) []byte {
	out := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(out, uint64(len(header)))
	out = append(out, header...)
	return append(out, data...)
}

func TestReadSafetensorsRejectsMalformed(t *testing.T) {
	data16 := make([]byte, 16)
	huge := make([]byte, 8)
	binary.LittleEndian.PutUint64(huge, math.MaxUint64)
	for _, tc := range []struct {
		name string
		file []byte
		sub  string
	}{
		{"empty file", nil, "shorter than"},
		{"truncated length", []byte{1, 2, 3}, "shorter than"},
		{"huge header length", append(huge, '{', '}'), "exceeds"},
		{"header longer than file", rawSafetensors(`{}`, nil)[:9], "exceeds"},
		{"header not json", rawSafetensors(`{"a": `, data16), "not a JSON object"},
		{"header is a list", rawSafetensors(`[1]`, data16), "not a JSON object"},
		{"unknown dtype", rawSafetensors(`{"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}`, data16), "unsupported dtype"},
		{"offsets past end", rawSafetensors(`{"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}}`, data16), "outside"},
		{"offsets reversed", rawSafetensors(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}`, data16), "outside"},
		{"negative offset", rawSafetensors(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, data16), "outside"},
		{"size mismatch", rawSafetensors(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}`, data16), "needs 12 bytes"},
		{"negative dim", rawSafetensors(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, data16), "negative dimension"},
		{"overflowing shape", rawSafetensors(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, data16), "too large"},
		{"one offset", rawSafetensors(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}`, data16), "2 numbers"},
		{"overlap", rawSafetensors(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, data16), "overlap"},
		{"bad metadata", rawSafetensors(`{"__metadata__":{"x":1}}`, nil), "__metadata__"},
		{"entry not object", rawSafetensors(`{"a":3}`, nil), "tensor \"a\""},
	} {
		path := filepath.Join(t.TempDir(), "x.safetensors")
		if err := os.WriteFile(path, tc.file, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := ReadSafetensors(path)
		if !errors.Is(err, ErrBadSafetensors) || !strings.Contains(err.Error(), tc.sub) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: want ErrBadSafetensors naming the file and mentioning %q, got %v", tc.name, tc.sub, err)
		}
	}
}

func TestReadSafetensorsAcceptsMetadataAndGaps(t *testing.T) {
	data := make([]byte, 12)
	binary.LittleEndian.PutUint32(data[8:], math.Float32bits(2.5))
	path := filepath.Join(t.TempDir(), "x.safetensors")
	file := rawSafetensors(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}  `, data)
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := w["a"].Data; len(got) != 1 || got[0] != 2.5 {
		t.Errorf("got %v", got)
	}
}

// FuzzSafetensorsHeader checks that no header makes the reader panic, and that every
// header it accepts describes tensors that fit the data section without overlapping.
func FuzzSafetensorsHeader(f *testing.F) {
	f.Add([]byte(`{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}`), uint16(16))
	f.Add([]byte(`{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},"b":{"dtype":"F16","shape":[],"data_offsets":[6,8]}}`), uint16(8))
	f.Add([]byte(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`), uint16(16))
	f.Add([]byte(`{"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}`), uint16(1))
	f.Add([]byte(`{"a":{"dtype":"F32","shape":[9223372036854775807,2],"data_offsets":[0,8]}}`), uint16(8))
	f.Add([]byte(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551615,4]}}`), uint16(8))
	f.Add([]byte(`{"a":null}`), uint16(0))
	f.Add([]byte(`null`), uint16(0))
	f.Add([]byte(``), uint16(0))
	f.Fuzz(func(t *testing.T, header []byte, dataBytes uint16) {
		entries, _, err := parseSafetensorsHeader(header, int64(dataBytes))
		if err != nil {
			if !errors.Is(err, ErrBadSafetensors) {
				t.Fatalf("error does not wrap ErrBadSafetensors: %v", err)
			}
			return
		}
		var prevEnd int64
		for _, e := range entries {
			n := int64(e.DType.size())
			for _, d := range e.Shape {
				n *= int64(d)
			}
			if e.Begin < prevEnd || e.End > int64(dataBytes) || e.End-e.Begin != n {
				t.Fatalf("accepted bad entry %+v (prev end %d, data %d)", e, prevEnd, dataBytes)
			}
			prevEnd = e.End
		}
		// The whole reader must agree on a file built from this header.
		file := rawSafetensors(string(header), make([]byte, dataBytes))
		path := filepath.Join(t.TempDir(), "f.safetensors")
		if err := os.WriteFile(path, file, 0o644); err != nil {
			t.Fatal(err)
		}
		w, err := ReadSafetensors(path)
		if err != nil {
			t.Fatalf("header accepted but file rejected: %v", err)
		}
		for _, e := range entries {
			if len(w[e.Name].Data) != int((e.End-e.Begin)/int64(e.DType.size())) {
				t.Fatalf("tensor %s has %d values", e.Name, len(w[e.Name].Data))
			}
		}
	})
}
