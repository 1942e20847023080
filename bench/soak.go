package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SoakConfig configures Soak: a closed loop of Clients sending a seeded mix of request
// kinds to a running server for Duration, checking every reply.
type SoakConfig struct {
	Target   Target
	Duration time.Duration
	Clients  int
	Seed     uint64
	// Kinds is the mix (weighted as in SoakKinds); empty means every kind.
	Kinds []SoakKind
	// ReportEvery is the period of the progress line.
	ReportEvery time.Duration
	// MaxTokens caps max_tokens of generation requests (drawn in 1..MaxTokens; the
	// json_schema, tool_call and drop kinds use MaxTokens itself).
	MaxTokens int
	// MaxModelLen is the context length in tokens the over-context kind exceeds; 0 reads
	// max_model_len from /v1/models.
	MaxModelLen int
	// RequestTimeout bounds one request (a stuck reply is an unexpected outcome).
	RequestTimeout time.Duration
	// IdlePause is how long the server must be idle (nothing running or waiting) before
	// the final KV-cache reading; IdleWait bounds the wait for that.
	IdlePause, IdleWait time.Duration
	// RSS reads the server's resident memory in bytes; nil reads the
	// process_resident_memory_bytes metric from /metrics.
	RSS func() (int64, error)
	// Log receives the progress lines; nil discards them.
	Log io.Writer
}

// DefaultSoakConfig returns the defaults of `conveyor bench soak`.
func DefaultSoakConfig() SoakConfig {
	return SoakConfig{Duration: time.Hour, Clients: 8, Seed: 1, ReportEvery: 10 * time.Minute, MaxTokens: 128,
		RequestTimeout: 10 * time.Minute, IdlePause: 5 * time.Second, IdleWait: 5 * time.Minute}
}

// Validate reports the first invalid field.
func (c SoakConfig) Validate() error {
	switch {
	case c.Duration <= 0:
		return fmt.Errorf("soak: duration must be > 0, got %v", c.Duration)
	case c.Clients <= 0:
		return fmt.Errorf("soak: clients must be > 0, got %d", c.Clients)
	case c.ReportEvery <= 0:
		return fmt.Errorf("soak: report period must be > 0, got %v", c.ReportEvery)
	case c.MaxTokens <= 0:
		return fmt.Errorf("soak: max tokens must be > 0, got %d", c.MaxTokens)
	case c.MaxModelLen < 0:
		return fmt.Errorf("soak: max model length must be >= 0, got %d", c.MaxModelLen)
	case c.RequestTimeout <= 0 || c.IdlePause < 0 || c.IdleWait <= 0:
		return errors.New("soak: request timeout and idle wait must be > 0, idle pause >= 0")
	}
	for _, k := range c.Kinds {
		if soakWeight(k) == 0 {
			return fmt.Errorf("soak: unknown kind %q", k)
		}
	}
	return nil
}

// SoakWindow is one report period.
type SoakWindow struct {
	End        time.Duration  `json:"end_ns"`   // since the start
	Requests   map[string]int `json:"requests"` // by kind, in this window
	Unexpected int            `json:"unexpected"`
	RSSBytes   int64          `json:"rss_bytes"` // -1 when unreadable
	KVUsed     int            `json:"kv_blocks_used"`
	KVTotal    int            `json:"kv_blocks_total"` // 0 when unreadable
	P50MS      float64        `json:"p50_ms"`
	P99MS      float64        `json:"p99_ms"`
}

// SoakReport is the soak's result.
type SoakReport struct {
	Duration time.Duration `json:"duration_ns"` // shorter than asked when interrupted
	Clients  int           `json:"clients"`
	Seed     uint64        `json:"seed"`
	// Outcomes counts replies by kind, then by outcome (ok, truncated, dropped, rejected,
	// or the class of an unexpected one).
	Outcomes   map[string]map[string]int `json:"outcomes"`
	Requests   int                       `json:"requests"`
	Unexpected int                       `json:"unexpected"`
	// Problems are the first unexpected outcomes, described.
	Problems []string     `json:"problems"`
	Windows  []SoakWindow `json:"windows"`
	// RSS is the server's resident memory in bytes: at the start, the largest reading,
	// the last; -1 when unreadable.
	RSS struct {
		First int64 `json:"first"`
		Max   int64 `json:"max"`
		Last  int64 `json:"last"`
	} `json:"rss_bytes"`
	// IdleKVUsed is the KV blocks in use once the server sat idle after the load; it
	// must be 0. IdleErr says why it could not be read.
	IdleKVUsed int    `json:"idle_kv_blocks_used"`
	IdleErr    string `json:"idle_error,omitempty"`
}

