package scheduler

import (
	"slices"
	"testing"
	"time"
)

// scenario is one step-by-step table: requests arrive before given steps, the clock moves
// before given steps, and each step's plan (and who finished) must read as want says.
type scenario struct {
	name     string
	cfg      func(*Config)
	blocks   int // KV pool blocks
	bs       int // tokens per block
	prefix   bool
	arrivals map[int][]req
	advance  map[int]time.Duration
	want     []string
}

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.MaxNumSeqs = 4
	cfg.MaxNumBatchedTokens = 16
	cfg.MaxModelLen = 64
	cfg.EnablePrefixCaching = false
	return cfg
}

var scenarios = []scenario{
	{
		name:   "continuous: running first, newcomers join at the next step",
		cfg:    func(c *Config) { c.MaxNumBatchedTokens = 8 },
		blocks: 64, bs: 4,
		arrivals: map[int][]req{
			0: {{name: "a", prompt: seqTokens(1, 3), maxNew: 3}},
			1: {{name: "b", prompt: seqTokens(10, 5), maxNew: 2}},
		},
		want: []string{
			"a:0+3*",
			"a:3+1* b:0+5*",
			"a:4+1* b:5+1*; done a; done b",
		},
	},
	{
		name:   "continuous: token budget and chunked prefill",
		cfg:    func(c *Config) { c.MaxNumBatchedTokens = 4 },
		blocks: 64, bs: 4,
		arrivals: map[int][]req{
			0: {{name: "a", prompt: seqTokens(1, 10), maxNew: 2}},
			1: {{name: "b", prompt: seqTokens(20, 3), maxNew: 2}},
		},
		want: []string{
			"a:0+4",
			"a:4+4", // the running prefill takes the whole budget; b waits
			"a:8+2* b:0+2",
			"a:10+1* b:2+1*; done a",
			"b:3+1*; done b",
		},
	},
	{
		name: "continuous: without chunked prefill a prompt waits until it fits whole",
		cfg: func(c *Config) {
			c.EnableChunkedPrefill = false
			c.MaxNumBatchedTokens = 8
			c.MaxModelLen = 8
		},
		blocks: 64, bs: 4,
		arrivals: map[int][]req{
			0: {{name: "a", prompt: seqTokens(1, 6), maxNew: 2}, {name: "b", prompt: seqTokens(10, 6), maxNew: 2}},
		},
		want: []string{
			"a:0+6*",
			"a:6+1* b:0+6*; done a",
			"b:6+1*; done b",
		},
	},
	{
		name:   "continuous: max-num-seqs caps the batch",
		cfg:    func(c *Config) { c.MaxNumSeqs = 2 },
		blocks: 64, bs: 4,
		arrivals: map[int][]req{
			0: {
				{name: "a", prompt: seqTokens(1, 2), maxNew: 2},
				{name: "b", prompt: seqTokens(5, 2), maxNew: 2},
				{name: "c", prompt: seqTokens(9, 2), maxNew: 2},
			},
		},
		want: []string{
			"a:0+2* b:0+2*",
			"a:2+1* b:2+1*; done a; done b",
			"c:0+2*",
			"c:2+1*; done c",
		},
	},
	{
		name: "static: waits for the delay, runs to the last member, slots stay idle",
		cfg: func(c *Config) {
			c.Policy = Static
			c.MaxBatchSize = 3
			c.MaxBatchDelay = 10 * time.Millisecond
		},
		blocks: 64, bs: 4,
		arrivals: map[int][]req{
			0: {{name: "a", prompt: seqTokens(1, 2), maxNew: 2}, {name: "b", prompt: seqTokens(5, 2), maxNew: 4}},
			2: {{name: "c", prompt: seqTokens(9, 2), maxNew: 1}},
		},
		advance: map[int]time.Duration{1: 10 * time.Millisecond, 6: 9 * time.Millisecond, 7: time.Millisecond},
		want: []string{
			"-", // two of three wait, the oldest has waited 0 ms
			"a:0+2* b:0+2*",
			"a:2+1* b:2+1*; done a", // c arrived but the batch is running
			"b:3+1*",                // a's slot stays idle
			"b:4+1*; done b",
			"-", // c has waited 0 ms
			"-", // 9 ms
			"c:0+2*; done c",
		},
	},
	{
		name: "static: a full batch forms at once, the rest wait for the next",
		cfg: func(c *Config) {
			c.Policy = Static
			c.MaxBatchSize = 2
			c.MaxBatchDelay = time.Hour
		},
		blocks: 64, bs: 4,
		arrivals: map[int][]req{
			0: {
				{name: "a", prompt: seqTokens(1, 2), maxNew: 1},
				{name: "b", prompt: seqTokens(5, 2), maxNew: 2},
				{name: "c", prompt: seqTokens(9, 2), maxNew: 1},
			},
		},
		advance: map[int]time.Duration{3: time.Hour},
		want: []string{
			"a:0+2* b:0+2*; done a",
			"b:2+1*; done b",
			"-",
			"c:0+2*; done c",
		},
	},
	{
		name:   "sequential: one request at a time",
		cfg:    func(c *Config) { c.Policy = Sequential },
		blocks: 64, bs: 4,
		arrivals: map[int][]req{
			0: {{name: "a", prompt: seqTokens(1, 2), maxNew: 2}, {name: "b", prompt: seqTokens(5, 3), maxNew: 1}},
			1: {{name: "c", prompt: seqTokens(9, 1), maxNew: 1}},
		},
		want: []string{
			"a:0+2*",
			"a:2+1*; done a",
			"b:0+3*; done b",
			"c:0+1*; done c",
		},
	},
	{
		name:   "preemption: the newest running sequence gives way and is recomputed",
		blocks: 4, bs: 2,
		arrivals: map[int][]req{
			0: {{name: "a", prompt: seqTokens(1, 3), maxNew: 4}, {name: "b", prompt: seqTokens(5, 3), maxNew: 4}},
		},
		want: []string{
			"a:0+3* b:0+3*", // all four blocks used
			"a:3+1* b:3+1*",
			"a:4+1*; pre b",  // a needs a block: b is preempted, nobody is admitted
			"a:5+1*; done a", // b needs 3 blocks, 1 is free
			"b:0+5*",         // prompt and both generated tokens recomputed
			"b:5+1*; done b",
		},
	},
	{
		name:   "no capacity: a sequence that outgrows the whole pool fails instead of looping",
		blocks: 2, bs: 2,
		arrivals: map[int][]req{
			0: {{name: "a", prompt: seqTokens(1, 3), maxNew: 10}},
		},
		want: []string{
			"a:0+3*",
			"a:3+1*",
			"; fail a",
		},
	},
	{
		name:   "prefix caching: only the tokens after the cached blocks are computed",
		blocks: 16, bs: 4, prefix: true,
		arrivals: map[int][]req{
			0: {{name: "a", prompt: seqTokens(1, 10), maxNew: 1}},
			1: {{name: "b", prompt: append(seqTokens(1, 8), 100, 101, 102), maxNew: 1}},
			2: {{name: "c", prompt: seqTokens(1, 10), maxNew: 1}},
			3: {{name: "d", prompt: seqTokens(1, 8), maxNew: 1}},
		},
		want: []string{
			"a:0+10*; done a",
			"b:8+3*; done b",
			"c:8+2*; done c", // two full blocks cached; the partial third is computed
			"d:4+4*; done d", // never the whole prompt: its last block is recomputed
		},
	},
	{
		name:   "n > 1: children fork after the prompt but its last token",
		blocks: 32, bs: 4,
		arrivals: map[int][]req{
			0: {{name: "a", prompt: seqTokens(1, 6), maxNew: 2, n: 3}},
		},
		want: []string{
			"a:0+5",
			"a:5+1* a1:5+1* a2:5+1*",
			"a:6+1* a1:6+1* a2:6+1*; done a; done a1; done a2",
		},
	},
	{
		name:   "n > 1: a cached prompt forks at admission",
		blocks: 32, bs: 4, prefix: true,
		arrivals: map[int][]req{
			0: {{name: "x", prompt: seqTokens(1, 9), maxNew: 1}},
			1: {{name: "g", prompt: seqTokens(1, 9), maxNew: 1, n: 2}},
		},
		want: []string{
			"x:0+9*; done x",
			"g:8+1* g1:8+1*; done g; done g1",
		},
	},
}

func TestScenarios(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.EnablePrefixCaching = sc.prefix
			if sc.cfg != nil {
				sc.cfg(&cfg)
			}
			h := newHarness(t, cfg, sc.blocks, sc.bs, sc.prefix)
			var reqs []req
			for i, want := range sc.want {
				h.clock.Advance(sc.advance[i])
				for _, r := range sc.arrivals[i] {
					h.mustAdd(r)
					reqs = append(reqs, r)
				}
				if got := h.step(); got != want {
					t.Fatalf("step %d: got %q, want %q", i, got, want)
				}
			}
			if h.s.HasWork() {
				t.Fatalf("work left after the table: %+v", h.s.Stats())
			}
			// Whatever the batching, every finished sequence saw what it would alone.
			for _, r := range reqs {
				for i := range max(r.n, 1) {
					n := r.name
					if i > 0 {
						n += string(rune('0' + i))
					}
					if h.failed[n] != nil {
						continue
					}
					want := reference(r.saltFirst+uint64(i), r.prompt, r.maxNew)
					if got := h.output(n); !slices.Equal(got, want) {
						t.Errorf("%s generated %v, alone it generates %v", n, got, want)
					}
				}
			}
		})
	}
}
