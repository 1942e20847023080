package engine

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
)

// windowWatch counts the rows whose block tables had blocks given back (NoBlock), and
// can hide the model's windows (every layer then keeps its whole past, one group).
type windowWatch struct {
	models.Model
	hide bool

	mu       sync.Mutex
	gaveBack int
}

func (m *windowWatch) Spec() models.Spec {
	s := m.Model.Spec()
	if m.hide {
		s.LayerWindows = nil
	}
	return s
}

func (m *windowWatch) Forward(b *models.Batch) (*models.Output, error) {
	m.mu.Lock()
	for _, s := range b.Seqs {
		if slices.Contains(s.Blocks, kvcache.NoBlock) || slices.ContainsFunc(s.GroupBlocks, func(t []kvcache.BlockID) bool {
			return slices.Contains(t, kvcache.NoBlock)
		}) {
			m.gaveBack++
		}
	}
	m.mu.Unlock()
	return m.Model.Forward(b)
}

// TestONNXSlidingWindowGroups serves Gemma 2's fixture (sliding, full and sliding layers,
// a 4-token window) on both attention paths: with its sliding layers in their own KV
// groups, which give back the blocks the window has passed, every request generates
// exactly what it generates with every layer keeping its whole past (the layout the
// families test checks against PyTorch), with prefix hits and chunked prefill across the
// window; and every block comes back.
func TestONNXSlidingWindowGroups(t *testing.T) {
	dir := t.TempDir()
	if _, err := convert.BuildFromHF(filepath.Join("..", "models", "testdata", "families", "gemma2"), dir, convert.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, path := range attentionPaths {
		t.Run(path, func(t *testing.T) {
			m, err := models.Open(dir, models.RunnerOptions{ORTLib: ortLib(t), IntraOpThreads: 1, Attention: path})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m.Close() })
			if w := m.Spec().LayerWindows; !slices.Equal(w, []int{4, 0, 4}) {
				t.Fatalf("layer windows %v, want [4 0 4]", w)
			}
			// The step graph's PagedAttention takes blocks of 16 tokens or more.
			bs := max(4, m.Spec().MinBlockSize)
			// run serves the requests one after another, or all at once in a cache of
			// kvBlocks blocks (0: plenty) so small that sequences are preempted.
			run := func(hide bool, kvBlocks int) ([][]int32, [][]float32, *windowWatch) {
				watch := &windowWatch{Model: m, hide: hide}
				cfg := tinyConfig()
				cfg.BlockSizeTokens = bs
				cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens = 4, 7 // prompts prefill in chunks across the window
				if kvBlocks > 0 {
					spec := m.Spec()
					cfg.KVCacheBytes = int64(kvBlocks) * kvcache.BlockBytes(bs, 1, spec.NumKVHeads, spec.HeadDim, spec.KVDType)
				}
				e, err := newEngine(cfg, watch, nil)
				if err != nil {
					t.Fatal(err)
				}
				if g := e.pool.NumGroups(); (g == 1) != hide {
					t.Fatalf("hide %v: %d KV groups", hide, g)
				}
				e.Start(context.Background())
				defer shutdown(t, e)
				var toks [][]int32
				var lps [][]float32
				// The second prompt starts like the first: its prefix comes from the cache.
				// The shared prefix is three blocks long.
				first := []int32{2}
				for len(first) < 3*bs+2 {
					first = append(first, int32(5+4*len(first)-4)%100)
				}
				second := append(slices.Clone(first[:3*bs]), 60, 61, 62)
				prompts := [][]int32{first, second, {7, 8}}
				// The last request samples three sequences, forked from one prefill.
				var chans []<-chan Event
				var results []result
				var ns []int
				for i, p := range append(prompts, prompts[1]) {
					params := DefaultSamplingParams()
					params.MaxTokens, params.IgnoreEOS, params.Logprobs, params.Temperature = 30, true, 0, 0
					if i == len(prompts) {
						seed := int64(7)
						params.N, params.Temperature, params.Seed = 3, 1, &seed
					}
					ch, err := e.Submit(context.Background(), &Request{ID: string(rune('a' + i)), Prompt: p, Params: params})
					if err != nil {
						t.Fatal(err)
					}
					if kvBlocks == 0 { // one after another: the later ones hit the prefix cache
						results = append(results, collect(ch))
					}
					chans, ns = append(chans, ch), append(ns, params.N)
				}
				if kvBlocks > 0 {
					for _, ch := range chans {
						results = append(results, collect(ch))
					}
				}
				for i, res := range results {
					for j := range ns[i] {
						ev := res.seqs[j]
						if ev == nil || ev.Err != nil || len(ev.TokenIDs) != 30 {
							t.Fatalf("request %d sequence %d: %+v", i, j, ev)
						}
						toks = append(toks, ev.TokenIDs)
						var lp []float32
						for _, l := range ev.Logprobs {
							lp = append(lp, l.Logprob)
						}
						lps = append(lps, lp)
					}
				}
				st := e.Stats()
				shutdown(t, e)
				if ps := e.pool.Stats(); ps.UsedBlocks != 0 || ps.PrefixHitsTokens == 0 {
					t.Fatalf("hide %v: %d blocks still in use, %d prefix hit tokens", hide, ps.UsedBlocks, ps.PrefixHitsTokens)
				}
				if kvBlocks > 0 && st.Preemptions == 0 {
					t.Fatalf("a cache of %d blocks preempted nothing", kvBlocks)
				}
				if err := e.pool.CheckInvariants(); err != nil {
					t.Fatal(err)
				}
				return toks, lps, watch
			}
			wantToks, wantLps, full := run(true, 0)
			if full.gaveBack != 0 {
				t.Fatalf("%d rows with blocks given back with one group", full.gaveBack)
			}
			// A cache of 30 blocks (14 of 16 tokens) preempts sequences.
			for _, kvBlocks := range []int{0, max(14, 30*4/bs)} {
				gotToks, gotLps, grouped := run(false, kvBlocks)
				if grouped.gaveBack == 0 {
					t.Fatalf("%d blocks: no row had blocks given back with window groups", kvBlocks)
				}
				for i := range wantToks {
					if !slices.Equal(gotToks[i], wantToks[i]) {
						t.Fatalf("%d blocks, sequence %d: %v with window groups, %v with the whole past kept", kvBlocks, i, gotToks[i], wantToks[i])
					}
					for j := range wantLps[i] {
						if d := math.Abs(float64(gotLps[i][j] - wantLps[i][j])); d > 1e-4 {
							t.Fatalf("%d blocks, sequence %d token %d: logprob %v vs %v", kvBlocks, i, j, gotLps[i][j], wantLps[i][j])
						}
					}
				}
			}
		})
	}
}