// Failed reports whether the soak found anything wrong.
func (r *SoakReport) Failed() bool {
	return r.Unexpected > 0 || r.IdleErr != "" || r.IdleKVUsed != 0
}

const maxProblems = 50

// soakState is the counters the clients share.
type soakState struct {
	mu       sync.Mutex
	outcomes map[string]map[string]int
	window   map[string]int
	winUnexp int
	lat      []float64 // milliseconds, this window
	problems []string
	total    int
	unexp    int
}

func (s *soakState) record(r soakResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := string(r.kind)
	if s.outcomes[k] == nil {
		s.outcomes[k] = map[string]int{}
	}
	s.outcomes[k][r.outcome]++
	s.window[k]++
	s.total++
	if r.unexpected() {
		s.unexp++
		s.winUnexp++
		if len(s.problems) < maxProblems {
			s.problems = append(s.problems, fmt.Sprintf("%s: %s", k, r.problem))
		}
	}
	if r.timeable {
		s.lat = append(s.lat, float64(r.latency)/float64(time.Millisecond))
	}
}

// Soak runs the soak and returns its report; the caller exits non-zero when
// rep.Failed(). An error means the soak could not run (bad config, no server). When ctx
// ends early the load stops, requests in flight are dropped uncounted, and the report
// covers what ran (and fails: the idle KV check did not run).
func Soak(ctx context.Context, cfg SoakConfig) (*SoakReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	kinds := cfg.Kinds
	if len(kinds) == 0 {
		kinds, _ = ParseSoakKinds("")
	}
	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	hc := cfg.Target.Client
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Clients * 2}}
	}
	t := cfg.Target
	t.Client = hc
	if t.Model == "" || cfg.MaxModelLen == 0 {
		name, maxLen, err := serverModel(ctx, t)
		if err != nil {
			return nil, err
		}
		if t.Model == "" {
			t.Model = name
		}
		if cfg.MaxModelLen == 0 {
			if maxLen <= 0 {
				return nil, errors.New("soak: /v1/models reports no max_model_len; pass the context length")
			}
			cfg.MaxModelLen = maxLen
		}
	}
	client, err := newSoakClient(t, hc, cfg.MaxTokens, cfg.MaxModelLen)
	if err != nil {
		return nil, err
	}
	// Scrapes outlive an interrupt, so the report of an interrupted soak has its readings.
	scrapeCtx := context.WithoutCancel(ctx)
	rss := cfg.RSS
	if rss == nil {
		rss = func() (int64, error) {
			m, err := scrapeMetrics(scrapeCtx, t)
			if err != nil {
				return 0, err
			}
			v, ok := m["process_resident_memory_bytes"]
			if !ok {
				return 0, errors.New("no process_resident_memory_bytes in /metrics")
			}
			return int64(v), nil
		}
	}
	rep := &SoakReport{Duration: cfg.Duration, Clients: cfg.Clients, Seed: cfg.Seed}
	rep.RSS.First, rep.RSS.Max, rep.RSS.Last = -1, -1, -1
	readRSS := func() int64 {
		v, err := rss()
		if err != nil {
			return -1
		}
		if rep.RSS.First < 0 {
			rep.RSS.First = v
		}
		rep.RSS.Max = max(rep.RSS.Max, v)
		rep.RSS.Last = v
		return v
	}
	readRSS()
	fmt.Fprintf(logw, "soak: %s, %d clients, seed %d, model %s (context %d tokens), kinds %s\n",
		cfg.Duration, cfg.Clients, cfg.Seed, t.Model, cfg.MaxModelLen, joinKinds(kinds))

	st := &soakState{outcomes: map[string]map[string]int{}, window: map[string]int{}}
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1))
		wg.Go(func() {
			// Every client sends at least one request, however short the soak.
			for first := true; ctx.Err() == nil && (first || time.Now().Before(deadline)); first = false {
				k := pickKind(rng, kinds)
				rctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
				r := client.do(rctx, k, rng)
				timedOut := rctx.Err() == context.DeadlineExceeded
				cancel()
				if ctx.Err() != nil {
					return // interrupted: the reply is not the server's doing
				}
				if timedOut && !r.unexpected() {
					r = fail(k, "timeout", "no reply within %v", cfg.RequestTimeout)
				}
				r.kind = k
				st.record(r)
			}
		})
	}
	window := func() {
		st.mu.Lock()
		w := SoakWindow{End: time.Since(start).Round(time.Second), Requests: st.window, Unexpected: st.winUnexp}
		lat := st.lat
		st.window, st.winUnexp, st.lat = map[string]int{}, 0, nil
		st.mu.Unlock()
		if len(lat) > 0 {
			slices.Sort(lat)
			w.P50MS, w.P99MS = Percentile(lat, 50), Percentile(lat, 99)
		}
		w.RSSBytes = readRSS()
		if kv, err := readKV(scrapeCtx, t); err == nil {
			w.KVUsed, w.KVTotal = kv.used, kv.total
		}
		rep.Windows = append(rep.Windows, w)
		fmt.Fprintln(logw, w.line())
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(cfg.ReportEvery)
	sample := time.NewTicker(time.Second) // RSS between reports too: a storm's peak is short
	defer sample.Stop()
loop:
	for {
		select {
		case <-sample.C:
			readRSS()
		case <-tick.C:
			window()
		case <-done:
			break loop
		}
	}
	tick.Stop()
	window() // the last, partial period
	st.mu.Lock()
	rep.Outcomes, rep.Problems, rep.Requests, rep.Unexpected = st.outcomes, st.problems, st.total, st.unexp
	st.mu.Unlock()
	if ctx.Err() != nil {
		// Interrupted: report what ran; the idle check is skipped, so the soak fails.
		rep.Duration = time.Since(start).Round(time.Second)
		rep.IdleKVUsed, rep.IdleErr = -1, "interrupted before the end"
		readRSS()
		return rep, nil
	}

	used, err := idleKV(ctx, t, cfg.IdlePause, cfg.IdleWait)
	if err != nil {
		rep.IdleErr = err.Error()
	}
	rep.IdleKVUsed = used
	readRSS()
	return rep, nil
}

