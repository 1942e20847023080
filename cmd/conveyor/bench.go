package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/conveyor-llm/conveyor/bench"
)

func init() {
	register(command{
		name:    "bench",
		summary: "load-test an OpenAI-compatible /v1/completions endpoint (bench compare: batching policies side by side; bench soak: hours of mixed traffic, every reply checked)",
		run:     runBench,
	})
}

// workloadFlags registers the workload flags shared by bench and bench compare.
func workloadFlags(fs *flag.FlagSet) func() (bench.WorkloadConfig, error) {
	d := bench.DefaultWorkloadConfig()
	n := fs.Int("num-requests", d.NumRequests, "requests to send")
	dist := fs.String("dataset", string(d.Dist), "length distribution: fixed, uniform or lognormal (chat-like mix)")
	seed := fs.Uint64("seed", d.Seed, "workload and arrival seed")
	in := fs.Int("input-len", d.PromptTokens, "prompt length in tokens (fixed length, or lognormal median)")
	out := fs.Int("output-len", d.OutputTokens, "output length in tokens (fixed length, or lognormal median)")
	minIn := fs.Int("min-input-len", d.MinPromptTokens, "shortest prompt in tokens (uniform, lognormal)")
	maxIn := fs.Int("max-input-len", d.MaxPromptTokens, "longest prompt in tokens (uniform, lognormal)")
	minOut := fs.Int("min-output-len", d.MinOutputTokens, "shortest output in tokens (uniform, lognormal)")
	maxOut := fs.Int("max-output-len", d.MaxOutputTokens, "longest output in tokens (uniform, lognormal)")
	maxID := fs.Int("max-token-id", int(d.MaxTokenID), "prompt token ids are drawn from [10, max-token-id)")
	return func() (bench.WorkloadConfig, error) {
		c := bench.WorkloadConfig{
			NumRequests: *n, Dist: bench.LengthDist(*dist), Seed: *seed,
			PromptTokens: *in, OutputTokens: *out,
			MinPromptTokens: *minIn, MaxPromptTokens: *maxIn,
			MinOutputTokens: *minOut, MaxOutputTokens: *maxOut,
			MinTokenID: d.MinTokenID, MaxTokenID: int32(*maxID),
		}
		return c, c.Validate()
	}
}

// parseSLO reads "ttft=MS,tpot=MS".
func parseSLO(s string) (bench.SLO, error) {
	var slo bench.SLO
	if s == "" {
		return slo, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		ms, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || ms <= 0 {
			return slo, fmt.Errorf("--slo %q: want ttft=MS,tpot=MS with positive milliseconds", s)
		}
		d := time.Duration(ms * float64(time.Millisecond))
		switch k {
		case "ttft":
			slo.TTFT = d
		case "tpot":
			slo.TPOT = d
		default:
			return slo, fmt.Errorf("--slo: unknown objective %q (ttft or tpot)", k)
		}
	}
	return slo, nil
}

// parseRate reads a request rate: a positive number of requests/s, or inf for all at once.
func parseRate(s string) (float64, error) {
	if s == "inf" {
		return math.Inf(1), nil
	}
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || r <= 0 || math.IsNaN(r) {
		return 0, fmt.Errorf("%q: want a positive number of requests/s or inf", s)
	}
	return r, nil
}

// parseRates reads bench compare's --rates, a comma-separated list of parseRate's rates.
func parseRates(s string) ([]float64, error) {
	var rates []float64
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("--rates %q: item %d is empty (want positive requests/s or inf, comma-separated)", s, i+1)
		}
		r, err := parseRate(item)
		if err != nil {
			return nil, fmt.Errorf("--rates %q: item %v", s, err)
		}
		rates = append(rates, r)
	}
	return rates, nil
}

// checkBurstiness checks --burstiness, the gamma shape of inter-arrival times, before any
// run: bench.Arrivals refuses what is not positive, but bench.Run reads 0 as Poisson.
func checkBurstiness(b float64) error {
	if !(b > 0) || math.IsInf(b, 1) {
		return fmt.Errorf("--burstiness %g: must be a positive number (1 = Poisson)", b)
	}
	return nil
}

