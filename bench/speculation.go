package bench

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
)

// SpecStats is what the server's speculative decoding did during a run, from its
// Prometheus counters (conveyor_spec_decode_*) read before and after the run.
type SpecStats struct {
	Drafts         int64 `json:"drafts"`          // drafts verified (one sequence's proposals in one step)
	DraftTokens    int64 `json:"draft_tokens"`    // tokens they proposed
	AcceptedTokens int64 `json:"accepted_tokens"` // proposals accepted
	// AcceptanceRate is AcceptedTokens / DraftTokens.
	AcceptanceRate float64 `json:"acceptance_rate"`
	// MeanAcceptedLength is the tokens a verifying step gives a sequence on average:
	// 1 + AcceptedTokens / Drafts (vLLM's mean acceptance length).
	MeanAcceptedLength float64 `json:"mean_accepted_length"`
}

// specCounters are the counters SpecStats is read from.
var specCounters = []string{"conveyor_spec_decode_num_drafts_total", "conveyor_spec_decode_num_draft_tokens_total",
	"conveyor_spec_decode_num_accepted_tokens_total"}

// scrapeSpec reads the server's speculative decoding counters from its /metrics; ok is
// false when it exposes none (another server, or metrics off).
func scrapeSpec(ctx context.Context, t Target) (c [3]int64, ok bool) {
	base := strings.TrimSuffix(strings.TrimRight(t.BaseURL, "/"), "/v1")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return c, false
	}
	client := t.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return c, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c, false
	}
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, cut := strings.Cut(sc.Text(), " ")
		if !cut {
			continue
		}
		for i, want := range specCounters {
			if name == want {
				v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
				if err == nil {
					c[i] = int64(v)
					found++
				}
			}
		}
	}
	return c, found == len(specCounters)
}

// specStats returns the counters' growth between before and after, nil when nothing
// was proposed.
func specStats(before, after [3]int64) *SpecStats {
	s := &SpecStats{Drafts: after[0] - before[0], DraftTokens: after[1] - before[1], AcceptedTokens: after[2] - before[2]}
	if s.Drafts <= 0 || s.DraftTokens <= 0 {
		return nil
	}
	s.AcceptanceRate = float64(s.AcceptedTokens) / float64(s.DraftTokens)
	s.MeanAcceptedLength = 1 + float64(s.AcceptedTokens)/float64(s.Drafts)
	return s
}
