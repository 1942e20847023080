package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models"
)

// fakeModel is a deterministic stand-in for a decoder. The logits after a token prefix
// depend on the whole prefix (fakeNext), and the keys and values it writes encode
// (token, position, layer, head, dim), so every pass can check that the batch's cache and
// block tables hold exactly the right past: a wrong, stale or missing block makes Forward
// fail, and a sequence's output then differs from fakeGreedy. Like the dense runner it
// gathers the past from the cache (Storage.Gather) and scatters the new keys and values
// into it (Storage.Scatter).
type fakeModel struct {
	spec models.Spec

	mu       sync.Mutex
	calls    int
	tokens   int // tokens fed over all calls
	rows     int
	failCall func(call int, b *models.Batch) error // optional
	// context, when set, is how many of the last tokens the logits depend on (a short
	// context makes greedy replies repeat, as speculation's prompt lookup needs); 0: all.
	context int
	kbuf    [][]byte
	vbuf    [][]byte
	pk, pv  [][]byte
}

const (
	fakeLayers  = 2
	fakeHeads   = 2
	fakeHeadDim = 4
	fakeVocab   = 97
	fakeEOS     = 0
)

func newFakeModel(maxPositions int) *fakeModel {
	return &fakeModel{spec: models.Spec{
		NumLayers: fakeLayers, NumKVHeads: fakeHeads, HeadDim: fakeHeadDim, VocabSize: fakeVocab,
		MaxPositions: maxPositions, KVDType: models.Float32, BOSTokenID: -1, EOSTokenIDs: []int32{fakeEOS},
	}}
}

func (m *fakeModel) Spec() models.Spec { return m.spec }
func (m *fakeModel) Close() error      { return nil }

func (m *fakeModel) stats() (calls, tokens int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls, m.tokens
}

// kvValue is the key stored for token tok at position pos (the value is its negation).
func kvValue(tok int32, pos, l, h, d int) float32 {
	return float32(int(tok)*65536 + pos*16 + l*8 + h*4 + d)
}

// fakeHash mixes a token prefix into one number.
func fakeHash(prefix []int32) uint64 {
	h := uint64(1469598103934665603)
	for _, t := range prefix {
		h ^= uint64(t) + 1
		h *= 1099511628211
		h ^= h >> 29
	}
	return h
}

// fakeNext is the most likely token after prefix.
func fakeNext(prefix []int32) int32 {
	return int32(fakeHash(prefix) % fakeVocab)
}

// fakeLogits fills out with the logits after prefix: 4 for fakeNext, values in [0, 1)
// elsewhere.
func fakeLogits(prefix []int32, out []float32) {
	h := fakeHash(prefix)
	for i := range out {
		x := (h ^ uint64(i)*0x9E3779B97F4A7C15) * 0xBF58476D1CE4E5B9
		out[i] = float32(x>>40) / float32(1<<24)
	}
	out[h%fakeVocab] = 4
}

// fakeGreedy is the reference: the greedy continuation of prompt, stopping after eos or
// maxTokens tokens.
func fakeGreedy(prompt []int32, maxTokens int) []int32 {
	seq := append([]int32(nil), prompt...)
	var out []int32
	for len(out) < maxTokens {
		t := fakeNext(seq)
		out = append(out, t)
		seq = append(seq, t)
		if t == fakeEOS {
			break
		}
	}
	return out
}

func f32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func putF32(b []byte, i int, x float32) {
	binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	b = b[:n]
	clear(b)
	return b
}

