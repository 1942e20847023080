package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/models"
)

func init() {
	register(command{
		name:    "generate",
		summary: "continue a prompt with a local model and stream the text to stdout",
		run:     runGenerate,
	})
}

// generateOptions are the flags of `conveyor generate`.
type generateOptions struct {
	modelDir     string
	prompt       string
	maxTokens    int
	temperature  float64
	seed         uint64
	ortLib       string
	device       string
	cudaProvider string
	threads      int
	attention    string
	quantize     string
	speculative  string
}

func runGenerate(args []string) error {
	var o generateOptions
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.StringVar(&o.modelDir, "model", "", "model directory: model.onnx, config.json, tokenizer.json; or a Hugging Face checkpoint directory or a GGUF file (built to ONNX once, cached)")
	fs.StringVar(&o.prompt, "prompt", "", "text to continue")
	fs.IntVar(&o.maxTokens, "max-tokens", 64, "tokens to generate at most")
	fs.Float64Var(&o.temperature, "temperature", 0, "sampling temperature; 0 = greedy")
	fs.Uint64Var(&o.seed, "seed", 0, "sampling seed")
	fs.StringVar(&o.ortLib, "ort-lib", "", "ONNX Runtime library (default $"+models.ORTLibEnv+" or "+models.DefaultORTLib+")")
	deviceFlags(fs, &o.device, &o.cudaProvider)
	fs.IntVar(&o.threads, "threads", 0, "ONNX Runtime intra-op threads; 0 = all cores")
	fs.StringVar(&o.attention, "attention", "", attentionHelp)
	fs.StringVar(&o.quantize, "quantize", "", "with a Hugging Face checkpoint: build it with int8 or int4 weights")
	fs.StringVar(&o.speculative, "speculative-config", "", `speculative decoding, as serve's (vLLM's JSON, e.g. {"method": "ngram", "num_speculative_tokens": 4} or {"method": "draft_model", "model": DIR, "num_speculative_tokens": 4}); "" = off`)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: conveyor generate --model DIR --prompt TEXT [flags]\n\nflags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	promptSet := flagSet(fs, "prompt")
	switch {
	case o.modelDir == "":
		return errors.New("generate: --model is required")
	case o.maxTokens < 1:
		return fmt.Errorf("generate: --max-tokens %d must be at least 1", o.maxTokens)
	case o.temperature < 0 || math.IsNaN(o.temperature):
		return fmt.Errorf("generate: --temperature %v must be >= 0", o.temperature)
	case checkThreads(o.threads) != nil:
		return fmt.Errorf("generate: %w", checkThreads(o.threads))
	case checkAttention(o.attention) != nil:
		return fmt.Errorf("generate: %w", checkAttention(o.attention))
	case checkDevice(o.device) != nil:
		return fmt.Errorf("generate: %w", checkDevice(o.device))
	case !promptSet:
		return errors.New(`generate: --prompt is required (--prompt "" starts from nothing)`)
	}
	if _, err := parseSpeculativeConfig(o.speculative); err != nil {
		return fmt.Errorf("generate: %v", err)
	}
	ctx, stop := notifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, err := generate(ctx, o, os.Stdout, os.Stderr)
	return err
}

