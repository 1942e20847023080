package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/scheduler"
)

// TestFamiliesSpeculationMatch: for every family fixture (random weights in each
// architecture's layout: sliding windows, soft-capping, q/k norms, rope scalings) on the
// step graph, greedy decoding with speculation returns the very tokens it returns
// without, one request alone and 64 at once, with prompt lookup, with the model as its
// own draft model (whose cache, with the family's layer groups, must stay in step for
// every proposal to be accepted) and with its int4 build as the draft.
func TestFamiliesSpeculationMatch(t *testing.T) {
	configs, err := filepath.Glob(filepath.Join("..", "models", "testdata", "families", "*", "config.json"))
	if err != nil || len(configs) == 0 {
		t.Fatalf("no family fixtures: %v", err)
	}
	for _, cfgPath := range configs {
		src := filepath.Dir(cfgPath)
		t.Run(filepath.Base(src), func(t *testing.T) {
			dir, dir4 := t.TempDir(), t.TempDir()
			if _, err := convert.BuildFromHF(src, dir, convert.Options{}); err != nil {
				t.Fatal(err)
			}
			// The int4 build (blocks of 16: the fixtures' widths are multiples of 16).
			if _, err := convert.BuildFromHF(src, dir4, convert.Options{Quantize: convert.Quantization{Bits: 4, BlockSize: 16}}); err != nil {
				t.Fatal(err)
			}
			open := func(dir string) Model {
				r, err := models.Open(dir, models.RunnerOptions{ORTLib: ortLib(t), IntraOpThreads: 1, Attention: models.AttentionGraph})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { r.Close() })
				return r
			}
			t.Parallel()
			m, draft, draft4 := open(dir), open(dir), open(dir4)
			vocab := m.Spec().VocabSize
			reqs := make([]*Request, 64)
			for i := range reqs {
				var p []int32
				for j := range 3 + i%9 {
					p = append(p, int32(3+(i*31+j*17)%(vocab-3)))
				}
				reqs[i] = greedyRequest(fmt.Sprintf("f%d", i), append(p, p...), 8+i%13)
			}
			run := func(reqs []*Request, spec scheduler.Speculation, draft Model) ([][]int32, Stats) {
				cfg := tinyConfig()
				cfg.Speculation, cfg.DraftModel = spec, draft
				e, err := New(cfg, m, nil)
				if err != nil {
					t.Fatal(err)
				}
				e.Start(context.Background())
				out := runAll(t, e, reqs)
				st := e.Stats()
				shutdown(t, e)
				if e.drafter != nil && e.drafter.failures != 0 {
					t.Fatalf("%d draft passes failed", e.drafter.failures)
				}
				ids := make([][]int32, len(out))
				for i, r := range out {
					ids[i] = r.seqs[0].TokenIDs
				}
				return ids, st
			}
			for _, n := range []int{1, 64} {
				want, _ := run(reqs[:n], scheduler.Speculation{}, nil)
				for _, tc := range []struct {
					name  string
					spec  scheduler.Speculation
					draft Model
				}{
					{"ngram", scheduler.Speculation{NumTokens: 4, LookupMin: 1, LookupMax: 3}, nil},
					{"draft_model", scheduler.Speculation{NumTokens: 3, External: true}, draft},
					{"draft_model int4", scheduler.Speculation{NumTokens: 3, External: true}, draft4},
				} {
					got, st := run(reqs[:n], tc.spec, tc.draft)
					for i := range want {
						if !slices.Equal(got[i], want[i]) {
							t.Fatalf("%s, %d at once, request %d: %v with speculation, %v without", tc.name, n, i, got[i], want[i])
						}
					}
					if st.SpecDraftTokens == 0 && (tc.draft != nil || n > 1) {
						t.Fatalf("%s, %d at once: nothing proposed", tc.name, n)
					}
					// The model as its own draft: only proposals past a finish are lost.
					if tc.draft == draft && float64(st.SpecAcceptedTokens) < 0.8*float64(st.SpecDraftTokens) {
						t.Fatalf("%s, %d at once: %d of %d accepted", tc.name, n, st.SpecAcceptedTokens, st.SpecDraftTokens)
					}
				}
			}
		})
	}
}