// apiKeyFlag defines --api-key, a Bearer key that defaults to $OPENAI_API_KEY. The
// variable is read after parsing, not made the flag's default, so that -h never prints
// the key (as serve's --api-key, whose $CONVEYOR_API_KEY is applied after its defaults
// are defined). An --api-key given on the command line wins, even an empty one.
func apiKeyFlag(fs *flag.FlagSet) func() string {
	key := fs.String("api-key", "", "Bearer key (default $OPENAI_API_KEY)")
	return func() string {
		set := false
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == "api-key" })
		if set {
			return *key
		}
		return os.Getenv("OPENAI_API_KEY")
	}
}

// notSentPrefix starts the error bench.Run gives the requests it did not send because
// its context ended.
const notSentPrefix = "not sent: "

// dropNotSent takes the requests an interrupt kept from being sent out of rep's failed
// requests and returns how many there were: they were never sent, so they say nothing
// about the server. Requests in flight at the interrupt stay failed, with its error.
func dropNotSent(rep *bench.Report) int {
	n := notSent(*rep)
	if n == 0 {
		return 0
	}
	errs := map[string]int{}
	for msg, c := range rep.Errors {
		if !strings.HasPrefix(msg, notSentPrefix) {
			errs[msg] = c
		}
	}
	rep.Errors, rep.Failed = errs, rep.Failed-n
	if len(errs) == 0 {
		rep.Errors = nil
	}
	return n
}

// notSent counts the requests of rep that were not sent.
func notSent(rep bench.Report) int {
	n := 0
	for msg, c := range rep.Errors {
		if strings.HasPrefix(msg, notSentPrefix) {
			n += c
		}
	}
	return n
}

// benchJSON is bench's --json report: bench.Report, and whether it was interrupted
// with how many requests were not sent (both left out of an uninterrupted run's).
type benchJSON struct {
	bench.Report
	Interrupted bool `json:"interrupted,omitempty"`
	NotSent     int  `json:"not_sent,omitempty"`
}

// noneCompleted is bench's error when not one request of a run completed: a run that
// measured nothing (a wrong --model, a server that refuses every request) must not exit 0.
// It names the first failure in workload order.
func noneCompleted(rep bench.Report, results []bench.Result) error {
	if rep.Completed > 0 || len(results) == 0 {
		return nil
	}
	for _, r := range results {
		if r.Err != "" {
			return fmt.Errorf("bench: no request completed (%d failed); the first failed with: %s", rep.Failed, r.Err)
		}
	}
	return fmt.Errorf("bench: no request completed (%d failed)", rep.Failed)
}

// checkOutFile checks, before a long run, that path can be written at its end: its
// directory exists and the file can be opened for writing. A file that was not there is
// not left behind.
func checkOutFile(path string) error {
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	f.Close()
	if os.IsNotExist(statErr) {
		return os.Remove(path)
	}
	return nil
}

// prepareOutDir creates dir (with its parents) and checks, before a long run, that files
// can be created in it.
func prepareOutDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".conveyor-bench-*")
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

