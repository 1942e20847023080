package api

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/engine"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func scrape(t *testing.T, s *Server) map[string]*dto.MetricFamily {
	t.Helper()
	rec := do(t, s.Handler(), "GET", "/metrics", "")
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d", rec.Code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, rec.Body)
	}
	return fams
}

func TestMetricsExposition(t *testing.T) {
	eng := newFakeEngine()
	eng.stats = engine.Stats{Waiting: 3, KVUsage: 0.25, KVTotalBlocks: 100, BlockSizeTokens: 16, Preemptions: 2, SchedulerErrors: 1, FailedSteps: 4, RunnerRestarts: 1, RecoveredPanics: 5,
		PrefixQueryTokens: 50, PrefixHitTokens: 20, PromptTokens: 70, GenerationTokens: 9,
		SpecDrafts: 4, SpecDraftTokens: 12, SpecAcceptedTokens: 7, SpecAcceptedAt: []int64{4, 3}}
	s := newTestServer(t, eng, nil)
	s.metrics.OnStep(engine.StepInfo{NumSeqs: 4, NumTokens: 10, Duration: 3 * time.Millisecond})
	s.metrics.OnStep(engine.StepInfo{NumSeqs: 1, NumTokens: 1, Duration: time.Millisecond})
	if rec := do(t, s.Handler(), "POST", "/v1/completions", `{"model":"test-model","prompt":"x","max_tokens":3,"n":2}`); rec.Code != 200 {
		t.Fatal(rec.Code)
	}
	fams := scrape(t, s)
	value := func(name string, typ dto.MetricType) float64 {
		f, ok := fams[name]
		if !ok {
			t.Fatalf("metric %s missing", name)
		}
		if f.GetType() != typ {
			t.Fatalf("%s has type %v, want %v", name, f.GetType(), typ)
		}
		m := f.GetMetric()[0]
		switch typ {
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		default:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	checks := []struct {
		name string
		typ  dto.MetricType
		want float64
	}{
		{"conveyor_num_requests_running", dto.MetricType_GAUGE, 0},
		{"conveyor_num_requests_waiting", dto.MetricType_GAUGE, 3},
		{"conveyor_kv_cache_usage_perc", dto.MetricType_GAUGE, 0.25},
		{"conveyor_num_preemptions_total", dto.MetricType_COUNTER, 2},
		{"conveyor_scheduler_errors_total", dto.MetricType_COUNTER, 1},
		{"conveyor_engine_failed_steps_total", dto.MetricType_COUNTER, 4},
		{"conveyor_engine_runner_restarts_total", dto.MetricType_COUNTER, 1},
		{"conveyor_engine_recovered_panics_total", dto.MetricType_COUNTER, 5},
		{"conveyor_prompt_tokens_total", dto.MetricType_COUNTER, 70},
		{"conveyor_generation_tokens_total", dto.MetricType_COUNTER, 9},
		{"conveyor_prefix_cache_queries_total", dto.MetricType_COUNTER, 50},
		{"conveyor_prefix_cache_hits_total", dto.MetricType_COUNTER, 20},
		{"conveyor_batch_size", dto.MetricType_HISTOGRAM, 2},
		{"conveyor_step_duration_seconds", dto.MetricType_HISTOGRAM, 2},
		{"conveyor_time_to_first_token_seconds", dto.MetricType_HISTOGRAM, 2},
		{"conveyor_e2e_request_latency_seconds", dto.MetricType_HISTOGRAM, 2},
		{"conveyor_request_queue_time_seconds", dto.MetricType_HISTOGRAM, 2},
		{"conveyor_inter_token_latency_seconds", dto.MetricType_HISTOGRAM, 4}, // 2 sequences × (3-1) gaps
		{"conveyor_cache_config_info", dto.MetricType_GAUGE, 1},
		{"conveyor_spec_decode_num_drafts_total", dto.MetricType_COUNTER, 4},
		{"conveyor_spec_decode_num_draft_tokens_total", dto.MetricType_COUNTER, 12},
		{"conveyor_spec_decode_num_accepted_tokens_total", dto.MetricType_COUNTER, 7},
	}
	for _, c := range checks {
		if got := value(c.name, c.typ); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	perPos := map[string]float64{}
	for _, m := range fams["conveyor_spec_decode_num_accepted_tokens_per_pos_total"].GetMetric() {
		perPos[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	if len(perPos) != 2 || perPos["0"] != 4 || perPos["1"] != 3 {
		t.Errorf("accepted tokens per position %v", perPos)
	}
	bs := fams["conveyor_batch_size"].GetMetric()[0].GetHistogram()
	if bs.GetSampleSum() != 5 {
		t.Errorf("batch size sum %v", bs.GetSampleSum())
	}
	labels := map[string]string{}
	for _, l := range fams["conveyor_cache_config_info"].GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["block_size"] != "16" || labels["num_blocks"] != "100" {
		t.Errorf("cache info labels %v", labels)
	}
	// The standard Go and process collectors.
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "go_gc_duration_seconds", "go_info"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("metric %s missing", name)
		}
	}
	if runtime.GOOS == "linux" {
		for _, name := range []string{"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "process_start_time_seconds"} {
			if _, ok := fams[name]; !ok {
				t.Errorf("metric %s missing", name)
			}
		}
		if v := value("process_resident_memory_bytes", dto.MetricType_GAUGE); v <= 0 {
			t.Errorf("process_resident_memory_bytes = %v", v)
		}
	}
	succ := fams["conveyor_request_success_total"].GetMetric()
	if len(succ) != 1 || succ[0].GetLabel()[0].GetValue() != "length" || succ[0].GetCounter().GetValue() != 2 {
		t.Errorf("request_success_total %v", succ)
	}
}

func TestMetricsBeforeLoad(t *testing.T) {
	s := newTestServer(t, nil, nil)
	fams := scrape(t, s)
	if _, ok := fams["conveyor_num_requests_running"]; ok {
		t.Fatal("engine gauges reported before the engine exists")
	}
	if _, ok := fams["conveyor_batch_size"]; !ok {
		t.Fatal("histograms should be exposed from the start")
	}
}
