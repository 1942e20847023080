package ort

import (
	"testing"
	"unsafe"
)

func TestTensorViewCopiesPartOfATensor(t *testing.T) {
	base, err := NewDeviceTensor(CPU(), Float32, []int64{4, 2})
	if err != nil {
		t.Fatal(err)
	}
	defer base.Release()
	data := unsafe.Slice((*float32)(base.Data()), 8)
	for i := range data {
		data[i] = float32(i)
	}
	src, err := NewTensorView(base, 2*4, []int64{1, 2}) // row 1
	if err != nil {
		t.Fatal(err)
	}
	dst, err := NewTensorView(base, 3*2*4, []int64{1, 2}) // row 3
	if err != nil {
		t.Fatal(err)
	}
	if err := CopyTensors([]*Value{src}, []*Value{dst}); err != nil {
		t.Fatal(err)
	}
	src.Release()
	dst.Release()
	want := []float32{0, 1, 2, 3, 4, 5, 2, 3}
	for i := range want {
		if data[i] != want[i] {
			t.Fatalf("after copying row 1 onto row 3: %v, want %v", data, want)
		}
	}
	for _, bad := range []struct {
		off   int
		shape []int64
	}{{-4, []int64{1}}, {2, []int64{1}}, {7 * 4, []int64{2}}, {0, []int64{9}}} {
		if v, err := NewTensorView(base, bad.off, bad.shape); err == nil {
			v.Release()
			t.Errorf("a view of %v at %d was made", bad.shape, bad.off)
		}
	}
}
