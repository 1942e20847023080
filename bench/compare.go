package bench

import (
	"context"
	"fmt"
	"io"
	"math"
)

// Server is a running server under test.
type Server struct {
	BaseURL string
	Stop    func() error
}

// StartFunc starts a server with the given scheduling policy and returns once it is healthy.
type StartFunc func(ctx context.Context, policy string) (Server, error)

// CompareConfig is a sweep: every policy at every request rate, on the same workload.
type CompareConfig struct {
	Policies   []string  // e.g. continuous, static, sequential
	Rates      []float64 // requests/s; math.Inf(1) sends all at once
	Workload   WorkloadConfig
	Burstiness float64
	SLO        SLO
	Model      string
	APIKey     string
	Start      StartFunc
	// Log receives one line per finished run; nil for none.
	Log io.Writer
}

// Point is one run of a sweep.
type Point struct {
	Policy string  `json:"policy"`
	Rate   float64 `json:"-"`
	Report Report  `json:"report"`
}

// Compare starts one server per policy (one at a time) and runs the workload at each rate.
// A server that cannot start ends the sweep with an error; failed requests are part of the
// reports, not errors.
func Compare(ctx context.Context, cfg CompareConfig) ([]Point, error) {
	if len(cfg.Policies) == 0 || len(cfg.Rates) == 0 || cfg.Start == nil {
		return nil, fmt.Errorf("%w: compare needs policies, rates and a way to start servers", ErrBadConfig)
	}
	items, err := Generate(cfg.Workload)
	if err != nil {
		return nil, err
	}
	var points []Point
	for _, policy := range cfg.Policies {
		srv, err := cfg.Start(ctx, policy)
		if err != nil {
			return points, fmt.Errorf("start %s server: %w", policy, err)
		}
		for _, rate := range cfg.Rates {
			rep, _, err := Run(ctx, RunConfig{
				Target: Target{BaseURL: srv.BaseURL, Model: cfg.Model, APIKey: cfg.APIKey},
				Items:  items, RequestRate: rate, Burstiness: cfg.Burstiness,
				Seed: cfg.Workload.Seed, SLO: cfg.SLO,
			})
			if err != nil {
				_ = srv.Stop()
				return points, err
			}
			points = append(points, Point{Policy: policy, Rate: rate, Report: rep})
			if cfg.Log != nil {
				fmt.Fprintf(cfg.Log, "%-11s rate %-6s  %4d ok %3d failed  %8.1f tok/s  ttft p50 %8.0f ms  p99 %8.0f ms\n",
					policy, Rate(rate), rep.Completed, rep.Failed, rep.OutputThroughput, rep.TTFT.P50, rep.TTFT.P99)
			}
			if ctx.Err() != nil {
				break
			}
		}
		if err := srv.Stop(); err != nil {
			return points, fmt.Errorf("stop %s server: %w", policy, err)
		}
		if ctx.Err() != nil {
			return points, ctx.Err()
		}
	}
	return points, nil
}

// Ratio is continuous ÷ static at one rate.
type Ratio struct {
	Rate       float64
	Throughput float64 // output throughput, continuous / static
	TTFTp50    float64 // static p50 TTFT / continuous p50 TTFT (how many times lower)
}

// Ratios compares policy a against b at every rate both ran.
func Ratios(points []Point, a, b string) []Ratio {
	var out []Ratio
	for _, pa := range points {
		if pa.Policy != a {
			continue
		}
		for _, pb := range points {
			if pb.Policy != b || pb.Rate != pa.Rate {
				continue
			}
			out = append(out, Ratio{
				Rate:       pa.Rate,
				Throughput: safeDiv(pa.Report.OutputThroughput, pb.Report.OutputThroughput),
				TTFTp50:    safeDiv(pb.Report.TTFT.P50, pa.Report.TTFT.P50),
			})
		}
	}
	return out
}

// Sustained reports whether a run kept up with its offered rate: every request completed
// and the completed-request throughput over the whole run (drain included) reached 80% of
// the offered rate.
func Sustained(p Point) bool {
	if p.Report.Failed > 0 {
		return false
	}
	if math.IsInf(p.Rate, 1) {
		return false
	}
	return p.Report.RequestThroughput >= 0.8*p.Rate
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}
