package webui_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/api/webui"
	"github.com/conveyor-llm/conveyor/engine"
)

func TestStatsFromSplitsTheBlocks(t *testing.T) {
	// 100 blocks: 30 held by sequences, 70 allocatable of which 20 still hold a cached prefix.
	s := webui.StatsFrom(engine.Stats{
		Running: 3, Waiting: 2, KVTotalBlocks: 100, KVFreeBlocks: 70, KVCachedBlocks: 20, KVUsage: 0.3,
		PrefixQueryTokens: 400, PrefixHitTokens: 100, Steps: 9,
	})
	if s.KVUsedBlocks != 30 || s.KVCachedBlocks != 20 || s.KVFreeBlocks != 50 {
		t.Fatalf("used/cached/free = %d/%d/%d, want 30/20/50", s.KVUsedBlocks, s.KVCachedBlocks, s.KVFreeBlocks)
	}
	if s.KVUsedBlocks+s.KVCachedBlocks+s.KVFreeBlocks != s.KVTotalBlocks {
		t.Fatalf("blocks do not add up: %+v", s)
	}
	if s.PrefixHitRate != 0.25 || s.Running != 3 || s.Waiting != 2 || s.Steps != 9 {
		t.Fatalf("unexpected stats %+v", s)
	}
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	// The page reads these names; an empty history is [] not null.
	for _, key := range []string{`"running":3`, `"waiting":2`, `"kv_used_blocks":30`, `"kv_cached_blocks":20`,
		`"kv_free_blocks":50`, `"prefix_cache_hit_rate":0.25`, `"recent_batch_sizes":[]`, `"steps":9`} {
		if !strings.Contains(string(raw), key) {
			t.Errorf("stats JSON %s lacks %s", raw, key)
		}
	}
}

func TestStatsFromEmptyEngine(t *testing.T) {
	s := webui.StatsFrom(engine.Stats{})
	if s.PrefixHitRate != 0 || s.KVUsedBlocks != 0 || s.KVFreeBlocks != 0 || s.RecentBatchSizes == nil {
		t.Fatalf("unexpected stats for an empty engine: %+v", s)
	}
}

func TestHandlerServesThePage(t *testing.T) {
	srv := httptest.NewServer(webui.Handler())
	defer srv.Close()
	for path, want := range map[string]struct{ typ, body string }{
		"/":          {"text/html", `<script src="app.js"></script>`},
		"/app.js":    {"javascript", "textContent"},
		"/style.css": {"text/css", "[hidden]"},
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q does not restrict scripts", path, csp)
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), want.typ) ||
			!strings.Contains(string(body), want.body) {
			t.Errorf("GET %s: %s %q, body lacks %q", path, resp.Status, resp.Header.Get("Content-Type"), want.body)
		}
	}
	// Nothing is fetched from elsewhere.
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(body), "http://") || strings.Contains(string(body), "https://") {
		t.Errorf("the page refers to another site: %s", body)
	}
}

func TestStatsFromSpeculation(t *testing.T) {
	// 10 drafts of 4 proposals, 25 accepted: 62.5 % accepted, 3.5 tokens per verifying step.
	s := webui.StatsFrom(engine.Stats{SpecDrafts: 10, SpecDraftTokens: 40, SpecAcceptedTokens: 25})
	if s.SpecAcceptanceRate != 0.625 || s.SpecMeanAcceptedLength != 3.5 || s.SpecDraftTokens != 40 {
		t.Fatalf("speculation %+v, want rate 0.625 and mean length 3.5", s)
	}
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"spec_drafts":10`, `"spec_draft_tokens":40`, `"spec_accepted_tokens":25`,
		`"spec_acceptance_rate":0.625`, `"spec_mean_accepted_length":3.5`} {
		if !strings.Contains(string(raw), key) {
			t.Errorf("stats JSON %s lacks %s", raw, key)
		}
	}
	if off := webui.StatsFrom(engine.Stats{}); off.SpecAcceptanceRate != 0 || off.SpecMeanAcceptedLength != 0 {
		t.Fatalf("no drafts: %+v, want zeros", off)
	}
}
