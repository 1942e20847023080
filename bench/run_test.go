package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestGenerateIsDeterministicForASeed(t *testing.T) {
	c := DefaultWorkloadConfig()
	a, err := Generate(c)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate(c)
	for i := range a {
		if a[i].MaxTokens != b[i].MaxTokens || !slices.Equal(a[i].Prompt, b[i].Prompt) {
			t.Fatalf("item %d differs between two runs with seed %d", i, c.Seed)
		}
	}
	c.Seed++
	d, _ := Generate(c)
	same := 0
	for i := range a {
		if len(a[i].Prompt) == len(d[i].Prompt) && a[i].MaxTokens == d[i].MaxTokens {
			same++
		}
	}
	if same == len(a) {
		t.Fatal("another seed gave the same lengths")
	}
}

func TestGenerateHonoursDistributions(t *testing.T) {
	t.Run("fixed", func(t *testing.T) {
		c := WorkloadConfig{NumRequests: 50, Dist: Fixed, PromptTokens: 33, OutputTokens: 7, MinTokenID: 5, MaxTokenID: 9}
		items, err := Generate(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			if len(it.Prompt) != 33 || it.MaxTokens != 7 {
				t.Fatalf("got prompt %d output %d, want 33 and 7", len(it.Prompt), it.MaxTokens)
			}
			for _, id := range it.Prompt {
				if id < 5 || id >= 9 {
					t.Fatalf("token id %d outside [5, 9)", id)
				}
			}
		}
	})
	t.Run("uniform", func(t *testing.T) {
		c := WorkloadConfig{NumRequests: 4000, Dist: Uniform, MinPromptTokens: 10, MaxPromptTokens: 20,
			MinOutputTokens: 1, MaxOutputTokens: 3, MinTokenID: 0, MaxTokenID: 100}
		items, _ := Generate(c)
		seen := map[int]int{}
		var sum float64
		for _, it := range items {
			if len(it.Prompt) < 10 || len(it.Prompt) > 20 || it.MaxTokens < 1 || it.MaxTokens > 3 {
				t.Fatalf("length out of range: %d, %d", len(it.Prompt), it.MaxTokens)
			}
			seen[len(it.Prompt)]++
			sum += float64(len(it.Prompt))
		}
		if len(seen) != 11 {
			t.Fatalf("uniform prompt lengths cover %d values, want all 11", len(seen))
		}
		if mean := sum / 4000; math.Abs(mean-15) > 0.3 {
			t.Fatalf("uniform mean %.2f, want about 15", mean)
		}
	})
	t.Run("lognormal", func(t *testing.T) {
		c := DefaultWorkloadConfig()
		c.NumRequests = 5000
		c.MaxPromptTokens, c.MaxOutputTokens = 100000, 100000
		items, _ := Generate(c)
		var p []float64
		for _, it := range items {
			p = append(p, float64(len(it.Prompt)))
		}
		slices.Sort(p)
		med, p90 := Percentile(p, 50), Percentile(p, 90)
		if math.Abs(med-128)/128 > 0.08 {
			t.Fatalf("lognormal median %.1f, want about 128", med)
		}
		// exp(0.8 * 1.2816) = 2.79
		if r := p90 / med; r < 2.4 || r > 3.2 {
			t.Fatalf("p90/median = %.2f, want about 2.8 (a long tail)", r)
		}
	})
}

func TestValidateRejectsBadConfigs(t *testing.T) {
	bad := []WorkloadConfig{
		{NumRequests: 0, Dist: Fixed, PromptTokens: 1, OutputTokens: 1, MaxTokenID: 10},
		{NumRequests: 1, Dist: "zipf", MaxTokenID: 10},
		{NumRequests: 1, Dist: Fixed, PromptTokens: 0, OutputTokens: 1, MaxTokenID: 10},
		{NumRequests: 1, Dist: Uniform, MinPromptTokens: 5, MaxPromptTokens: 4, MinOutputTokens: 1, MaxOutputTokens: 1, MaxTokenID: 10},
		{NumRequests: 1, Dist: Fixed, PromptTokens: 1, OutputTokens: 1, MinTokenID: 10, MaxTokenID: 10},
	}
	for i, c := range bad {
		if _, err := Generate(c); err == nil {
			t.Errorf("config %d: no error", i)
		}
	}
}

