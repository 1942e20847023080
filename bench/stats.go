package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"
)

// Dist summarises a sample of durations in milliseconds.
type Dist struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
}

// Summarize computes the mean and percentiles of xs (milliseconds). Percentiles interpolate
// linearly between closest ranks, as numpy.percentile does by default.
func Summarize(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	return Dist{
		Count: len(s),
		Mean:  sum / float64(len(s)),
		P50:   Percentile(s, 50),
		P90:   Percentile(s, 90),
		P99:   Percentile(s, 99),
	}
}

// Percentile returns the p-th percentile (0..100) of sorted, interpolating linearly.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	hi := int(math.Ceil(rank))
	if lo == hi {
		return sorted[lo]
	}
	frac := rank - float64(lo)
	return sorted[lo]*(1-frac) + sorted[hi]*frac
}

// SLO is a service-level objective per request; a zero field is not checked.
type SLO struct {
	TTFT time.Duration `json:"ttft"`
	TPOT time.Duration `json:"tpot"`
}

// Met reports whether a successful request met the objective.
func (s SLO) Met(r Result) bool {
	if r.Err != "" {
		return false
	}
	if s.TTFT > 0 && r.TTFT > s.TTFT {
		return false
	}
	if s.TPOT > 0 && r.TPOT() > s.TPOT {
		return false
	}
	return true
}

// Result is what the client measured for one request.
type Result struct {
	PromptTokens int             `json:"prompt_tokens"`
	OutputTokens int             `json:"output_tokens"` // from the server's usage when given, else counted chunks
	Start        time.Duration   `json:"start"`         // send time from the start of the run
	TTFT         time.Duration   `json:"ttft"`          // time to the first text chunk
	E2E          time.Duration   `json:"e2e"`
	ITL          []time.Duration `json:"itl"` // gaps between successive text chunks
	Err          string          `json:"error,omitempty"`
}

// TPOT is the mean time per output token after the first.
func (r Result) TPOT() time.Duration {
	if r.OutputTokens < 2 {
		return 0
	}
	return (r.E2E - r.TTFT) / time.Duration(r.OutputTokens-1)
}

// Report is the summary of one run.
type Report struct {
	Completed         int            `json:"completed"`
	Failed            int            `json:"failed"`
	Errors            map[string]int `json:"errors,omitempty"` // error text -> count
	DurationSeconds   float64        `json:"duration_s"`
	RequestRate       Rate           `json:"request_rate"`       // offered, requests/s
	RequestThroughput float64        `json:"request_throughput"` // completed requests/s
	OutputThroughput  float64        `json:"output_throughput"`  // output tokens/s
	TotalOutputTokens int            `json:"total_output_tokens"`
	TotalPromptTokens int            `json:"total_prompt_tokens"`
	TTFT              Dist           `json:"ttft"`
	TPOT              Dist           `json:"tpot"`
	ITL               Dist           `json:"itl"`
	E2E               Dist           `json:"e2e"`
	SLO               SLO            `json:"slo"`
	Goodput           float64        `json:"goodput"` // requests/s that met the SLO
	ITLSamples        []float64      `json:"-"`       // milliseconds, for charts
	// Speculation is the server's speculative decoding during the run, when it reports it.
	Speculation *SpecStats `json:"speculation,omitempty"`
}

