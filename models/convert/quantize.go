package convert

import (
	"fmt"
	"math"

	"github.com/conveyor-llm/conveyor/models/kernels"
)

// Quantization is how a build stores the linear layers' weights.
type Quantization struct {
	// Bits is 0 for float32, 8 or 4.
	//
	// int8 (BlockSize 0): every linear weight is quantized per output channel, one float32
	// scale each, symmetric; the activations are quantized per row (token) on the fly, one
	// scale each, symmetric, and the product runs through ONNX Runtime's
	// com.microsoft.MatMulIntegerToFloat, whose MLAS kernels use the CPU's int8 units
	// (AVX2, AVX512-VNNI, AMX) and pack the weights once at load. A row's result does not
	// depend on the other rows of the batch.
	//
	// int4: blocks of BlockSize values along the input axis, one float32 scale per block,
	// symmetric (the code range's middle is zero), through com.microsoft.MatMulNBits.
	Bits      int `json:"bits"`
	BlockSize int `json:"block_size"`
	// AccuracyLevel is MatMulNBits' accuracy_level (int4): 4 quantizes the activations to
	// int8 on the fly and multiplies in integers; 0 lets the kernel choose, which on CPUs
	// means float32 arithmetic on dequantized blocks.
	AccuracyLevel int `json:"accuracy_level"`
	// WideInt8 (int4 builds for the CPU): a linear whose source weights were stored with
	// more than 4 bits (Tensor.SourceBits: a GGUF file's Q5_0, Q6_K or Q8_0 tensors, the
	// layers a Q4_K_M file keeps wider) is built as int8 rather than rounded to int4.
	WideInt8 bool `json:"wide_int8,omitempty"`
}

// DefaultQuantBlockSize is the block size of --quantize.
const DefaultQuantBlockSize = 32

// ParseQuantization reads --quantize: "", "none" or "float32" (no quantization), "int8"
// (per channel) or "int4" (blocks of DefaultQuantBlockSize, int8 arithmetic).
func ParseQuantization(s string) (Quantization, error) {
	switch s {
	case "", "none", "float32":
		return Quantization{}, nil
	case "int8":
		return Quantization{Bits: 8}, nil
	case "int4":
		return Quantization{Bits: 4, BlockSize: DefaultQuantBlockSize, AccuracyLevel: 4}, nil
	}
	return Quantization{}, fmt.Errorf("unknown quantization %q (want int8, int4 or none)", s)
}

// String is the name ParseQuantization reads: "int8", "int4" or "none".
func (q Quantization) String() string {
	if q.Bits == 0 {
		return "none"
	}
	return fmt.Sprintf("int%d", q.Bits)
}

func (q Quantization) validate() error {
	switch {
	case q.Bits == 0:
		return nil
	case q.Bits != 4 && q.Bits != 8:
		return fmt.Errorf("convert: quantization to %d bits is not supported (want 4 or 8)", q.Bits)
	case q.Bits == 8 && q.BlockSize != 0:
		return fmt.Errorf("convert: int8 weights are quantized per output channel (block size %d given)", q.BlockSize)
	case q.Bits == 8:
		return nil
	case q.BlockSize < 16 || q.BlockSize&(q.BlockSize-1) != 0:
		return fmt.Errorf("convert: quantization block size %d must be a power of two, at least 16", q.BlockSize)
	}
	return nil
}

// quantizedWeight is one int4 linear weight in MatMulNBits' layout: for each output row n
// and block j of the input axis, blob[n][j] holds the block's codes packed low bits
// first, and scales[n*blocks+j] its scale; value = (code - zero) * scale with zero the
// code range's middle (8 for 4 bits, 128 for 8 bits).
type quantizedWeight struct {
	codes  []byte    // [N][blocks][BlockSize*Bits/8]
	scales []float32 // [N*blocks]
}

