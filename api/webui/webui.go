package webui

import (
	"embed"
	"io/fs"
	"net/http"

	"github.com/conveyor-llm/conveyor/engine"
)

//go:embed static
var static embed.FS

// ContentSecurityPolicy is sent with the page and its assets: scripts, styles and
// requests only from the server itself, no framing. It backs up the page's rule of
// inserting text with textContent.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
	"img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the page and its assets (/, /app.js, /style.css).
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServer(http.FS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		files.ServeHTTP(w, r)
	})
}

// Stats is the JSON body of GET /v1/engine/stats. The KV pool's blocks are split three
// ways, KVUsedBlocks + KVCachedBlocks + KVFreeBlocks == KVTotalBlocks: held by a sequence,
// free but still holding a cached prompt prefix (reusable until evicted), and empty.
type Stats struct {
	Running           int     `json:"running"`
	Waiting           int     `json:"waiting"`
	KVTotalBlocks     int     `json:"kv_total_blocks"`
	KVUsedBlocks      int     `json:"kv_used_blocks"`
	KVCachedBlocks    int     `json:"kv_cached_blocks"`
	KVFreeBlocks      int     `json:"kv_free_blocks"` // empty blocks, not counting the cached ones
	KVUsage           float64 `json:"kv_usage"`
	BlockSizeTokens   int     `json:"block_size"`
	PrefixQueryTokens int64   `json:"prefix_cache_queries_tokens"`
	PrefixHitTokens   int64   `json:"prefix_cache_hits_tokens"`
	PrefixHitRate     float64 `json:"prefix_cache_hit_rate"`
	Preemptions       int64   `json:"preemptions"`
	Steps             int64   `json:"steps"`
	RecentBatchSizes  []int   `json:"recent_batch_sizes"`
	// Speculative decoding (serve --speculative-config): drafts verified, the tokens they
	// proposed and those accepted; the acceptance rate (accepted ÷ proposed) and the mean
	// accepted length (the tokens a verifying step gives its sequence: 1 + accepted ÷
	// drafts, as vLLM counts it), both 0 before the first draft.
	SpecDrafts             int64   `json:"spec_drafts"`
	SpecDraftTokens        int64   `json:"spec_draft_tokens"`
	SpecAcceptedTokens     int64   `json:"spec_accepted_tokens"`
	SpecAcceptanceRate     float64 `json:"spec_acceptance_rate"`
	SpecMeanAcceptedLength float64 `json:"spec_mean_accepted_length"`
}

// StatsFrom converts an engine snapshot to the endpoint's JSON shape. The engine's
// KVFreeBlocks counts every allocatable block, the cached ones included; the endpoint
// reports the cached ones apart (see Stats).
func StatsFrom(s engine.Stats) Stats {
	out := Stats{
		Running: s.Running, Waiting: s.Waiting,
		KVTotalBlocks: s.KVTotalBlocks, KVCachedBlocks: s.KVCachedBlocks,
		KVUsedBlocks: max(s.KVTotalBlocks-s.KVFreeBlocks, 0), KVFreeBlocks: max(s.KVFreeBlocks-s.KVCachedBlocks, 0),
		KVUsage: s.KVUsage, BlockSizeTokens: s.BlockSizeTokens,
		PrefixQueryTokens: s.PrefixQueryTokens, PrefixHitTokens: s.PrefixHitTokens,
		Preemptions: s.Preemptions, Steps: s.Steps, RecentBatchSizes: s.RecentBatchSizes,
		SpecDrafts: s.SpecDrafts, SpecDraftTokens: s.SpecDraftTokens, SpecAcceptedTokens: s.SpecAcceptedTokens,
	}
	if s.SpecDraftTokens > 0 {
		out.SpecAcceptanceRate = float64(s.SpecAcceptedTokens) / float64(s.SpecDraftTokens)
	}
	if s.SpecDrafts > 0 {
		out.SpecMeanAcceptedLength = 1 + float64(s.SpecAcceptedTokens)/float64(s.SpecDrafts)
	}
	if s.PrefixQueryTokens > 0 {
		out.PrefixHitRate = float64(s.PrefixHitTokens) / float64(s.PrefixQueryTokens)
	}
	if out.RecentBatchSizes == nil {
		out.RecentBatchSizes = []int{}
	}
	return out
}