func pickKind(rng *rand.Rand, kinds []SoakKind) SoakKind {
	total := 0
	for _, k := range kinds {
		total += soakWeight(k)
	}
	x := rng.IntN(total)
	for _, k := range kinds {
		if x -= soakWeight(k); x < 0 {
			return k
		}
	}
	return kinds[len(kinds)-1]
}

func joinKinds(ks []SoakKind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ",")
}

// serverModel reads the first model's id and max_model_len from /v1/models.
func serverModel(ctx context.Context, t Target) (string, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(strings.TrimRight(t.BaseURL, "/"), "/v1")+"/v1/models", nil)
	if err != nil {
		return "", 0, err
	}
	if t.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+t.APIKey)
	}
	resp, err := t.Client.Do(req)
	if err != nil {
		return "", 0, fmt.Errorf("soak: /v1/models: %w", err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", 0, fmt.Errorf("soak: /v1/models: HTTP %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) == 0 {
		return "", 0, fmt.Errorf("soak: /v1/models lists no model (%v)", err)
	}
	return list.Data[0].ID, list.Data[0].MaxModelLen, nil
}

// scrapeMetrics reads /metrics into name -> value for the unlabelled series, and
// name{labels} -> value for the labelled ones.
func scrapeMetrics(ctx context.Context, t Target) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(strings.TrimRight(t.BaseURL, "/"), "/v1")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := t.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: HTTP %d", resp.StatusCode)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

type kvReading struct{ used, total, active int }