// quantizeRows quantizes the projections' rows (Hugging Face [out, in] weights, each
// scaled) stacked in order, as one [sum(out), in] matrix. Each block takes the better
// (in squared error) of two scales: the one mapping the value of largest magnitude to
// the most negative code, as llama.cpp's Q4_0 and Q8_0 do (all 2^bits codes used, but
// positive values near that magnitude clip by up to a step), and the one mapping it to
// ±(2^(bits-1) - 1) (one code unused, nothing clips). The last block of a row is
// zero-padded.
func quantizeRows(q Quantization, in int, ps []projection) quantizedWeight {
	rows := 0
	for _, p := range ps {
		rows += len(p.w) / in
	}
	blocks := (in + q.BlockSize - 1) / q.BlockSize
	blob := q.BlockSize * q.Bits / 8
	out := quantizedWeight{codes: make([]byte, rows*blocks*blob), scales: make([]float32, rows*blocks)}
	zero := 1 << (q.Bits - 1)
	maxCode := 1<<q.Bits - 1
	vals := make([]float32, q.BlockSize)
	codes := make([]int, q.BlockSize)
	r := 0
	for _, p := range ps {
		for o := 0; o < len(p.w)/in; o++ {
			row := p.w[o*in : (o+1)*in]
			for j := 0; j < blocks; j++ {
				clear(vals)
				for i := range vals {
					if k := j*q.BlockSize + i; k < in {
						vals[i] = row[k] * p.scale
					}
				}
				var extreme float32 // the value of largest magnitude, with its sign
				for _, v := range vals {
					if abs32(v) > abs32(extreme) {
						extreme = v
					}
				}
				scale := extreme / float32(-zero)
				if e := encodeBlock(vals, abs32(extreme)/float32(zero-1), zero, maxCode, codes); e < encodeBlock(vals, scale, zero, maxCode, codes) {
					scale = abs32(extreme) / float32(zero-1)
				}
				encodeBlock(vals, scale, zero, maxCode, codes)
				out.scales[r*blocks+j] = scale
				dst := out.codes[(r*blocks+j)*blob : (r*blocks+j+1)*blob]
				if q.Bits == 8 {
					for i, c := range codes {
						dst[i] = byte(c)
					}
				} else {
					for i := range dst {
						dst[i] = byte(codes[2*i]) | byte(codes[2*i+1])<<4
					}
				}
			}
			r++
		}
	}
	return out
}

// encodeBlock writes vals' codes at scale into codes and returns the squared error.
func encodeBlock(vals []float32, scale float32, zero, maxCode int, codes []int) float64 {
	inv := float32(0)
	if scale != 0 {
		inv = 1 / scale
	}
	sse := 0.0
	for i, v := range vals {
		c := min(max(int(math.Round(float64(v*inv)))+zero, 0), maxCode)
		codes[i] = c
		d := float64(v - float32(c-zero)*scale)
		sse += d * d
	}
	return sse
}

func abs32(v float32) float32 { return float32(math.Abs(float64(v))) }

