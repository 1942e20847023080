package api

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
)

// statsSource is where scrape-time gauges and counters come from (the engine).
type statsSource interface {
	Stats() engine.Stats
}

// Metrics holds the server's Prometheus metrics on a private registry. Request-level
// histograms are recorded by the handlers, step histograms by OnStep (wired to the
// engine's Config.OnStep), and everything the engine counts itself is read from
// engine.Stats at scrape time by a custom collector.
type Metrics struct {
	reg *prometheus.Registry

	ttft, itl, e2e, queue prometheus.Histogram
	batchSize, stepDur    prometheus.Histogram
	success               *prometheus.CounterVec
	toolRejects           *prometheus.CounterVec

	source atomic.Pointer[statsSource]
}

// Buckets in seconds, following vLLM's choices for comparable dashboards.
var (
	ttftBuckets    = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	itlBuckets     = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5}
	e2eBuckets     = []float64{0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120}
	batchBuckets   = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}
	stepDurBuckets = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5}
)

// NewMetrics creates the metrics and their registry.
func NewMetrics() *Metrics {
	h := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	}
	m := &Metrics{
		reg:       prometheus.NewRegistry(),
		ttft:      h("conveyor_time_to_first_token_seconds", "Time from arrival to the first generated token, per sequence.", ttftBuckets),
		itl:       h("conveyor_inter_token_latency_seconds", "Time between consecutive generated tokens of a sequence, as seen by the server.", itlBuckets),
		e2e:       h("conveyor_e2e_request_latency_seconds", "Time from arrival to the end of a sequence.", e2eBuckets),
		queue:     h("conveyor_request_queue_time_seconds", "Time a sequence waited before it was first scheduled.", e2eBuckets),
		batchSize: h("conveyor_batch_size", "Sequences in one forward pass.", batchBuckets),
		stepDur:   h("conveyor_step_duration_seconds", "Duration of one engine step (schedule, forward pass, sampling).", stepDurBuckets),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "conveyor_request_success_total", Help: "Sequences finished, by finish reason (stop, length, abort, error).",
		}, []string{"finished_reason"}),
		toolRejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "conveyor_tool_calls_rejected_total",
			Help: "Chat replies whose tool calls were returned as content because a call named a tool not offered (unknown_tool) or its arguments failed the tool's parameters schema (invalid_arguments).",
		}, []string{"reason"}),
	}
	for _, r := range []string{openai.RejectUnknownTool, openai.RejectInvalidArguments} {
		m.toolRejects.WithLabelValues(r) // exposed at 0 from the start
	}
	m.reg.MustRegister(m.ttft, m.itl, m.e2e, m.queue, m.batchSize, m.stepDur, m.success, m.toolRejects, &statsCollector{m: m})
	// The standard go_* and process_* families every Go exporter serves (heap, GC,
	// goroutines, CPU seconds, resident memory, open file descriptors).
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// rejectToolCalls counts one reply whose tool calls failed their check.
func (m *Metrics) rejectToolCalls(reason string) { m.toolRejects.WithLabelValues(reason).Inc() }

// OnStep records one engine step; pass it as the engine's Config.OnStep.
func (m *Metrics) OnStep(s engine.StepInfo) {
	m.batchSize.Observe(float64(s.NumSeqs))
	m.stepDur.Observe(s.Duration.Seconds())
}

func (m *Metrics) setStatsSource(src statsSource) {
	if src == nil {
		return
	}
	m.source.Store(&src)
}

// observeEvent records the request-level histograms for one engine event of job j.
func (m *Metrics) observeEvent(j *job, ev *engine.Event, now time.Time) {
	if ev.Index < 0 || ev.Index >= len(j.lastTok) {
		return
	}
	if k := len(ev.TokenIDs); k > 0 {
		if prev := j.lastTok[ev.Index]; !prev.IsZero() {
			per := now.Sub(prev).Seconds() / float64(k)
			for i := 0; i < k; i++ {
				m.itl.Observe(per)
			}
		}
		j.lastTok[ev.Index] = now
	}
	if ev.FinishReason == "" {
		return
	}
	m.success.WithLabelValues(string(ev.FinishReason)).Inc()
	t := ev.Timings
	if t.Arrival.IsZero() {
		return
	}
	end := t.Finished
	if end.IsZero() {
		end = now
	}
	m.e2e.Observe(end.Sub(t.Arrival).Seconds())
	if !t.Scheduled.IsZero() {
		m.queue.Observe(t.Scheduled.Sub(t.Arrival).Seconds())
	}
	if !t.FirstToken.IsZero() {
		m.ttft.Observe(t.FirstToken.Sub(t.Arrival).Seconds())
	}
}

