package ort

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/conveyor-llm/conveyor/models/kernels"
)

// hostVec wraps xs as a float32 host tensor of shape [len(xs)].
func hostVec(t *testing.T, xs []float32) *Value {
	t.Helper()
	v, err := NewHostTensor(Float32, []int64{int64(len(xs))}, unsafe.Pointer(unsafe.SliceData(xs)), 4*len(xs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Release)
	return v
}

// floats views a host tensor's n float32 elements.
func floats(v *Value, n int) []float32 { return unsafe.Slice((*float32)(v.Data()), n) }

// TestSessionRun runs z = x + y with caller-allocated outputs: host tensors over Go
// memory, an output that is also an input (updated in place), and tensors ONNX Runtime
// allocated on the CPU device, on the shared pool and on a pool of the session's own.
func TestSessionRun(t *testing.T) {
	path := addModel(t)
	for _, cfg := range []SessionConfig{{}, {Device: CPU(), Threads: 1, GraphOptLevel: -1}, {OwnOps: true, GraphOptLevel: 2}, {NoSpin: true}} {
		t.Run(fmt.Sprintf("threads %d level %d nospin %v", cfg.Threads, cfg.GraphOptLevel, cfg.NoSpin), func(t *testing.T) {
			s, err := NewSession(path, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.InputNames(); !slices.Equal(got, []string{"x", "y"}) {
				t.Errorf("InputNames() = %v", got)
			}
			if got := s.OutputNames(); !slices.Equal(got, []string{"z"}) {
				t.Errorf("OutputNames() = %v", got)
			}
			if !s.Device().IsCPU() || s.Device().Name() != "cpu" {
				t.Errorf("device %q", s.Device().Name())
			}

			xs, ys, zs := []float32{1, 2, 3}, []float32{10, 20, 30}, make([]float32, 3)
			x, y, z := hostVec(t, xs), hostVec(t, ys), hostVec(t, zs)
			if err := s.Run([]string{"x", "y"}, []*Value{x, y}, []string{"z"}, []*Value{z}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(zs, []float32{11, 22, 33}) {
				t.Errorf("z = %v, want 11 22 33 in the caller's memory", zs)
			}

			// The output is the input x: x += y in place.
			if err := s.Run([]string{"x", "y"}, []*Value{x, y}, []string{"z"}, []*Value{x}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(xs, []float32{11, 22, 33}) {
				t.Errorf("x = %v after x += y in place, want 11 22 33", xs)
			}

			// Tensors ONNX Runtime allocates on the CPU device.
			a, err := NewDeviceTensor(CPU(), Float32, []int64{3})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Release()
			copy(floats(a, 3), []float32{0.5, 0.25, 0.125})
			if err := s.Run([]string{"x", "y"}, []*Value{a, y}, []string{"z"}, []*Value{a}); err != nil {
				t.Fatal(err)
			}
			if got := floats(a, 3); !slices.Equal(got, []float32{10.5, 20.25, 30.125}) {
				t.Errorf("device tensor = %v", got)
			}
		})
	}
}

// TestSessionErrors: every misuse of a session is an error, not a crash.
func TestSessionErrors(t *testing.T) {
	path := addModel(t)
	s, err := NewSession(path, SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	x, z := hostVec(t, []float32{1}), hostVec(t, []float32{0})
	released := hostVec(t, []float32{1})
	released.Release()
	released.Release() // idempotent
	for _, tc := range []struct {
		name     string
		inNames  []string
		ins      []*Value
		outNames []string
		outs     []*Value
		want     string
	}{
		{"counts", []string{"x"}, nil, []string{"z"}, []*Value{z}, "1 input names, 0 inputs"},
		{"no outputs", []string{"x", "y"}, []*Value{x, x}, nil, nil, "no outputs"},
		{"unknown input", []string{"x", "w"}, []*Value{x, x}, []string{"z"}, []*Value{z}, `no input "w"`},
		{"unknown output", []string{"x", "y"}, []*Value{x, x}, []string{"q"}, []*Value{z}, `no output "q"`},
		{"nil input", []string{"x", "y"}, []*Value{x, nil}, []string{"z"}, []*Value{z}, "nil or released"},
		{"released output", []string{"x", "y"}, []*Value{x, x}, []string{"z"}, []*Value{released}, "nil or released"},
		{"missing input", []string{"x"}, []*Value{x}, []string{"z"}, []*Value{z}, "ort: Run:"},
		{"wrong type", []string{"x", "y"}, []*Value{x, int64Scalar(t)}, []string{"z"}, []*Value{z}, "ort: Run:"},
	} {
		err := s.Run(tc.inNames, tc.ins, tc.outNames, tc.outs)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: err = %v, want one line mentioning %q", tc.name, err, tc.want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.Run([]string{"x", "y"}, []*Value{x, x}, []string{"z"}, []*Value{z}); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Run after Close: %v", err)
	}

	for name, tc := range map[string]struct {
		path string
		cfg  SessionConfig
		want string
	}{
		"missing model":    {filepath.Join(t.TempDir(), "none.onnx"), SessionConfig{}, "cannot load"},
		"bad level":        {path, SessionConfig{GraphOptLevel: 7}, "optimisation level 7"},
		"negative threads": {path, SessionConfig{Threads: -1}, "threads -1"},
		"cpu options":      {path, SessionConfig{ProviderOptions: map[string]string{"enable_cuda_graph": "1"}}, "enable_cuda_graph"},
	} {
		if _, err := NewSession(tc.path, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: err = %v, want one line mentioning %q", name, err, tc.want)
		}
	}
}

func int64Scalar(t *testing.T) *Value {
	v, err := NewDeviceTensor(CPU(), Int64, []int64{1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Release)
	return v
}

// TestTensors: shapes, types and data of host and CPU device tensors, the checks on
// their arguments, and CopyTensors between them.
func TestTensors(t *testing.T) {
	buf := []int32{1, 2, 3, 4, 5, 6}
	h, err := NewHostTensor(Int32, []int64{2, 3}, unsafe.Pointer(&buf[0]), 4*len(buf))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if !slices.Equal(h.Shape(), []int64{2, 3}) || h.Type() != Int32 || h.Data() != unsafe.Pointer(&buf[0]) {
		t.Errorf("host tensor: shape %v type %s data %p (buffer %p)", h.Shape(), h.Type(), h.Data(), &buf[0])
	}
	d, err := NewDeviceTensor(CPU(), Int32, []int64{2, 3})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Release()
	if !slices.Equal(d.Shape(), []int64{2, 3}) || d.Type() != Int32 || d.Data() == nil {
		t.Errorf("device tensor: shape %v type %s data %p", d.Shape(), d.Type(), d.Data())
	}
	if err := CopyTensors([]*Value{h}, []*Value{d}); err != nil {
		t.Fatal(err)
	}
	if got := unsafe.Slice((*int32)(d.Data()), 6); !slices.Equal(got, buf) {
		t.Errorf("copied %v, want %v", got, buf)
	}
	back := make([]int32, 6)
	hb, err := NewHostTensor(Int32, []int64{2, 3}, unsafe.Pointer(&back[0]), 4*len(back))
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Release()
	if err := CopyTensors([]*Value{d}, []*Value{hb}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, buf) {
		t.Errorf("copied back %v, want %v", back, buf)
	}

	// Empty tensors need no memory; scalars have no dimensions.
	for _, shape := range [][]int64{{1, 4, 0, 16}, {0}} {
		e, err := NewHostTensor(Float32, shape, nil, 0)
		if err != nil {
			t.Fatalf("empty %v: %v", shape, err)
		}
		if !slices.Equal(e.Shape(), shape) {
			t.Errorf("empty tensor shape %v, want %v", e.Shape(), shape)
		}
		e.Release()
	}
	f := float32(3)
	s, err := NewHostTensor(Float32, nil, unsafe.Pointer(&f), 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Shape()) != 0 || *(*float32)(s.Data()) != 3 {
		t.Errorf("scalar: shape %v", s.Shape())
	}
	s.Release()
	if s.Shape() != nil || s.Data() != nil {
		t.Error("a released tensor still has a shape or data")
	}

	for name, err := range map[string]error{
		"short buffer":  second(NewHostTensor(Float32, []int64{4}, unsafe.Pointer(&buf[0]), 12)),
		"no data":       second(NewHostTensor(Float32, []int64{1}, nil, 4)),
		"negative dim":  second(NewHostTensor(Float32, []int64{-1}, nil, 0)),
		"unknown type":  second(NewDeviceTensor(CPU(), ElemType(13), []int64{1})),
		"no device":     second(NewDeviceTensor(nil, Float32, []int64{1})),
		"huge":          second(NewDeviceTensor(CPU(), Int64, []int64{1 << 40, 1 << 40})),
		"copy counts":   CopyTensors([]*Value{h}, nil),
		"copy shapes":   CopyTensors([]*Value{h}, []*Value{hostVec(t, make([]float32, 6))}),
		"copy released": CopyTensors([]*Value{h}, []*Value{s}),
	} {
		if err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: err = %v, want a one-line error", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// TestElemType: the element types carry ONNX's numbers.
func TestElemType(t *testing.T) {
	for _, tc := range []struct {
		t    ElemType
		onnx int
		size int
		name string
	}{
		{Float32, 1, 4, "float32"}, {Int32, 6, 4, "int32"}, {Int64, 7, 8, "int64"}, {Bool, 9, 1, "bool"},
		{Float16, 10, 2, "float16"}, {BFloat16, 16, 2, "bfloat16"},
	} {
		if int(tc.t) != tc.onnx || tc.t.Size() != tc.size || tc.t.String() != tc.name {
			t.Errorf("%s: number %d size %d, want %d %d %s", tc.t, int(tc.t), tc.t.Size(), tc.onnx, tc.size, tc.name)
		}
	}
}

// TestOwnOps: with OwnOps a session knows Conveyor's Int8Linear and computes what the
// int8 kernel computes; without, the graph does not load.
func TestOwnOps(t *testing.T) {
	const K, N, M = 8, 5, 2
	codes := make([]int8, K*N)
	scale := make([]float32, N)
	for i := range codes {
		codes[i] = int8((i*37)%255 - 127)
	}
	for i := range scale {
		scale[i] = 0.01 * float32(i+1)
	}
	packed, err := kernels.PackInt8Layout(unsafe.Slice((*byte)(unsafe.Pointer(&codes[0])), len(codes)), K, N)
	if err != nil {
		t.Fatal(err)
	}
	path := model(t, t.TempDir(), "int8.onnx",
		[]pb{node(kernels.Int8OpName, kernels.Int8Domain, []string{"x", "w", "s"}, []string{"y"}, map[string]int64{"K": K, "N": N})},
		[]pb{initializer("w", onnxInt8, []int64{int64(len(packed))}, packed), initializer("s", int(Float32), []int64{N}, float32Bytes(scale))},
		[]pb{valueInfo("x", int(Float32), []int64{M, K})}, []pb{valueInfo("y", int(Float32), []int64{M, N})},
		kernels.Int8Domain)

	if _, err := NewSession(path, SessionConfig{}); err == nil {
		t.Error("a graph with Int8Linear loaded without OwnOps")
	}
	s, err := NewSession(path, SessionConfig{OwnOps: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	xs := make([]float32, M*K)
	for i := range xs {
		xs[i] = float32(math.Sin(float64(i)))
	}
	ys := make([]float32, M*N)
	x, err := NewHostTensor(Float32, []int64{M, K}, unsafe.Pointer(&xs[0]), 4*len(xs))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Release()
	y, err := NewHostTensor(Float32, []int64{M, N}, unsafe.Pointer(&ys[0]), 4*len(ys))
	if err != nil {
		t.Fatal(err)
	}
	defer y.Release()
	if err := s.Run([]string{"x"}, []*Value{x}, []string{"y"}, []*Value{y}); err != nil {
		t.Fatal(err)
	}
	w, err := kernels.PackInt8(codes, scale, K, N)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	want := make([]float32, M*N)
	if err := w.MatMul(want, xs, M); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ys, want) {
		t.Errorf("Int8Linear through the session = %v, kernels.Int8Weights = %v", ys, want)
	}
}

// TestDecoder runs a real decoder (models/testdata/gpt2-optimum, exported by PyTorch in
// the Optimum interface) through a session: int64 inputs, empty past tensors, every
// output pre-allocated; its logits match PyTorch's.
func TestDecoder(t *testing.T) {
	dir := filepath.Join("..", "testdata", "gpt2-optimum")
	raw, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		VocabSize int `json:"vocab_size"`
		Full      []struct {
			Tokens []int64   `json:"tokens"`
			Logits []float64 `json:"logits"`
		} `json:"full"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil || len(ref.Full) == 0 {
		t.Fatalf("reference.json: %v", err)
	}
	s, err := NewSession(filepath.Join(dir, "model.onnx"), SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	const kvHeads, headDim = 4, 16
	tokens := ref.Full[0].Tokens
	n := int64(len(tokens))
	int64s := func(xs []int64) *Value {
		v, err := NewHostTensor(Int64, []int64{1, int64(len(xs))}, unsafe.Pointer(&xs[0]), 8*len(xs))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(v.Release)
		return v
	}
	mask, pos := make([]int64, n), make([]int64, n)
	for i := range mask {
		mask[i], pos[i] = 1, int64(i)
	}
	var ins []*Value
	for _, name := range s.InputNames() {
		switch {
		case name == "input_ids":
			ins = append(ins, int64s(tokens))
		case name == "attention_mask":
			ins = append(ins, int64s(mask))
		case name == "position_ids":
			ins = append(ins, int64s(pos))
		case strings.HasPrefix(name, "past_key_values."):
			v, err := NewHostTensor(Float32, []int64{1, kvHeads, 0, headDim}, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer v.Release()
			ins = append(ins, v)
		default:
			t.Fatalf("unexpected input %q", name)
		}
	}
	logits := make([]float32, n*int64(ref.VocabSize))
	var outs []*Value
	for _, name := range s.OutputNames() {
		var v *Value
		var err error
		if name == "logits" {
			v, err = NewHostTensor(Float32, []int64{1, n, int64(ref.VocabSize)}, unsafe.Pointer(&logits[0]), 4*len(logits))
		} else {
			v, err = NewDeviceTensor(CPU(), Float32, []int64{1, kvHeads, n, headDim})
		}
		if err != nil {
			t.Fatal(err)
		}
		defer v.Release()
		outs = append(outs, v)
	}
	if err := s.Run(s.InputNames(), ins, s.OutputNames(), outs); err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for i, want := range ref.Full[0].Logits {
		worst = max(worst, math.Abs(float64(logits[i])-want))
	}
	if worst > 1e-3 {
		t.Errorf("logits differ from PyTorch's by up to %g", worst)
	}
}

// TestSessionThreads: a session runs on the shared pool when its thread count is the
// pool's (or 0), unless it asks not to spin and the pool spins; otherwise on a pool of
// its own of its thread count.
func TestSessionThreads(t *testing.T) {
	for _, tc := range []struct {
		cfg       SessionConfig
		poolSpins bool
		own       int // 0: the shared pool
	}{
		{SessionConfig{}, true, 0},
		{SessionConfig{Threads: 2}, true, 0},
		{SessionConfig{Threads: 3}, true, 3},
		{SessionConfig{NoSpin: true}, true, 2},
		{SessionConfig{Threads: 2, NoSpin: true}, true, 2},
		{SessionConfig{Threads: 2, NoSpin: true}, false, 0},
		{SessionConfig{Threads: 2}, false, 0},
		{SessionConfig{Threads: 1, NoSpin: true}, false, 1},
	} {
		own, err := sessionThreads(PoolOptions{Threads: 2, Spin: tc.poolSpins}, tc.cfg)
		if err != nil || own != tc.own {
			t.Errorf("%+v with a pool of 2 that spins=%v: %d, %v; want %d", tc.cfg, tc.poolSpins, own, err, tc.own)
		}
	}
	if _, err := sessionThreads(testPool, SessionConfig{Threads: -1}); err == nil {
		t.Error("-1 threads accepted")
	}
}

// TestManyOutputs: a run takes more outputs than cv_ort_run keeps on its stack, as a
// decoder of 32 layers has (logits and 64 present tensors).
func TestManyOutputs(t *testing.T) {
	const n = 70
	vec := func(name string) pb { return valueInfo(name, int(Float32), []int64{2}) }
	var nodes, outs []pb
	var names []string
	for i := range n {
		name := fmt.Sprintf("y%d", i)
		nodes = append(nodes, pb(nil).str(1, "x").str(2, name).str(3, name).str(4, "Identity")) // node() names every node op_0
		outs, names = append(outs, vec(name)), append(names, name)
	}
	s, err := NewSession(model(t, t.TempDir(), "many.onnx", nodes, nil, []pb{vec("x")}, outs), SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ys := make([][]float32, n)
	vals := make([]*Value, n)
	for i := range ys {
		ys[i] = make([]float32, 2)
		vals[i] = hostVec(t, ys[i])
	}
	if err := s.Run([]string{"x"}, []*Value{hostVec(t, []float32{3, 4})}, names, vals); err != nil {
		t.Fatal(err)
	}
	for i, y := range ys {
		if !slices.Equal(y, []float32{3, 4}) {
			t.Fatalf("output %d = %v, want 3 4", i, y)
		}
	}
}

// TestModelIO reads a decoder's inputs and outputs: names in the graph's order, element
// types, and shapes with -1 for their symbolic dimensions.
func TestModelIO(t *testing.T) {
	ins, outs, err := ModelIO(filepath.Join("..", "testdata", "gpt2-optimum", "model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSession(filepath.Join("..", "testdata", "gpt2-optimum", "model.onnx"), SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	names := func(infos []TensorInfo) []string {
		var ns []string
		for _, i := range infos {
			ns = append(ns, i.Name)
		}
		return ns
	}
	if !slices.Equal(names(ins), s.InputNames()) || !slices.Equal(names(outs), s.OutputNames()) {
		t.Errorf("ModelIO names %v -> %v, the session's %v -> %v", names(ins), names(outs), s.InputNames(), s.OutputNames())
	}
	want := map[string]TensorInfo{
		"input_ids":             {"input_ids", Int64, []int64{-1, -1}},
		"past_key_values.0.key": {"past_key_values.0.key", Float32, []int64{-1, 4, -1, 16}},
		"logits":                {"logits", Float32, []int64{-1, -1, 512}},
		"present.1.value":       {"present.1.value", Float32, []int64{-1, 4, -1, 16}},
	}
	for _, info := range append(ins, outs...) {
		if w, ok := want[info.Name]; ok {
			if info.Type != w.Type || !slices.Equal(info.Shape, w.Shape) {
				t.Errorf("%s: %s%v, want %s%v", info.Name, info.Type, info.Shape, w.Type, w.Shape)
			}
			delete(want, info.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("ModelIO lacks %v", want)
	}
	if _, _, err := ModelIO(filepath.Join(t.TempDir(), "none.onnx")); err == nil || !strings.Contains(err.Error(), "cannot load") {
		t.Errorf("a missing model: err = %v", err)
	}
}

// TestOptimizedModel: with OptimizedModel a session writes the graph as ONNX Runtime
// optimised it.
func TestOptimizedModel(t *testing.T) {
	out := filepath.Join(t.TempDir(), "optimized.onnx")
	s, err := NewSession(addModel(t), SessionConfig{OptimizedModel: out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		t.Fatalf("no optimised graph written: %v", err)
	}
	o, err := NewSession(out, SessionConfig{})
	if err != nil {
		t.Fatalf("the optimised graph does not load: %v", err)
	}
	o.Close()
}

// TestDroppedValue: a Value dropped without Release is freed by the garbage collector,
// its Go memory unpinned (a pinned object the collector finds unreachable would panic).
func TestDroppedValue(t *testing.T) {
	for range 3 {
		buf := make([]float32, 1024)
		if _, err := NewHostTensor(Float32, []int64{1024}, unsafe.Pointer(&buf[0]), 4*len(buf)); err != nil {
			t.Fatal(err)
		}
		if _, err := NewDeviceTensor(CPU(), Float32, []int64{1024}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // cleanups and finalizers run on their own goroutine
	}
}

// TestProfile: with CONVEYOR_ORT_PROFILE set, a session writes ONNX Runtime's trace of its
// runs when it closes, naming the node that ran and its execution provider.
func TestProfile(t *testing.T) {
	path := addModel(t)
	prefix := filepath.Join(t.TempDir(), "trace")
	t.Setenv(ProfileEnv, prefix)
	s, err := NewSession(path, SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	x, y, z := hostVec(t, []float32{1}), hostVec(t, []float32{2}), hostVec(t, []float32{0})
	if err := s.Run([]string{"x", "y"}, []*Value{x, y}, []string{"z"}, []*Value{z}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(prefix + "_" + strings.TrimSuffix(filepath.Base(path), ".onnx") + "_*.json")
	if len(files) != 1 {
		t.Fatalf("profile files %v, want one", files)
	}
	raw, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var events []struct {
		Cat  string         `json:"cat"`
		Name string         `json:"name"`
		Args map[string]any `json:"args"`
	}
	if err := json.Unmarshal(raw, &events); err != nil {
		t.Fatalf("profile is not a Chrome trace: %v", err)
	}
	nodes := 0
	for _, e := range events {
		if e.Cat == "Node" && e.Args["provider"] == "CPUExecutionProvider" {
			nodes++
		}
	}
	if nodes == 0 {
		t.Errorf("no node event with its provider among %d events", len(events))
	}
}