// linear appends x @ W^T for the projections ps stacked as W ([sum(out), in]): a
// MatMul with the transposed float32 weight, int8 per-channel weights times per-row
// int8 activations (linearInt8), or a com.microsoft.MatMulNBits over int4 blocks.
func linear(b *graphBuilder, m *modelPlan, x, name string, in, out int64, ps []projection) string {
	q := m.quant
	switch q.Bits {
	case 0:
		return b.op("MatMul", []string{x, transposedWeight(b, name+"_t", in, out, ps)})
	case 8:
		return linearInt8Any(b, x, name, in, out, ps)
	}
	if q.WideInt8 && wide(ps) {
		return linearInt8Any(b, x, name, in, out, ps)
	}
	qw := quantizeRows(q, int(in), ps)
	blocks := (in + int64(q.BlockSize) - 1) / int64(q.BlockSize)
	codes := name + "_q" + fmt.Sprint(q.Bits)
	b.g.Initializers = append(b.g.Initializers, &onnxTensor{Name: codes, Dims: []int64{out, blocks, int64(q.BlockSize * q.Bits / 8)}, DataType: onnxUint8, Raw: qw.codes})
	scales := b.weight(name+"_scales", []int64{out * blocks}, qw.scales)
	y := b.fresh("MatMulNBits")
	b.g.Nodes = append(b.g.Nodes, &onnxNode{
		Name: fmt.Sprintf("%sMatMulNBits_%d", b.prefix, len(b.g.Nodes)), OpType: "MatMulNBits", Domain: msDomain,
		Inputs: []string{x, codes, scales}, Outputs: []string{y},
		Attrs: []onnxAttr{attrI("K", in), attrI("N", out), attrI("bits", int64(q.Bits)),
			attrI("block_size", int64(q.BlockSize)), attrI("accuracy_level", int64(q.AccuracyLevel))},
	})
	b.usesMS = true
	return y
}

// linearInt8Any is the int8 linear: Int8Linear where the graph may use Conveyor's own
// operators, else MatMulIntegerToFloat.
func linearInt8Any(b *graphBuilder, x, name string, in, out int64, ps []projection) string {
	if b.ownOps {
		return linearInt8Own(b, x, name, in, out, ps)
	}
	return linearInt8(b, x, name, in, out, ps)
}

// wide reports whether any of ps was stored with more than 4 bits per weight.
func wide(ps []projection) bool {
	for _, p := range ps {
		if p.sourceBits > 4 {
			return true
		}
	}
	return false
}

// msDomain is ONNX Runtime's contrib operator domain.
const msDomain = "com.microsoft"

// convDomain and convInt8Linear name Conveyor's own int8 linear operator, which the
// runtime registers with ONNX Runtime (package models/kernels: Int8Domain, Int8OpName).
const (
	convDomain     = "com.conveyor"
	convInt8Linear = "Int8Linear"
)

// linearInt8Own is linearInt8 as one Int8Linear node: the same int8 per-channel weights
// and per-row int8 activations, computed by Conveyor's kernel (AVX512-VNNI, AVX2), which
// quantizes the rows itself. The weights are stored in the kernel's packed layout
// (kernels.PackInt8Layout), so that it reads ONNX Runtime's initializer in place rather than
// keeping a second copy.
func linearInt8Own(b *graphBuilder, x, name string, in, out int64, ps []projection) string {
	cw := quantizeColumns(int(in), ps)
	packed, err := kernels.PackInt8Layout(cw.codes, int(in), int(out))
	if err != nil {
		panic(fmt.Sprintf("convert: %s: %v", name, err)) // the shapes come from a validated config
	}
	codes := name + "_q8p"
	b.g.Initializers = append(b.g.Initializers, &onnxTensor{Name: codes, Dims: []int64{int64(len(packed))}, DataType: onnxInt8, Raw: packed})
	scales := b.weight(name+"_scales", []int64{out}, cw.scales)
	y := b.fresh(convInt8Linear)
	b.g.Nodes = append(b.g.Nodes, &onnxNode{
		Name: fmt.Sprintf("%s%s_%d", b.prefix, convInt8Linear, len(b.g.Nodes)), OpType: convInt8Linear, Domain: convDomain,
		Inputs: []string{x, codes, scales}, Outputs: []string{y},
		Attrs: []onnxAttr{attrI("K", in), attrI("N", out)},
	})
	b.usesOwn = true
	return y
}

// channelWeight is one int8 linear weight: codes [in, out] row-major (x @ codes, as
// MatMulIntegerToFloat's B), value = code * scales[col].
type channelWeight struct {
	codes  []byte    // int8 codes, [in][out]
	scales []float32 // [out]
}