// statsCollector reads engine.Stats at scrape time. The engine's counters only grow, so
// they are exposed as Prometheus counters directly.
type statsCollector struct{ m *Metrics }

var (
	descRunning    = prometheus.NewDesc("conveyor_num_requests_running", "Sequences in the running batch.", nil, nil)
	descWaiting    = prometheus.NewDesc("conveyor_num_requests_waiting", "Sequences waiting to be scheduled.", nil, nil)
	descKVUsage    = prometheus.NewDesc("conveyor_kv_cache_usage_perc", "Fraction of KV-cache blocks in use, 0..1 (1 means 100%).", nil, nil)
	descPreempt    = prometheus.NewDesc("conveyor_num_preemptions_total", "Sequences preempted (blocks freed, recomputed later).", nil, nil)
	descSchedErr   = prometheus.NewDesc("conveyor_scheduler_errors_total", "Scheduler bookkeeping errors (logged); 0 unless there is a bug.", nil, nil)
	descFailed     = prometheus.NewDesc("conveyor_engine_failed_steps_total", "Forward passes that failed (each failed the requests in it).", nil, nil)
	descRestarts   = prometheus.NewDesc("conveyor_engine_runner_restarts_total", "Runners reopened after several failed forward passes in a row.", nil, nil)
	descPanics     = prometheus.NewDesc("conveyor_engine_recovered_panics_total", "Requests ended with an internal error by a recovered panic; 0 unless there is a bug.", nil, nil)
	descPromptTok  = prometheus.NewDesc("conveyor_prompt_tokens_total", "Prompt tokens computed (not served from the prefix cache).", nil, nil)
	descGenTok     = prometheus.NewDesc("conveyor_generation_tokens_total", "Tokens generated.", nil, nil)
	descPrefixQ    = prometheus.NewDesc("conveyor_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", nil, nil)
	descPrefixH    = prometheus.NewDesc("conveyor_prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", nil, nil)
	descCacheInfo  = prometheus.NewDesc("conveyor_cache_config_info", "KV-cache configuration (value always 1).", []string{"block_size", "num_blocks"}, nil)
	descSpecDrafts = prometheus.NewDesc("conveyor_spec_decode_num_drafts_total", "Drafts (proposals of one sequence in one step) verified by speculative decoding.", nil, nil)
	descSpecDraft  = prometheus.NewDesc("conveyor_spec_decode_num_draft_tokens_total", "Tokens proposed by speculative decoding and verified.", nil, nil)
	descSpecAcc    = prometheus.NewDesc("conveyor_spec_decode_num_accepted_tokens_total", "Proposed tokens accepted.", nil, nil)
	descSpecPos    = prometheus.NewDesc("conveyor_spec_decode_num_accepted_tokens_per_pos_total", "Proposed tokens accepted, by their position in the draft (0: the first).", []string{"position"}, nil)
)

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRunning, descWaiting, descKVUsage, descPreempt, descSchedErr, descFailed, descRestarts, descPanics, descPromptTok, descGenTok, descPrefixQ, descPrefixH, descCacheInfo, descSpecDrafts, descSpecDraft, descSpecAcc, descSpecPos} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. Before a backend is set nothing is reported.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	src := c.m.source.Load()
	if src == nil {
		return
	}
	st := (*src).Stats()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(descRunning, float64(st.Running))
	gauge(descWaiting, float64(st.Waiting))
	gauge(descKVUsage, st.KVUsage)
	counter(descPreempt, st.Preemptions)
	counter(descSchedErr, st.SchedulerErrors)
	counter(descFailed, st.FailedSteps)
	counter(descRestarts, st.RunnerRestarts)
	counter(descPanics, st.RecoveredPanics)
	counter(descPromptTok, st.PromptTokens)
	counter(descGenTok, st.GenerationTokens)
	counter(descPrefixQ, st.PrefixQueryTokens)
	counter(descPrefixH, st.PrefixHitTokens)
	ch <- prometheus.MustNewConstMetric(descCacheInfo, prometheus.GaugeValue, 1,
		strconv.Itoa(st.BlockSizeTokens), strconv.Itoa(st.KVTotalBlocks))
	counter(descSpecDrafts, st.SpecDrafts)
	counter(descSpecDraft, st.SpecDraftTokens)
	counter(descSpecAcc, st.SpecAcceptedTokens)
	for pos, n := range st.SpecAcceptedAt {
		ch <- prometheus.MustNewConstMetric(descSpecPos, prometheus.CounterValue, float64(n), strconv.Itoa(pos))
	}
}