// generate runs the prompt and the continuation through the engine, streaming text to
// out and a summary line to info. It returns the generated token ids (an eos token
// included).
func generate(ctx context.Context, o generateOptions, out, info io.Writer) ([]int32, error) {
	sc, err := parseSpeculativeConfig(o.speculative)
	if err != nil {
		return nil, fmt.Errorf("generate: %v", err)
	}
	lo := loadOptions{
		quantize: o.quantize,
		runner: models.RunnerOptions{ORTLib: o.ortLib, IntraOpThreads: o.threads, Attention: o.attention,
			Device: o.device, CUDAProvider: o.cudaProvider},
		built: func(src, dir string, _ time.Duration) {
			fmt.Fprintf(info, "built the ONNX graph of %s in %s\n", src, dir)
		},
	}
	l, err := load(o.modelDir, lo)
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	r, tok := l.model, l.tok
	defer r.Close()
	draft, err := sc.loadDraft(l, lo)
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	if draft != nil {
		defer draft.Close()
	}
	spec := r.Spec()

	ids, err := tok.Encode(o.prompt, true)
	if err != nil {
		return nil, fmt.Errorf("generate: encode prompt: %w", err)
	}
	if len(ids) == 0 {
		return nil, errors.New("generate: the prompt encodes to no tokens (give --prompt text)")
	}
	if len(ids) >= spec.MaxPositions {
		return nil, fmt.Errorf("generate: the prompt has %d tokens; the model's context is %d", len(ids), spec.MaxPositions)
	}
	// One sequence through the engine: the same step loop, paged KV cache, sampler and
	// stop checks as the server, with a KV cache sized for this one sequence.
	ecfg := engine.DefaultConfig()
	ecfg.MaxNumSeqs = 1
	ecfg.EnablePrefixCaching = false
	ecfg.Speculation, ecfg.DraftModel = sc.Speculation, draft
	bs, err := spec.BlockSize(ecfg.BlockSizeTokens)
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	ecfg.MaxModelLen = min(len(ids)+o.maxTokens, spec.MaxPositions) // what the cache holds
	ecfg.KVCacheBytes = int64(ecfg.MaxModelLen+bs) * int64(spec.KVBytesPerToken())
	eng, err := engine.New(ecfg, r, tok)
	if err != nil {
		return nil, fmt.Errorf("generate: %w", inFlagTerms(err))
	}
	eng.Start(ctx)
	defer eng.Close()

	params := engine.DefaultSamplingParams()
	params.MaxTokens = o.maxTokens
	params.Temperature = float32(o.temperature)
	seed := int64(o.seed)
	params.Seed = &seed

	start := time.Now()
	events, err := eng.Submit(ctx, &engine.Request{ID: "generate", Prompt: ids, Params: params})
	if pe := (*engine.ParamError)(nil); errors.As(err, &pe) && pe.Param != "prompt" {
		// A request rule broken by a flag: named as the flag (max_tokens: --max-tokens).
		return nil, fmt.Errorf("generate: %s", pe.Named("--"+strings.ReplaceAll(pe.Param, "_", "-")))
	}
	if err != nil && ctx.Err() != nil {
		return nil, errors.New("generate: interrupted before the first token")
	}
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	var firstToken, finished time.Time
	var generated []int32
	var failure error
	var aborted bool
	for ev := range events {
		if !ev.Timings.FirstToken.IsZero() {
			firstToken = ev.Timings.FirstToken
		}
		if !ev.Timings.Finished.IsZero() {
			finished = ev.Timings.Finished
		}
		generated = append(generated, ev.TokenIDs...)
		if _, err := io.WriteString(out, ev.Text); err != nil {
			return nil, err
		}
		if ev.FinishReason == engine.FinishError {
			failure = ev.Err
		}
		aborted = aborted || ev.FinishReason == engine.FinishAbort
	}
	if failure != nil {
		return nil, fmt.Errorf("generate: %w", failure)
	}
	if aborted || ctx.Err() != nil {
		fmt.Fprintln(out)
		return nil, fmt.Errorf("generate: interrupted after %d generated tokens", len(generated))
	}
	if _, err := fmt.Fprintln(out); err != nil {
		return nil, err
	}
	decodeRate := 0.0
	if len(generated) > 1 && finished.After(firstToken) {
		decodeRate = float64(len(generated)-1) / finished.Sub(firstToken).Seconds()
	}
	specNote := ""
	if st := eng.Stats(); st.SpecDraftTokens > 0 {
		specNote = fmt.Sprintf("; %d of %d proposed tokens accepted", st.SpecAcceptedTokens, st.SpecDraftTokens)
	}
	fmt.Fprintf(info, "[%d prompt tokens, %d generated; first token %.0f ms, %.1f tokens/s after%s]\n",
		len(ids), len(generated), firstToken.Sub(start).Seconds()*1e3, decodeRate, specNote)
	return generated, nil
}