func TestArrivals(t *testing.T) {
	all, err := Arrivals(5, math.Inf(1), 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range all {
		if d != 0 {
			t.Fatalf("infinite rate should send at once, got offset %v", d)
		}
	}
	for _, burst := range []float64{0.5, 1, 4} {
		const n, rate = 20000, 50.0
		offs, err := Arrivals(n, rate, burst, 7)
		if err != nil {
			t.Fatal(err)
		}
		var gaps []float64
		for i := 1; i < n; i++ {
			gaps = append(gaps, (offs[i] - offs[i-1]).Seconds())
		}
		mean, sd := meanSD(gaps)
		if math.Abs(mean-1/rate)/(1/rate) > 0.05 {
			t.Errorf("burstiness %v: mean gap %.5f s, want %.5f", burst, mean, 1/rate)
		}
		// Gamma(k): coefficient of variation 1/sqrt(k).
		if cv, want := sd/mean, 1/math.Sqrt(burst); math.Abs(cv-want)/want > 0.08 {
			t.Errorf("burstiness %v: CV %.3f, want %.3f", burst, cv, want)
		}
	}
	if _, err := Arrivals(3, -1, 1, 1); err == nil {
		t.Error("negative rate accepted")
	}
	if _, err := Arrivals(3, 1, 0, 1); err == nil {
		t.Error("zero burstiness accepted")
	}
}

func meanSD(xs []float64) (float64, float64) {
	var s, ss float64
	for _, x := range xs {
		s += x
	}
	m := s / float64(len(xs))
	for _, x := range xs {
		ss += (x - m) * (x - m)
	}
	return m, math.Sqrt(ss / float64(len(xs)-1))
}

func TestPercentilesAndGoodputByHand(t *testing.T) {
	d := Summarize([]float64{40, 10, 30, 20, 50})
	// numpy.percentile([10,20,30,40,50], [50,90,99]) = 30, 46, 49.6
	if d.Count != 5 || d.Mean != 30 || d.P50 != 30 || math.Abs(d.P90-46) > 1e-9 || math.Abs(d.P99-49.6) > 1e-9 {
		t.Fatalf("got %+v", d)
	}
	if got := Percentile([]float64{7}, 99); got != 7 {
		t.Fatalf("single-sample percentile %v", got)
	}
	ms := time.Millisecond
	results := []Result{
		{OutputTokens: 11, TTFT: 100 * ms, E2E: 600 * ms},                // tpot 50 ms: meets both
		{OutputTokens: 11, TTFT: 300 * ms, E2E: 800 * ms},                // ttft too slow
		{OutputTokens: 11, TTFT: 100 * ms, E2E: 1100 * ms},               // tpot 100 ms: too slow
		{OutputTokens: 1, TTFT: 150 * ms, E2E: 150 * ms},                 // one token: no tpot
		{Err: "HTTP 500: boom"}, {Err: "HTTP 500: boom"}, {Err: "reset"}, // failures
	}
	rep := Summarise(results, 2*time.Second, SLO{TTFT: 200 * ms, TPOT: 60 * ms})
	if rep.Completed != 4 || rep.Failed != 3 || rep.Errors["HTTP 500: boom"] != 2 || rep.Errors["reset"] != 1 {
		t.Fatalf("counts: %+v", rep)
	}
	if rep.Goodput != 1 { // 2 good requests in 2 s
		t.Fatalf("goodput %v, want 1 req/s", rep.Goodput)
	}
	if rep.TotalOutputTokens != 34 || rep.OutputThroughput != 17 {
		t.Fatalf("output tokens %d, throughput %v", rep.TotalOutputTokens, rep.OutputThroughput)
	}
	if rep.TPOT.Count != 3 || math.Abs(rep.TPOT.Mean-(50+50+100)/3.0) > 1e-9 {
		t.Fatalf("tpot %+v", rep.TPOT)
	}
}

// scriptedServer streams `tokens` chunks: the first after ttft, the rest every itl.
func scriptedServer(t *testing.T, ttft, itl time.Duration) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req completionRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.URL.Path != "/v1/completions" {
			http.Error(w, `{"error":{"message":"bad"}}`, http.StatusBadRequest)
			return
		}
		if !req.Stream || !req.IgnoreEOS || len(req.Prompt) == 0 {
			http.Error(w, `{"error":{"message":"want stream, ignore_eos and a prompt"}}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		fmt.Fprint(w, ": keep-alive\n\n")
		fl.Flush()
		time.Sleep(ttft)
		for i := range req.MaxTokens {
			if i > 0 {
				time.Sleep(itl)
			}
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d\",\"index\":0,\"finish_reason\":null}],\"usage\":null}\n\n", i)
			fl.Flush()
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", req.MaxTokens)
		fl.Flush()
	}))
}

func TestRunRecoversScriptedDelays(t *testing.T) {
	const ttft, itl = 120 * time.Millisecond, 25 * time.Millisecond
	srv := scriptedServer(t, ttft, itl)
	defer srv.Close()
	items, _ := Generate(WorkloadConfig{NumRequests: 6, Dist: Fixed, PromptTokens: 4, OutputTokens: 8, MaxTokenID: 50})
	rep, results, err := Run(context.Background(), RunConfig{
		Target: Target{BaseURL: srv.URL + "/v1", Model: "m"}, Items: items, RequestRate: 20, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != 6 || rep.Failed != 0 {
		t.Fatalf("completed %d failed %d: %v", rep.Completed, rep.Failed, rep.Errors)
	}
	for _, r := range results {
		if r.OutputTokens != 8 || len(r.ITL) != 7 {
			t.Fatalf("result %+v", r)
		}
	}
	within := func(name string, got, want float64) {
		t.Helper()
		if got < want*0.9 || got > want*1.6+15 {
			t.Errorf("%s p50 %.1f ms, want about %.1f", name, got, want)
		}
	}
	within("TTFT", rep.TTFT.P50, 120)
	within("ITL", rep.ITL.P50, 25)
	within("TPOT", rep.TPOT.P50, 25)
	within("E2E", rep.E2E.P50, 120+7*25)
}

func TestFailuresAreReportedNotHidden(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) % 4 {
		case 0: // overloaded
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"error":{"message":"queue full","type":"rate_limit_error"}}`)
		case 1: // drops the connection mid-stream
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		case 2: // in-band error
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"model failed\"}}\n\ndata: [DONE]\n\n")
		case 3: // fine
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
		}
	}))
	defer srv.Close()
	items, _ := Generate(WorkloadConfig{NumRequests: 8, Dist: Fixed, PromptTokens: 2, OutputTokens: 1, MaxTokenID: 50})
	rep, results, err := Run(context.Background(), RunConfig{
		Target: Target{BaseURL: srv.URL, Model: "m"}, Items: items, MaxConcurrency: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != 2 || rep.Failed != 6 {
		t.Fatalf("completed %d failed %d, want 2 and 6: %v", rep.Completed, rep.Failed, rep.Errors)
	}
	var kinds []string
	for _, r := range results {
		kinds = append(kinds, r.Err)
	}
	joined := strings.Join(kinds, "|")
	for _, want := range []string{"HTTP 429: queue full", "stream error: model failed", "stream broken"} {
		if !strings.Contains(joined, want) {
			t.Errorf("no failure mentioning %q in %q", want, joined)
		}
	}
}

func TestRateMarshalsInfinity(t *testing.T) {
	b, err := json.Marshal(Report{RequestRate: Rate(math.Inf(1))})
	if err != nil || !strings.Contains(string(b), `"request_rate":"inf"`) {
		t.Fatalf("%s %v", b, err)
	}
}

// TestTargetSendsSampling: a Target's temperature and top_p reach every request's body;
// the zero Target sends greedy decoding (temperature 0, no top_p).
func TestTargetSendsSampling(t *testing.T) {
	got := make(chan map[string]any, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		got <- body
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"completion_tokens\":0}}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	it := Item{Prompt: []int32{1, 2}, MaxTokens: 1}
	Target{BaseURL: srv.URL, Model: "m", Temperature: 1, TopP: 0.9}.Send(context.Background(), it)
	if b := <-got; b["temperature"] != 1.0 || b["top_p"] != 0.9 {
		t.Errorf("sampled: temperature %v, top_p %v", b["temperature"], b["top_p"])
	}
	Target{BaseURL: srv.URL, Model: "m"}.Send(context.Background(), it)
	if b := <-got; b["temperature"] != 0.0 || b["top_p"] != nil {
		t.Errorf("greedy: temperature %v, top_p %v", b["temperature"], b["top_p"])
	}
}

// TestRunReportsSpeculation: against a server whose /metrics carries Conveyor's
// speculative decoding counters, the report gives what they grew by during the run: the
// acceptance rate and the mean accepted length; against one without them, nothing.
func TestRunReportsSpeculation(t *testing.T) {
	var scrapes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			n := int64(scrapes.Add(1) - 1) // 0 before the run, 1 after
			fmt.Fprintf(w, "# TYPE conveyor_spec_decode_num_drafts_total counter\nconveyor_spec_decode_num_drafts_total %d\n", 10+40*n)
			fmt.Fprintf(w, "conveyor_spec_decode_num_draft_tokens_total %d\n", 30+160*n)
			fmt.Fprintf(w, "conveyor_spec_decode_num_accepted_tokens_total %d\n", 5+100*n)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\",\"index\":0,\"finish_reason\":\"length\"}],\"usage\":null}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	items, _ := Generate(WorkloadConfig{NumRequests: 2, Dist: Fixed, PromptTokens: 4, OutputTokens: 1, MaxTokenID: 50})
	rep, _, err := Run(context.Background(), RunConfig{Target: Target{BaseURL: srv.URL, Model: "m"}, Items: items})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Speculation
	if s == nil || s.Drafts != 40 || s.DraftTokens != 160 || s.AcceptedTokens != 100 || s.AcceptanceRate != 0.625 || s.MeanAcceptedLength != 3.5 {
		t.Fatalf("speculation %+v; want 100 of 160 accepted over 40 drafts", s)
	}
	var out strings.Builder
	rep.Format(&out)
	if !strings.Contains(out.String(), "100 of 160 (62.5%)") || !strings.Contains(out.String(), "3.50") {
		t.Errorf("report:\n%s", out.String())
	}
	plain := scriptedServer(t, 0, 0)
	defer plain.Close()
	rep, _, err = Run(context.Background(), RunConfig{Target: Target{BaseURL: plain.URL, Model: "m"}, Items: items})
	if err != nil || rep.Speculation != nil {
		t.Fatalf("a server without the counters: %+v, %v", rep.Speculation, err)
	}
}