// Forward checks the gathered past, computes logits from past + new tokens and scatters
// the new keys and values.
func (m *fakeModel) Forward(b *models.Batch) (*models.Output, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if m.failCall != nil {
		if err := m.failCall(m.calls, b); err != nil {
			return nil, err
		}
	}
	rows := len(b.Seqs)
	maxPast, maxNew := 0, 0
	var tables [][]kvcache.BlockID
	var pastLens, counts []int
	for _, s := range b.Seqs {
		maxPast = max(maxPast, s.PastLen)
		maxNew = max(maxNew, len(s.Tokens))
		m.tokens += len(s.Tokens)
		if s.PastLen+len(s.Tokens) > m.spec.MaxPositions {
			return nil, fmt.Errorf("fake: %d positions exceed the context %d", s.PastLen+len(s.Tokens), m.spec.MaxPositions)
		}
		if s.PastLen > 0 && b.Cache == nil {
			return nil, fmt.Errorf("fake: a past of %d tokens without a cache", s.PastLen)
		}
		tables = append(tables, s.Blocks)
		pastLens = append(pastLens, s.PastLen)
		counts = append(counts, len(s.Tokens))
	}
	m.rows += rows
	H, D := fakeHeads, fakeHeadDim
	if len(m.kbuf) == 0 {
		m.kbuf, m.vbuf = make([][]byte, fakeLayers), make([][]byte, fakeLayers)
		m.pk, m.pv = make([][]byte, fakeLayers), make([][]byte, fakeLayers)
	}
	for l := range fakeLayers {
		m.kbuf[l] = grow(m.kbuf[l], rows*H*maxPast*D*4)
		m.vbuf[l] = grow(m.vbuf[l], rows*H*maxPast*D*4)
		// Poison the buffers: Gather must overwrite every element.
		for i := range m.kbuf[l] {
			m.kbuf[l][i], m.vbuf[l][i] = 0x7f, 0x7f
		}
	}
	if maxPast > 0 {
		if err := b.Cache.Gather(tables, pastLens, maxPast, m.kbuf, m.vbuf); err != nil {
			return nil, err
		}
	}
	kf, vf := make([][]float32, fakeLayers), make([][]float32, fakeLayers)
	for l := range fakeLayers {
		kf[l], vf[l] = f32s(m.kbuf[l]), f32s(m.vbuf[l])
	}
	out := &models.Output{Logits: make([][]float32, rows)}
	for r, s := range b.Seqs {
		full := make([]int32, 0, s.PastLen+len(s.Tokens))
		for p := range maxPast {
			var tok int32
			for l := range fakeLayers {
				for h := range H {
					for d := range D {
						i := ((r*H+h)*maxPast+p)*D + d
						if p >= s.PastLen {
							if kf[l][i] != 0 || vf[l][i] != 0 {
								return nil, fmt.Errorf("fake: row %d position %d beyond the past %d is not zeroed", r, p, s.PastLen)
							}
							continue
						}
						if l == 0 && h == 0 && d == 0 {
							tok = int32(int(kf[l][i]) / 65536)
						}
						if want := kvValue(tok, p, l, h, d); kf[l][i] != want || vf[l][i] != -want {
							return nil, fmt.Errorf("fake: row %d position %d layer %d head %d dim %d holds k=%v v=%v, want %v", r, p, l, h, d, kf[l][i], vf[l][i], want)
						}
					}
				}
			}
			if p < s.PastLen {
				full = append(full, tok)
			}
		}
		full = append(full, s.Tokens...)
		n := 1
		if s.AllLogits {
			n = len(s.Tokens)
		}
		logits := make([]float32, n*fakeVocab)
		for j := range n {
			end := len(full) - n + j + 1
			from := 0
			if m.context > 0 {
				from = max(0, end-m.context)
			}
			fakeLogits(full[from:end], logits[j*fakeVocab:(j+1)*fakeVocab])
		}
		out.Logits[r] = logits
	}
	total := maxPast + maxNew
	for l := range fakeLayers {
		m.pk[l] = grow(m.pk[l], rows*H*total*D*4)
		m.pv[l] = grow(m.pv[l], rows*H*total*D*4)
		for r, s := range b.Seqs {
			for j, tok := range s.Tokens {
				for h := range H {
					for d := range D {
						i := ((r*H+h)*total+maxPast+j)*D + d
						x := kvValue(tok, s.PastLen+j, l, h, d)
						putF32(m.pk[l], i, x)
						putF32(m.pv[l], i, -x)
					}
				}
			}
		}
	}
	if b.Cache != nil {
		if err := b.Cache.Scatter(tables, pastLens, counts, total, maxPast, m.pk, m.pv); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fakeText is a textSource over a byteStream where token i reads "<i>".
type fakeText struct{}

func fakeTokenText(id int32) string { return fmt.Sprintf("<%d>", id) }

func (fakeText) newStream([]int32, bool) textStream {
	vocab := make([]string, fakeVocab)
	for i := range vocab {
		vocab[i] = fakeTokenText(int32(i))
	}
	return &byteStream{vocab: vocab}
}
func (fakeText) tokenText(id int32) string { return fakeTokenText(id) }
func (fakeText) eos() []int32              { return nil }

// testConfig is a small engine configuration for the fake model.
func testConfig() Config {
	c := DefaultConfig()
	c.MaxNumSeqs = 32
	c.MaxNumBatchedTokens = 256
	c.BlockSizeTokens = 16
	c.KVCacheBytes = blockBytesFake(16) * 512
	c.MaxQueue = 256
	c.StorageParallelism = 1
	return c
}

func blockBytesFake(blockSize int) int64 {
	return int64(2 * fakeLayers * fakeHeads * fakeHeadDim * 4 * blockSize)
}

// startEngine builds and runs an engine; the test's cleanup shuts it down.
func startEngine(t testing.TB, cfg Config, m Model, text textSource) *Engine {
	t.Helper()
	e, err := newEngine(cfg, m, text)
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return e
}

// result is everything one request produced.
type result struct {
	seqs   map[int]*Event // merged per sequence index
	usage  *Usage
	events int
}

// collect reads a request's channel to the end.
func collect(ch <-chan Event) result {
	res := result{seqs: map[int]*Event{}}
	for ev := range ch {
		res.events++
		acc := res.seqs[ev.Index]
		if acc == nil {
			acc = &Event{}
			res.seqs[ev.Index] = acc
		}
		mergeEvent(acc, ev)
		if ev.Usage != nil {
			res.usage = ev.Usage
		}
	}
	return res
}

func greedyRequest(id string, prompt []int32, maxTokens int) *Request {
	p := DefaultSamplingParams()
	p.Temperature = 0
	p.MaxTokens = maxTokens
	return &Request{ID: id, Prompt: prompt, Params: p}
}

// testPrompt returns a deterministic prompt of n tokens.
func testPrompt(seed, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(1 + (seed*7919+i*104729+(seed*i)%13)%(fakeVocab-1))
	}
	return out
}
