package bench

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRatiosAndSustained(t *testing.T) {
	pts := []Point{
		{Policy: "continuous", Rate: 2, Report: Report{OutputThroughput: 300, TTFT: Dist{P50: 50}, RequestThroughput: 2}},
		{Policy: "static", Rate: 2, Report: Report{OutputThroughput: 100, TTFT: Dist{P50: 400}, RequestThroughput: 1.7}},
		{Policy: "continuous", Rate: 8, Report: Report{OutputThroughput: 900, TTFT: Dist{P50: 80}, RequestThroughput: 7.5}},
		{Policy: "static", Rate: 8, Report: Report{OutputThroughput: 150, TTFT: Dist{P50: 9000}, RequestThroughput: 2}},
	}
	r := Ratios(pts, "continuous", "static")
	if len(r) != 2 || r[0].Throughput != 3 || r[0].TTFTp50 != 8 || r[1].Throughput != 6 || r[1].TTFTp50 != 112.5 {
		t.Fatalf("ratios %+v", r)
	}
	if !Sustained(pts[1]) || Sustained(pts[3]) {
		t.Fatal("static sustains 2 req/s (1.7 >= 1.6) but not 8 req/s")
	}
	h, ok := Headline(pts)
	if !ok || !strings.Contains(h, "6.00×") || !strings.Contains(h, "at 2 req/s, the highest rate static sustains, its p50 TTFT is 8.00× lower") {
		t.Fatalf("headline %q", h)
	}
}

func TestCompareWritesAReport(t *testing.T) {
	delays := map[string]time.Duration{"continuous": 5 * time.Millisecond, "static": 40 * time.Millisecond}
	var started, stopped []string
	start := func(ctx context.Context, policy string) (Server, error) {
		srv := scriptedServer(t, delays[policy], time.Millisecond)
		started = append(started, policy)
		return Server{BaseURL: srv.URL, Stop: func() error { srv.Close(); stopped = append(stopped, policy); return nil }}, nil
	}
	var log strings.Builder
	pts, err := Compare(context.Background(), CompareConfig{
		Policies: []string{"continuous", "static"}, Rates: []float64{50, 100},
		Workload: WorkloadConfig{NumRequests: 5, Dist: Fixed, PromptTokens: 3, OutputTokens: 4, MaxTokenID: 20},
		Model:    "m", Start: start, Log: &log,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 4 || strings.Join(started, ",") != "continuous,static" || strings.Join(stopped, ",") != "continuous,static" {
		t.Fatalf("points %d, started %v, stopped %v", len(pts), started, stopped)
	}
	for _, p := range pts {
		if p.Report.Completed != 5 {
			t.Fatalf("%s @ %v: %d completed (%v)", p.Policy, p.Rate, p.Report.Completed, p.Report.Errors)
		}
	}
	if r := Ratios(pts, "continuous", "static"); len(r) != 2 || !(r[0].TTFTp50 > 2) || math.IsNaN(r[0].Throughput) {
		t.Fatalf("ratios %+v", r)
	}
	dir := t.TempDir()
	meta := ReportMeta{Command: "conveyor bench compare", Machine: "test", Model: "fake",
		Load: DefaultWorkloadConfig().String(), Notes: "Static batches wait for their longest output.\n"}
	if err := WriteReport(dir, meta, pts); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"report.md", "throughput.png", "ttft.png", "itl.png"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Size() == 0 {
			t.Fatalf("%s missing or empty: %v", name, err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	for _, want := range []string{"Continuous ÷ static", "| continuous | 50 |", "| static | 100 |", "`conveyor bench compare`",
		"- Workload: 200 requests, lognormal prompt lengths (median 128, 8 to 384 tokens) and output lengths (median 96, 8 to 256), seed 1",
		"## Notes\n\nStatic batches wait for their longest output.\n"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if !strings.Contains(log.String(), "static") {
		t.Errorf("no progress log: %q", log.String())
	}
}

// TestWriteReportCharts writes the report of sweeps the charts once could not draw: a
// closed-loop rate (inf) alone or beside finite ones, and a sweep where no request
// completed. Every file must be there and none empty.
func TestWriteReportCharts(t *testing.T) {
	ok := func(policy string, rate float64) Point {
		return Point{Policy: policy, Rate: rate, Report: Report{Completed: 4, OutputThroughput: 100,
			TTFT: Dist{P50: 20, P99: 40}, ITLSamples: []float64{1, 2, 3}}}
	}
	inf := math.Inf(1)
	for name, pts := range map[string][]Point{
		"inf only":       {ok("continuous", inf), ok("static", inf)},
		"finite and inf": {ok("continuous", 1), ok("continuous", inf), ok("static", 1), ok("static", inf)},
		"none completed": {{Policy: "continuous", Rate: 2, Report: Report{Failed: 4, Errors: map[string]int{"HTTP 404": 4}}}},
	} {
		dir := t.TempDir()
		if err := WriteReport(dir, ReportMeta{Command: "conveyor bench compare"}, pts); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, f := range []string{"report.md", "throughput.png", "ttft.png", "itl.png"} {
			if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
				t.Errorf("%s: %s missing or empty: %v", name, f, err)
			}
		}
	}
}

func TestRateAxisPlacesInfLast(t *testing.T) {
	inf := math.Inf(1)
	a := newRateAxis([]Point{{Rate: 4}, {Rate: inf}, {Rate: 0.5}, {Rate: 4}})
	if a.x(0.5) != 0 || a.x(4) != 1 || a.x(inf) != 2 {
		t.Errorf("slots %v: x(0.5) %v, x(4) %v, x(inf) %v; want 0, 1, 2", a.slots, a.x(0.5), a.x(4), a.x(inf))
	}
	if a := newRateAxis([]Point{{Rate: 4}, {Rate: 0.5}}); a.x(4) != 4 || a.slots != nil {
		t.Errorf("finite rates: slots %v, x(4) %v; want a linear axis", a.slots, a.x(4))
	}
}

// TestWriteReportKeepsResultsWhenAChartFails: a chart that cannot be drawn (a NaN
// throughput) is an ErrChart error, but report.md is written, the other charts too, and
// no stale file is left under the failed chart's name.
func TestWriteReportKeepsResultsWhenAChartFails(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "throughput.png")
	if err := os.WriteFile(stale, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	pts := []Point{{Policy: "continuous", Rate: 1, Report: Report{Completed: 1, OutputThroughput: math.NaN(), TTFT: Dist{P50: 5, P99: 9}}}}
	err := WriteReport(dir, ReportMeta{Command: "c"}, pts)
	if !errors.Is(err, ErrChart) || !strings.Contains(err.Error(), "throughput.png") {
		t.Fatalf("err %v, want ErrChart naming throughput.png", err)
	}
	if md, err := os.ReadFile(filepath.Join(dir, "report.md")); err != nil || !strings.Contains(string(md), "| continuous | 1 |") {
		t.Errorf("report.md: %v, %q", err, md)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale throughput.png left: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "ttft.png")); err != nil || fi.Size() == 0 {
		t.Errorf("ttft.png: %v", err)
	}
}
