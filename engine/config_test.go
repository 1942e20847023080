package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/scheduler"
)

// TestConfigNestsSchedulerConfig: the batching fields are the scheduler's own configuration,
// with the scheduler's defaults, reachable by their old names, and checked by its Validate.
func TestConfigNestsSchedulerConfig(t *testing.T) {
	c := DefaultConfig()
	want := scheduler.DefaultConfig()
	want.MaxModelLen = 0
	if c.SchedulerConfig != want {
		t.Fatalf("default batching config %+v, want the scheduler's %+v", c.SchedulerConfig, want)
	}
	c.MaxNumSeqs, c.MaxQueue = 7, 3
	if c.SchedulerConfig.MaxNumSeqs != 7 {
		t.Fatal("MaxNumSeqs is not the nested field")
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	sc := c.schedulerConfig(100)
	if sc.MaxModelLen != 100 || sc.MaxQueue != 3+7+1 || sc.MaxBatchSize != 0 || !sc.EnableChunkedPrefill {
		t.Fatalf("scheduler config %+v", sc)
	}
	for name, mutate := range map[string]func(*Config){
		"MaxNumSeqs":          func(c *Config) { c.MaxNumSeqs = 0 },
		"MaxNumBatchedTokens": func(c *Config) { c.MaxNumBatchedTokens = c.MaxNumSeqs - 1 },
		"MaxQueue":            func(c *Config) { c.MaxQueue = 0 },
		"MaxBatchSize":        func(c *Config) { c.Policy, c.MaxBatchSize = PolicyStatic, 0 },
		"policy":              func(c *Config) { c.Policy = 9 },
		"MaxModelLen":         func(c *Config) { c.MaxModelLen = -1 },
		"KVCacheBytes":        func(c *Config) { c.KVCacheBytes = 0 },
	} {
		c := DefaultConfig()
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: Validate = %v", name, err)
		}
	}
	// Without chunked prefill the step budget must hold the model's whole context, which
	// only New knows.
	c = testConfig()
	c.EnableChunkedPrefill = false
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := newEngine(c, newFakeModel(1024), nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("no chunked prefill, a 256-token budget, a 1024-token context: %v", err)
	}
	c.MaxModelLen = c.MaxNumBatchedTokens
	if _, err := newEngine(c, newFakeModel(1024), nil); err != nil {
		t.Fatal(err)
	}
}

// TestUpdateErrorIsLoggedAndCounted: a scheduler Update error in a step is not dropped.
func TestUpdateErrorIsLoggedAndCounted(t *testing.T) {
	var logs bytes.Buffer
	cfg := testConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	e, err := newEngine(cfg, newFakeModel(1024), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close() }()
	ch, err := e.Submit(context.Background(), greedyRequest("a", testPrompt(1, 20), 4))
	if err != nil {
		t.Fatal(err)
	}
	// Play the engine loop by hand, with a plan the scheduler has already applied: the
	// step's own Update then fails.
	e.takeInbox()
	plan := e.sched.Schedule()
	if len(plan.Items) != 1 {
		t.Fatalf("plan %+v", plan)
	}
	if _, err := e.sched.Update(plan, make([]scheduler.Result, 1)); err != nil {
		t.Fatal(err)
	}
	e.step(plan, time.Now())
	if e.counts.schedulerErrors != 1 {
		t.Fatalf("%d scheduler errors counted, want 1", e.counts.schedulerErrors)
	}
	if !strings.Contains(logs.String(), "scheduler update failed") || !strings.Contains(logs.String(), "already applied") {
		t.Fatalf("log %q", logs.String())
	}
	if ev := <-ch; len(ev.TokenIDs) != 1 {
		t.Fatalf("the step's event %+v", ev)
	}
}

// TestBlockSizeFollowsTheModel: BlockSizeTokens 0 takes the model's default block size
// (16, or the smallest its attention takes when larger: 256 for a GPU step graph with
// heads of 64); a size the attention cannot take is refused with one line naming
// --block-size, and one it can is kept.
func TestBlockSizeFollowsTheModel(t *testing.T) {
	for _, tc := range []struct {
		min, asked, want int
		refused          bool
	}{
		{0, 0, 16, false}, {0, 4, 4, false}, {0, 24, 24, false}, // paged and dense: any size
		{16, 0, 16, false}, {16, 32, 32, false}, {16, 8, 0, true}, {16, 24, 0, true}, // the CPU step graph
		{256, 0, 256, false}, {256, 512, 512, false}, {256, 16, 0, true}, {256, 384, 0, true}, // CUDA, heads of 64
	} {
		m := newFakeModel(1024)
		m.spec.MinBlockSize = tc.min
		cfg := testConfig()
		cfg.BlockSizeTokens = tc.asked
		cfg.KVCacheBytes = blockBytesFake(512) * 64
		e, err := newEngine(cfg, m, fakeText{})
		if tc.refused {
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), fmt.Sprintf("--block-size %d:", tc.asked)) || strings.Contains(err.Error(), "\n") {
				t.Errorf("min %d, asked %d: %v; want one line refusing --block-size", tc.min, tc.asked, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("min %d, asked %d: %v", tc.min, tc.asked, err)
		}
		if got := e.Stats().BlockSizeTokens; got != tc.want {
			t.Errorf("min %d, asked %d: blocks of %d tokens, want %d", tc.min, tc.asked, got, tc.want)
		}
		e.Close()
	}
}

// TestMaxModelLenAboveTheModelIsRefused: a MaxModelLen above the model's context is
// refused with one line naming --max-model-len (vLLM refuses it too), never served at
// the model's own context in silence; the model's own and less are taken.
func TestMaxModelLenAboveTheModelIsRefused(t *testing.T) {
	for _, tc := range []struct{ asked, want int }{{0, 1024}, {512, 512}, {1024, 1024}, {4096, -1}} {
		cfg := testConfig()
		cfg.MaxModelLen = tc.asked
		e, err := newEngine(cfg, newFakeModel(1024), fakeText{})
		if tc.want < 0 {
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "--max-model-len 4096 is more than the model's context of 1024") {
				t.Errorf("MaxModelLen %d: %v", tc.asked, err)
			}
			continue
		}
		if err != nil || e.MaxModelLen() != tc.want {
			t.Fatalf("MaxModelLen %d: %v; want a context of %d", tc.asked, err, tc.want)
		}
		e.Close()
	}
}
