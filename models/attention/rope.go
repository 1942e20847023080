package attention

import (
	"math"
	"slices"
	"sync"
)

// ropeTablePositions bounds the positions a rotary table holds; positions beyond it
// are computed when met (a 128k-token context would otherwise cost 64 MB per table).
const ropeTablePositions = 16384

// ropeTable holds cos and sin of every position below its length, [pos][half] each.
type ropeTable struct {
	r        Rotary
	half     int
	n        int
	cos, sin []float32
}

var (
	ropeMu     sync.Mutex
	ropeTables []*ropeTable
)

// sharedRopeTable returns the table for r, shared by every layer with the same
// rotary parameters.
func sharedRopeTable(r Rotary, maxPositions int) *ropeTable {
	n := min(maxPositions, ropeTablePositions)
	ropeMu.Lock()
	defer ropeMu.Unlock()
	for _, t := range ropeTables {
		if t.n >= n && t.r.Dims == r.Dims && t.r.AttentionFactor == r.AttentionFactor && slices.Equal(t.r.InvFreq, r.InvFreq) {
			return t
		}
	}
	t := &ropeTable{r: r, half: r.Dims / 2, n: n}
	t.cos = make([]float32, n*t.half)
	t.sin = make([]float32, n*t.half)
	for pos := range n {
		ropeAngles(r, pos, t.cos[pos*t.half:(pos+1)*t.half], t.sin[pos*t.half:(pos+1)*t.half])
	}
	ropeTables = append(ropeTables, t)
	return t
}

// at returns cos and sin at pos; positions beyond the table are computed into buf.
func (t *ropeTable) at(pos int, buf *[]float32) (cos, sin []float32) {
	if pos < t.n {
		return t.cos[pos*t.half : (pos+1)*t.half], t.sin[pos*t.half : (pos+1)*t.half]
	}
	if cap(*buf) < 2*t.half {
		*buf = make([]float32, 2*t.half)
	}
	b := (*buf)[:2*t.half]
	ropeAngles(t.r, pos, b[:t.half], b[t.half:])
	return b[:t.half], b[t.half:]
}

// ropeAngles computes cos and sin of pos·InvFreq[i]. The angle is rounded to float32
// as Hugging Face's float32 computation rounds it, so long contexts turn as there.
func ropeAngles(r Rotary, pos int, cos, sin []float32) {
	f := float64(1)
	if r.AttentionFactor != 0 {
		f = float64(r.AttentionFactor)
	}
	for i, inv := range r.InvFreq {
		angle := float64(float32(pos) * inv)
		s, c := math.Sincos(angle)
		cos[i], sin[i] = float32(c*f), float32(s*f)
	}
}
