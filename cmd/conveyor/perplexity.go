package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

func init() {
	register(command{
		name:    "perplexity",
		summary: "measure a model's perplexity on a text file (one document per line)",
		run:     runPerplexity,
	})
}

func runPerplexity(args []string) error {
	fs := flag.NewFlagSet("perplexity", flag.ContinueOnError)
	modelDir := fs.String("model", "", "model directory, or a Hugging Face checkpoint (built once, cached)")
	file := fs.String("file", "", "text file, one document per line; each is encoded as <bos> text <eos> when the model has those tokens, and the documents are concatenated")
	context := fs.Int("context", 256, "window length: consecutive non-overlapping windows of context+1 tokens, each predicting its last context tokens")
	chunk := fs.Int("chunk", 64, "feed each window in prompt chunks of this many tokens (later chunks read the earlier ones from the KV cache); 0 = whole windows")
	maxWindows := fs.Int("max-windows", 0, "stop after this many windows; 0 = the whole file")
	attention := fs.String("attention", "", attentionHelp)
	kvDType := fs.String("kv-cache-dtype", models.KVCacheAuto, "KV cache element type: float32, float16 or auto (as serve: float16 for a checkpoint built for the CPU, a built directory's own type); a Hugging Face checkpoint is built with it, a built directory refuses any but its own")
	quantize := fs.String("quantize", "", "with a Hugging Face checkpoint: build it with int8 or int4 weights")
	ortLib := fs.String("ort-lib", "", "ONNX Runtime library (default $"+models.ORTLibEnv+" or "+models.DefaultORTLib+")")
	threads := fs.Int("threads", 0, "ONNX Runtime intra-op threads; 0 = all cores")
	var device, cudaProvider string
	deviceFlags(fs, &device, &cudaProvider)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: conveyor perplexity --model DIR --file TEXT [flags]\n\nflags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *modelDir == "" || *file == "" {
		return errors.New("perplexity: --model and --file are required")
	}
	switch {
	case *context < 1:
		return fmt.Errorf("perplexity: --context %d must be at least 1", *context)
	case *chunk < 0:
		return fmt.Errorf("perplexity: --chunk %d must be >= 0 (0 = whole windows)", *chunk)
	case *maxWindows < 0:
		return fmt.Errorf("perplexity: --max-windows %d must be >= 0 (0 = the whole file)", *maxWindows)
	case checkThreads(*threads) != nil:
		return fmt.Errorf("perplexity: %w", checkThreads(*threads))
	case checkAttention(*attention) != nil:
		return fmt.Errorf("perplexity: %w", checkAttention(*attention))
	case *kvDType != "" && *kvDType != models.KVCacheAuto && *kvDType != "float32" && *kvDType != "float16":
		return fmt.Errorf("perplexity: --kv-cache-dtype %q: want float32, float16 or auto", *kvDType)
	case checkDevice(device) != nil:
		return fmt.Errorf("perplexity: %w", checkDevice(device))
	}
	l, err := load(*modelDir, loadOptions{
		quantize: *quantize,
		runner: models.RunnerOptions{ORTLib: *ortLib, IntraOpThreads: *threads, Attention: *attention, KVCacheDType: *kvDType,
			Device: device, CUDAProvider: cudaProvider},
	})
	if err != nil {
		return fmt.Errorf("perplexity: %w", err)
	}
	m, tok := l.model, l.tok
	defer m.Close()
	stream, docs, err := encodeDocuments(tok, *file)
	if err != nil {
		return fmt.Errorf("perplexity: %w", err)
	}
	if docs == 0 {
		return fmt.Errorf("perplexity: %s holds no text (one document per line)", *file)
	}
	// The engine's own rules, in the flags' terms.
	if most := m.Spec().MaxPositions - 1; *context > most {
		return fmt.Errorf("perplexity: --context %d: the model's context takes windows of at most %d", *context, most)
	}
	if len(stream) < *context+1 {
		return fmt.Errorf("perplexity: %s has %d tokens, fewer than one window of --context %d + 1; give a longer file or a smaller --context", *file, len(stream), *context)
	}
	start := time.Now()
	res, err := engine.Perplexity(m, stream, engine.PerplexityOptions{Context: *context, ChunkTokens: *chunk, MaxWindows: *maxWindows})
	if err != nil {
		return fmt.Errorf("perplexity: %w", err)
	}
	fmt.Printf("model %s (attention %s, kv %s, weights %s): %d documents, %d tokens, %d windows of %d\n",
		*modelDir, m.Attention(), m.Spec().KVDType, l.quantization, docs, len(stream), res.Windows, *context)
	fmt.Printf("mean NLL %.4f  perplexity %.3f  (%d predicted tokens, %.1f s)\n", res.NLL, res.Perplexity, res.Tokens, time.Since(start).Seconds())
	return nil
}

// encodeDocuments encodes every non-empty line of path as bos + text + eos (each when
// the tokenizer has it) and concatenates them.
func encodeDocuments(tok *tokenizer.Tokenizer, path string) ([]int32, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	var stream []int32
	docs, n := 0, 0
	bos, hasBOS := tok.BOS()
	eos := tok.EOS()
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.TrimSpace(line) == "" { // blank lines separate documents, they are none
			continue
		}
		ids, err := tok.Encode(line, false)
		if err != nil {
			return nil, 0, fmt.Errorf("%s line %d: %w", path, n, err)
		}
		if hasBOS {
			stream = append(stream, bos)
		}
		stream = append(stream, ids...)
		if len(eos) > 0 {
			stream = append(stream, eos[0])
		}
		docs++
	}
	return stream, docs, sc.Err()
}