// quantizeColumns quantizes the projections' rows (Hugging Face [out, in] weights, each
// scaled) stacked in order as the columns of one [in, sum(out)] matrix: each output
// channel gets the scale that maps its largest magnitude to ±127, and codes in
// [-127, 127]. It reads the weights in place (no transposed float copy).
func quantizeColumns(in int, ps []projection) channelWeight {
	total := 0
	for _, p := range ps {
		total += len(p.w) / in
	}
	cw := channelWeight{codes: make([]byte, in*total), scales: make([]float32, total)}
	inv := make([]float32, total)
	col := 0
	for _, p := range ps {
		for o := 0; o < len(p.w)/in; o++ {
			var amax float32
			for _, v := range p.w[o*in : (o+1)*in] {
				amax = max(amax, abs32(v*p.scale))
			}
			cw.scales[col+o] = amax / 127
			if amax > 0 {
				inv[col+o] = 127 / amax
			}
		}
		col += len(p.w) / in
	}
	col = 0
	const tile = 32 // transpose in tiles so that reads and writes both stay in cache
	for _, p := range ps {
		out := len(p.w) / in
		for o0 := 0; o0 < out; o0 += tile {
			for r0 := 0; r0 < in; r0 += tile {
				for o := o0; o < min(o0+tile, out); o++ {
					f := p.scale * inv[col+o]
					for r := r0; r < min(r0+tile, in); r++ {
						c := math.Round(float64(p.w[o*in+r] * f))
						cw.codes[r*total+col+o] = byte(int8(min(max(c, -127), 127)))
					}
				}
			}
		}
		col += out
	}
	return cw
}

// linearInt8 appends x @ W^T with W quantized per output channel and each row of x
// quantized on the fly to int8 with its own scale s = max|x_row| (codes round(127 x/s),
// stored offset by 128 as uint8, as are the weights' codes), then multiplied in integers
// by com.microsoft.MatMulIntegerToFloat and rescaled:
//
//	y = (xq - 128) @ (wq - 128) * (1/127) * scales[col] * s_row
//
// Per-row scales keep one sequence's activations from setting another's precision, so
// a row's logits are the same whatever shares its batch.
func linearInt8(b *graphBuilder, x, name string, in, out int64, ps []projection) string {
	cw := quantizeColumns(int(in), ps)
	// The codes are stored offset by 128 as uint8, with zero point 128: ONNX Runtime then
	// multiplies uint8 by uint8 in 32-bit sums on every CPU. With int8 weights its AVX2
	// kernel (CPUs without VNNI) adds pairs of uint8 x int8 products in saturating 16-bit
	// sums, which overflow at these ranges (255 x 127 x 2 > 32767).
	for i, c := range cw.codes {
		cw.codes[i] = c ^ 0x80
	}
	codes := name + "_q8"
	b.g.Initializers = append(b.g.Initializers, &onnxTensor{Name: codes, Dims: []int64{in, out}, DataType: onnxUint8, Raw: cw.codes})
	scales := b.weight(name+"_scales", []int64{out}, cw.scales)
	zero := b.constUint8(128)
	amax := b.op("ReduceMax", []string{b.op("Abs", []string{x})}, attrIntList("axes", -1), attrI("keepdims", 1))
	s := b.op("Max", []string{amax, b.constFloat32(nil, 1e-30)}) // an all-zero row stays zero
	xq := b.op("QuantizeLinear", []string{b.op("Div", []string{x, s}), b.constFloat32(nil, 1.0/127), zero})
	y := b.fresh("MatMulIntegerToFloat")
	b.g.Nodes = append(b.g.Nodes, &onnxNode{
		Name: fmt.Sprintf("%sMatMulIntegerToFloat_%d", b.prefix, len(b.g.Nodes)), OpType: "MatMulIntegerToFloat", Domain: msDomain,
		Inputs: []string{xq, codes, b.constFloat32(nil, 1.0/127), scales, zero, zero}, Outputs: []string{y},
	})
	b.usesMS = true
	return b.op("Mul", []string{y, s})
}
