package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// RunConfig is one load-generation run.
type RunConfig struct {
	Target Target
	Items  []Item
	// RequestRate is the offered load in requests per second (open loop); 0 or +Inf sends
	// every request at once, which with MaxConcurrency makes a closed loop.
	RequestRate float64
	// Burstiness is the gamma shape of inter-arrival times: 1 = Poisson.
	Burstiness float64
	// MaxConcurrency caps requests in flight; 0 = no cap.
	MaxConcurrency int
	Seed           uint64
	SLO            SLO
	// Progress receives a progress bar when non-nil.
	Progress io.Writer
}

// Run sends every item at its arrival time and waits for all of them. It returns the
// report and each request's result, in workload order. Cancelling ctx stops sending;
// requests in flight fail with the context's error and are counted as failed.
func Run(ctx context.Context, cfg RunConfig) (Report, []Result, error) {
	if len(cfg.Items) == 0 {
		return Report{}, nil, fmt.Errorf("%w: empty workload", ErrBadConfig)
	}
	if cfg.MaxConcurrency < 0 {
		return Report{}, nil, fmt.Errorf("%w: max-concurrency must not be negative", ErrBadConfig)
	}
	if cfg.Burstiness == 0 {
		cfg.Burstiness = 1
	}
	offsets, err := Arrivals(len(cfg.Items), cfg.RequestRate, cfg.Burstiness, cfg.Seed)
	if err != nil {
		return Report{}, nil, err
	}
	var bar *progressbar.ProgressBar
	if cfg.Progress != nil {
		bar = progressbar.NewOptions(len(cfg.Items),
			progressbar.OptionSetWriter(cfg.Progress),
			progressbar.OptionSetDescription("requests"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(cfg.Progress) }),
		)
	}
	var sem chan struct{}
	if cfg.MaxConcurrency > 0 {
		sem = make(chan struct{}, cfg.MaxConcurrency)
	}
	results := make([]Result, len(cfg.Items))
	specBefore, specSeen := scrapeSpec(ctx, cfg.Target)
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for i, it := range cfg.Items {
		if wait := offsets[i] - time.Since(start); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
		}
		if sem != nil {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			for j := i; j < len(cfg.Items); j++ {
				results[j] = Result{PromptTokens: len(cfg.Items[j].Prompt), Err: "not sent: " + ctx.Err().Error()}
			}
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := time.Since(start)
			r := cfg.Target.Send(ctx, it)
			r.Start = sent
			results[i] = r
			if sem != nil {
				<-sem
			}
			if bar != nil {
				_ = bar.Add(1)
			}
		}()
	}
	wg.Wait()
	dur := time.Since(start)
	rep := Summarise(results, dur, cfg.SLO)
	if specSeen {
		if after, ok := scrapeSpec(ctx, cfg.Target); ok {
			rep.Speculation = specStats(specBefore, after)
		}
	}
	rep.RequestRate = Rate(cfg.RequestRate)
	if cfg.RequestRate == 0 {
		rep.RequestRate = Rate(math.Inf(1))
	}
	return rep, results, nil
}
