package build

import (
	"fmt"
	"math"
)

// Quantization is how a build stores the linear layers' weights.
type Quantization struct {
	// Bits is 0 for float32, or 8 or 4: every linear weight is quantized in blocks of
	// BlockSize values along its input axis, one float32 scale per block, symmetric
	// (the code range's middle is zero), and runs through ONNX Runtime's
	// com.microsoft.MatMulNBits kernel.
	Bits      int `json:"bits"`
	BlockSize int `json:"block_size"`
	// AccuracyLevel is MatMulNBits' accuracy_level: 4 quantizes the activations to int8
	// on the fly and multiplies in integers (VNNI / AVX-512 / AVX2 kernels); 0 lets the
	// kernel choose, which on CPUs means float32 arithmetic on dequantized blocks.
	AccuracyLevel int `json:"accuracy_level"`
}

// DefaultQuantBlockSize is the block size of --quantize.
const DefaultQuantBlockSize = 32

// ParseQuantization reads --quantize: "", "none" or "float32" (no quantization), "int8"
// or "int4", with the default block size and int8 arithmetic.
func ParseQuantization(s string) (Quantization, error) {
	switch s {
	case "", "none", "float32":
		return Quantization{}, nil
	case "int8":
		return Quantization{Bits: 8, BlockSize: DefaultQuantBlockSize, AccuracyLevel: 4}, nil
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
		return fmt.Errorf("build: quantization to %d bits is not supported (want 4 or 8)", q.Bits)
	case q.BlockSize < 16 || q.BlockSize&(q.BlockSize-1) != 0:
		return fmt.Errorf("build: quantization block size %d must be a power of two, at least 16", q.BlockSize)
	}
	return nil
}

// quantizedWeight is one linear weight in MatMulNBits' layout: for each output row n
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
// MatMul with the transposed float32 weight, or a com.microsoft.MatMulNBits over the
// quantized blocks when the build quantizes.
func linear(b *graphBuilder, m *modelPlan, x, name string, in, out int64, ps []projection) string {
	q := m.quant
	if q.Bits == 0 {
		return b.op("MatMul", []string{x, transposedWeight(b, name+"_t", in, out, ps)})
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

// msDomain is ONNX Runtime's contrib operator domain.
const msDomain = "com.microsoft"
