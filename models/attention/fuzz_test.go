package attention

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
)

// FuzzRun feeds Run block tables, lengths and block sizes decoded from the fuzzer's
// bytes: any input is either refused with ErrBadInput or computed like the reference,
// and never reads outside the arenas (those reads would crash or differ).
func FuzzRun(f *testing.F) {
	f.Add([]byte{4, 2, 1, 3, 0, 5, 9, 0, 1, 2, 3, 4, 5, 6})
	f.Add([]byte{1, 1, 0, 0, 200, 7, 255, 255, 3})
	f.Add([]byte{16, 3, 2, 40, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	p := Params{NumHeads: 4, NumKVHeads: 2, HeadDim: 8, Scale: 0.35, Rotary: llamaRotary(8, 10000), SlidingWindow: 0}
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int(int8(b))
		}
		bs := next()
		numBlocks := next()
		nseq := min(max(next(), 0), 4)
		var seqs []Seq
		tokens := 0
		for range nseq {
			s := Seq{PastLen: next(), NumNew: next()}
			for range min(max(next(), 0), 12) {
				s.Table = append(s.Table, int32(next()))
			}
			if s.NumNew > 0 {
				tokens += s.NumNew
			}
			seqs = append(seqs, s)
		}
		window := max(next(), 0)
		pw := p
		pw.SlidingWindow = window
		l, err := NewLayer(pw, 64)
		if err != nil {
			t.Fatal(err)
		}
		arenaBlocks := max(numBlocks, 0)
		size := arenaBlocks * p.NumKVHeads * max(bs, 0) * p.HeadDim
		k, v := make([]float32, size), make([]float32, size)
		for i := range k {
			k[i], v[i] = float32(i%7)*0.1, float32(i%5)*0.2
		}
		qkv := make([]float32, tokens*p.QKVCols())
		for i := range qkv {
			var b [4]byte
			binary.LittleEndian.PutUint32(b[:], uint32(i*2654435761))
			qkv[i] = float32(int8(b[1])) / 64
		}
		qkvRef := append([]float32(nil), qkv...)
		att := make([]float32, tokens*p.OutCols())
		c := Cache{K: bytesOf(k), V: bytesOf(v), NumBlocks: numBlocks, BlockSize: bs, DType: kvcache.Float32}
		refK, refV := append([]float32(nil), k...), append([]float32(nil), v...)
		err = l.Run(c, seqs, qkv, att)
		if err != nil {
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("Run = %v, want nil or ErrBadInput", err)
			}
			return
		}
		// Two sequences may name the same block (the fuzzer does not respect ownership):
		// then the order of their writes decides and the reference cannot be compared.
		owner := map[[2]int]int{}
		for i, s := range seqs {
			for j := range s.NumNew {
				key := [2]int{int(s.Table[(s.PastLen+j)/bs]), (s.PastLen + j) % bs}
				if o, ok := owner[key]; ok && o != i {
					return
				}
				owner[key] = i
			}
			for pos := range s.PastLen + s.NumNew {
				key := [2]int{int(s.Table[pos/bs]), pos % bs}
				if o, ok := owner[key]; ok && o != i {
					return
				}
			}
		}
		want := referenceRun(pw, c, refK, refV, seqs, qkvRef)
		for i := range want {
			if math.Abs(float64(att[i])-want[i]) > 1e-4 {
				t.Fatalf("att[%d] = %v, reference %v", i, att[i], want[i])
			}
		}
	})
}