// readKV reads the KV blocks in use (conveyor_kv_cache_usage_perc times the pool's
// num_blocks from conveyor_cache_config_info) and the requests running or waiting.
func readKV(ctx context.Context, t Target) (kvReading, error) {
	m, err := scrapeMetrics(ctx, t)
	if err != nil {
		return kvReading{}, err
	}
	var r kvReading
	for name := range m {
		if rest, ok := strings.CutPrefix(name, "conveyor_cache_config_info{"); ok {
			for _, kv := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
				if k, v, ok := strings.Cut(kv, "="); ok && k == "num_blocks" {
					r.total, _ = strconv.Atoi(strings.Trim(v, `"`))
				}
			}
		}
	}
	usage, ok := m["conveyor_kv_cache_usage_perc"]
	if !ok || r.total == 0 {
		return r, errors.New("/metrics has no conveyor_kv_cache_usage_perc or conveyor_cache_config_info")
	}
	r.used = int(usage*float64(r.total) + 0.5)
	r.active = int(m["conveyor_num_requests_running"] + m["conveyor_num_requests_waiting"])
	return r, nil
}

// idleKV waits until nothing has run or waited for pause, then returns the KV blocks in use.
func idleKV(ctx context.Context, t Target, pause, wait time.Duration) (int, error) {
	giveUp := time.Now().Add(wait)
	var idleSince time.Time
	for {
		r, err := readKV(ctx, t)
		if err != nil {
			return -1, fmt.Errorf("reading the KV cache after the load: %w", err)
		}
		now := time.Now()
		switch {
		case r.active > 0:
			idleSince = time.Time{}
		case idleSince.IsZero():
			idleSince = now
		case now.Sub(idleSince) >= pause:
			return r.used, nil
		}
		if now.After(giveUp) {
			return r.used, fmt.Errorf("the server did not go idle within %v (%d requests running or waiting)", wait, r.active)
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(min(pause/4+10*time.Millisecond, time.Second)):
		}
	}
}

func fmtBytes(n int64) string {
	if n < 0 {
		return "?"
	}
	return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
}

// line is the progress line of one window.
func (w SoakWindow) line() string {
	names := make([]string, 0, len(w.Requests))
	total := 0
	for k, n := range w.Requests {
		names = append(names, fmt.Sprintf("%s=%d", k, n))
		total += n
	}
	slices.Sort(names)
	kv := "?"
	if w.KVTotal > 0 {
		kv = fmt.Sprintf("%d/%d", w.KVUsed, w.KVTotal)
	}
	return fmt.Sprintf("[%s] requests %d (%s) unexpected %d | rss %s | kv blocks %s | latency p50 %.0fms p99 %.0fms",
		w.End, total, strings.Join(names, " "), w.Unexpected, fmtBytes(w.RSSBytes), kv, w.P50MS, w.P99MS)
}

// Format writes the summary.
func (r *SoakReport) Format(w io.Writer) {
	verdict := "PASS"
	if r.Failed() {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "\nsoak %s: %s, %d clients, seed %d: %d requests, %d unexpected\n",
		verdict, r.Duration, r.Clients, r.Seed, r.Requests, r.Unexpected)
	kinds := make([]string, 0, len(r.Outcomes))
	for k := range r.Outcomes {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	fmt.Fprintf(w, "%-18s %8s  %s\n", "kind", "requests", "outcomes")
	for _, k := range kinds {
		n, parts := 0, []string{}
		for o, c := range r.Outcomes[k] {
			n += c
			parts = append(parts, fmt.Sprintf("%s %d", o, c))
		}
		slices.Sort(parts)
		fmt.Fprintf(w, "%-18s %8d  %s\n", k, n, strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "rss: first %s, max %s, last %s\n", fmtBytes(r.RSS.First), fmtBytes(r.RSS.Max), fmtBytes(r.RSS.Last))
	if r.IdleErr != "" {
		fmt.Fprintf(w, "kv blocks in use after idle: %d (%s)\n", r.IdleKVUsed, r.IdleErr)
	} else {
		fmt.Fprintf(w, "kv blocks in use after idle: %d (must be 0)\n", r.IdleKVUsed)
	}
	p99 := make([]string, len(r.Windows))
	for i, win := range r.Windows {
		p99[i] = fmt.Sprintf("%.0fms", win.P99MS)
	}
	fmt.Fprintf(w, "p99 latency per window: %s\n", strings.Join(p99, " "))
	for _, p := range r.Problems {
		fmt.Fprintf(w, "unexpected: %s\n", p)
	}
}
