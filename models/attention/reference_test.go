package attention

import (
	"math"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// referenceRun is the plain float64 attention the kernel is checked against: it
// reads every key and value through the block table one position at a time, with no
// tiling, no online state and no vector code. It returns the expected output and
// applies the same cache writes Run makes to refK, refV (float32 values; with half, the
// stored keys and values are rounded to float16 as a float16 arena holds them).
func referenceRun(p Params, c Cache, refK, refV []float32, seqs []Seq, qkvIn []float32, half ...bool) []float64 {
	store := func(x float64) float32 {
		if len(half) > 0 && half[0] {
			return kvcache.Float16ToFloat32(kvcache.Float32ToFloat16(float32(x)))
		}
		return float32(x)
	}
	D := p.HeadDim
	cols := p.QKVCols()
	G := p.Group()
	qkv := make([]float64, len(qkvIn))
	for i, x := range qkvIn {
		qkv[i] = float64(x)
	}
	// Rotary, per the Hugging Face definition: rotate_half over the first Dims dims.
	t := 0
	for _, s := range seqs {
		for j := range s.NumNew {
			pos := s.PastLen + j
			row := qkv[t*cols : (t+1)*cols]
			half := p.Rotary.Dims / 2
			f := 1.0
			if p.Rotary.AttentionFactor != 0 {
				f = float64(p.Rotary.AttentionFactor)
			}
			for h := 0; h < p.NumHeads+p.NumKVHeads; h++ {
				x := row[h*D : (h+1)*D]
				for i := range half {
					angle := float64(float32(pos) * p.Rotary.InvFreq[i])
					cs, sn := math.Cos(angle)*f, math.Sin(angle)*f
					a, b := x[i], x[i+half]
					x[i], x[i+half] = a*cs-b*sn, b*cs+a*sn
				}
			}
			blk := int(s.Table[pos/c.BlockSize])
			for h := range p.NumKVHeads {
				o := ((blk*p.NumKVHeads+h)*c.BlockSize + pos%c.BlockSize) * D
				for d := range D {
					refK[o+d] = store(row[(p.NumHeads+h)*D+d])
					refV[o+d] = store(row[(p.NumHeads+p.NumKVHeads+h)*D+d])
				}
			}
			t++
		}
	}
	out := make([]float64, t*p.OutCols())
	t = 0
	for _, s := range seqs {
		for j := range s.NumNew {
			pos := s.PastLen + j
			for h := range p.NumHeads {
				kvh := h / G
				q := qkv[t*cols+h*D : t*cols+(h+1)*D]
				var keys []int
				for k := 0; k <= pos; k++ {
					if p.SlidingWindow == 0 || pos-k < p.SlidingWindow {
						keys = append(keys, k)
					}
				}
				scores := make([]float64, len(keys))
				m := math.Inf(-1)
				for i, k := range keys {
					o := ((int(s.Table[k/c.BlockSize])*p.NumKVHeads+kvh)*c.BlockSize + k%c.BlockSize) * D
					var dot float64
					for d := range D {
						dot += q[d] * float64(refK[o+d])
					}
					dot *= float64(p.Scale)
					if p.Softcap > 0 {
						dot = float64(p.Softcap) * math.Tanh(dot/float64(p.Softcap))
					}
					scores[i] = dot
					m = math.Max(m, dot)
				}
				var sum float64
				for i := range scores {
					scores[i] = math.Exp(scores[i] - m)
					sum += scores[i]
				}
				dst := out[t*p.OutCols()+h*D : t*p.OutCols()+(h+1)*D]
				for i, k := range keys {
					o := ((int(s.Table[k/c.BlockSize])*p.NumKVHeads+kvh)*c.BlockSize + k%c.BlockSize) * D
					for d := range D {
						dst[d] += scores[i] / sum * float64(refV[o+d])
					}
				}
			}
			t++
		}
	}
	return out
}