// Summarise builds the report of a run that took duration.
func Summarise(results []Result, duration time.Duration, slo SLO) Report {
	rep := Report{DurationSeconds: duration.Seconds(), SLO: slo}
	var ttft, tpot, itl, e2e []float64
	good := 0
	for _, r := range results {
		if r.Err != "" {
			rep.Failed++
			if rep.Errors == nil {
				rep.Errors = map[string]int{}
			}
			rep.Errors[r.Err]++
			continue
		}
		rep.Completed++
		rep.TotalOutputTokens += r.OutputTokens
		rep.TotalPromptTokens += r.PromptTokens
		ttft = append(ttft, ms(r.TTFT))
		if r.OutputTokens > 1 {
			tpot = append(tpot, ms(r.TPOT()))
		}
		for _, d := range r.ITL {
			itl = append(itl, ms(d))
		}
		e2e = append(e2e, ms(r.E2E))
		if slo.Met(r) {
			good++
		}
	}
	rep.TTFT, rep.TPOT, rep.ITL, rep.E2E = Summarize(ttft), Summarize(tpot), Summarize(itl), Summarize(e2e)
	rep.ITLSamples = itl
	if s := duration.Seconds(); s > 0 {
		rep.RequestThroughput = float64(rep.Completed) / s
		rep.OutputThroughput = float64(rep.TotalOutputTokens) / s
		rep.Goodput = float64(good) / s
	}
	return rep
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Rate is an offered request rate in requests per second; +Inf means all at once and is
// written as "inf" in JSON.
type Rate float64

// MarshalJSON writes finite rates as numbers and an infinite one as "inf".
func (r Rate) MarshalJSON() ([]byte, error) {
	if math.IsInf(float64(r), 0) || math.IsNaN(float64(r)) {
		return []byte(`"inf"`), nil
	}
	return json.Marshal(float64(r))
}

// String formats the rate for reports.
func (r Rate) String() string {
	if math.IsInf(float64(r), 0) {
		return "inf"
	}
	return strconv.FormatFloat(float64(r), 'g', 4, 64)
}

// Format writes the report as a human-readable table.
func (rep Report) Format(w io.Writer) {
	fmt.Fprintf(w, "%-34s %d\n", "Completed requests:", rep.Completed)
	fmt.Fprintf(w, "%-34s %d\n", "Failed requests:", rep.Failed)
	for msg, n := range rep.Errors {
		fmt.Fprintf(w, "  %5d x %s\n", n, msg)
	}
	fmt.Fprintf(w, "%-34s %s\n", "Offered rate (req/s):", rep.RequestRate)
	fmt.Fprintf(w, "%-34s %.2f\n", "Duration (s):", rep.DurationSeconds)
	fmt.Fprintf(w, "%-34s %d\n", "Prompt tokens:", rep.TotalPromptTokens)
	fmt.Fprintf(w, "%-34s %d\n", "Output tokens:", rep.TotalOutputTokens)
	fmt.Fprintf(w, "%-34s %.2f\n", "Request throughput (req/s):", rep.RequestThroughput)
	fmt.Fprintf(w, "%-34s %.2f\n", "Output throughput (tok/s):", rep.OutputThroughput)
	if rep.SLO.TTFT > 0 || rep.SLO.TPOT > 0 {
		fmt.Fprintf(w, "%-34s %.2f\n", fmt.Sprintf("Goodput (req/s, ttft<=%v tpot<=%v):", rep.SLO.TTFT, rep.SLO.TPOT), rep.Goodput)
	}
	fmt.Fprintf(w, "%-10s %10s %10s %10s %10s\n", "(ms)", "mean", "p50", "p90", "p99")
	for _, row := range []struct {
		name string
		d    Dist
	}{{"TTFT", rep.TTFT}, {"TPOT", rep.TPOT}, {"ITL", rep.ITL}, {"E2E", rep.E2E}} {
		fmt.Fprintf(w, "%-10s %10.2f %10.2f %10.2f %10.2f\n", row.name, row.d.Mean, row.d.P50, row.d.P90, row.d.P99)
	}
	if s := rep.Speculation; s != nil {
		fmt.Fprintf(w, "%-34s %d of %d (%.1f%%)\n", "Speculation: accepted tokens:", s.AcceptedTokens, s.DraftTokens, 100*s.AcceptanceRate)
		fmt.Fprintf(w, "%-34s %.2f\n", "Speculation: mean accepted length:", s.MeanAcceptedLength)
	}
}