func runBench(args []string) error {
	if len(args) > 0 && args[0] == "compare" {
		return runBenchCompare(args[1:])
	}
	if len(args) > 0 && args[0] == "soak" {
		return runBenchSoak(args[1:], os.Stdout)
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	base := fs.String("base-url", "http://127.0.0.1:8000", "server address (with or without /v1)")
	model := fs.String("model", "", "model name sent in requests (default: the server's first model)")
	key := apiKeyFlag(fs)
	rate := fs.String("request-rate", "inf", "offered load in requests/s (Poisson/gamma arrivals), or inf to send all at once")
	burst := fs.Float64("burstiness", 1, "gamma shape of inter-arrival times: 1 = Poisson, <1 burstier, >1 more regular")
	conc := fs.Int("max-concurrency", 0, "requests in flight at most (with --request-rate inf: a closed loop); 0 = no cap")
	slo := fs.String("slo", "", "goodput objective, e.g. ttft=500,tpot=50 (milliseconds)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	noProgress := fs.Bool("no-progress", false, "hide the progress bar")
	temperature := fs.Float64("temperature", 0, "sampling temperature of every request: 0 (greedy) to 2")
	topP := fs.Float64("top-p", 1, "nucleus sampling's top_p of every request, in (0, 1]")
	responseFormat := fs.String("response-format", "", "send this response_format with every request: JSON (e.g. '{\"type\":\"json_object\"}') or @FILE")
	workload := workloadFlags(fs)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: conveyor bench [flags]\n       conveyor bench compare [flags]\n       conveyor bench soak [flags]\n\nflags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	wc, err := workload()
	if err != nil {
		return err
	}
	r, err := parseRate(*rate)
	if err != nil {
		return fmt.Errorf("bench: --request-rate %v", err)
	}
	if err := checkBurstiness(*burst); err != nil {
		return fmt.Errorf("bench: %v", err)
	}
	if *conc < 0 {
		return fmt.Errorf("bench: --max-concurrency %d: must be >= 0 (0 = no cap)", *conc)
	}
	objective, err := parseSLO(*slo)
	if err != nil {
		return err
	}
	rf, err := readResponseFormat(*responseFormat)
	if err != nil {
		return err
	}
	if *temperature < 0 || *temperature > 2 || !(*topP > 0 && *topP <= 1) {
		return fmt.Errorf("bench: --temperature %g must be in [0, 2] and --top-p %g in (0, 1]", *temperature, *topP)
	}
	items, err := bench.Generate(wc)
	if err != nil {
		return err
	}
	// The first Ctrl-C stops sending and ends the requests in flight; a second one quits
	// at once (notifyContext hands the signal back).
	ctx, stop := notifyContext(context.Background(), os.Interrupt)
	defer stop()
	target := bench.Target{BaseURL: *base, Model: *model, APIKey: key(), ResponseFormat: rf, Temperature: *temperature, TopP: *topP}
	if target.Model == "" {
		if target.Model, err = bench.FirstModel(ctx, target); err != nil {
			if ctx.Err() != nil {
				return errors.New("bench: interrupted before any request was sent")
			}
			return err
		}
	}
	cfg := bench.RunConfig{Target: target, Items: items, RequestRate: r, Burstiness: *burst,
		MaxConcurrency: *conc, Seed: wc.Seed, SLO: objective}
	if !*noProgress && !*asJSON {
		cfg.Progress = os.Stderr
	}
	rep, results, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	interrupted := ctx.Err() != nil
	unsent := 0
	if interrupted {
		unsent = dropNotSent(&rep)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(benchJSON{Report: rep, Interrupted: interrupted, NotSent: unsent}); err != nil {
			return err
		}
	} else {
		if interrupted {
			fmt.Fprintf(os.Stdout, "Interrupted: %d of %d requests were not sent; they are not counted below.\n", unsent, len(items))
		}
		rep.Format(os.Stdout)
	}
	if interrupted {
		// As run-batch: an interrupted run is an error (exit 1, runMain's code for every
		// error), so that a script does not take a partial run for a whole one.
		return fmt.Errorf("bench: interrupted: %d of %d requests sent (%d completed, %d failed), %d not sent", len(items)-unsent, len(items), rep.Completed, rep.Failed, unsent)
	}
	return noneCompleted(rep, results)
}

// readResponseFormat reads --response-format: inline JSON or @FILE; "" is none.
func readResponseFormat(v string) (json.RawMessage, error) {
	if v == "" {
		return nil, nil
	}
	raw := []byte(v)
	if strings.HasPrefix(v, "@") {
		b, err := os.ReadFile(v[1:])
		if err != nil {
			return nil, fmt.Errorf("bench: --response-format: %w", err)
		}
		raw = b
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("bench: --response-format %.40q is not JSON", v)
	}
	return json.RawMessage(raw), nil
}
