package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"time"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/tokenizer"
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
	modelDir    string
	prompt      string
	maxTokens   int
	temperature float64
	seed        uint64
	ortLib      string
	threads     int
}

func runGenerate(args []string) error {
	var o generateOptions
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.StringVar(&o.modelDir, "model", "", "model directory (model.onnx, config.json, tokenizer.json)")
	fs.StringVar(&o.prompt, "prompt", "", "text to continue")
	fs.IntVar(&o.maxTokens, "max-tokens", 64, "tokens to generate at most")
	fs.Float64Var(&o.temperature, "temperature", 0, "sampling temperature; 0 = greedy")
	fs.Uint64Var(&o.seed, "seed", 0, "sampling seed")
	fs.StringVar(&o.ortLib, "ort-lib", "", "ONNX Runtime library (default $"+models.ORTLibEnv+" or "+models.DefaultORTLib+")")
	fs.IntVar(&o.threads, "threads", 0, "ONNX Runtime intra-op threads; 0 = all cores")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: conveyor generate --model DIR --prompt TEXT [flags]\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch {
	case o.modelDir == "":
		return errors.New("generate: --model is required")
	case o.maxTokens < 1:
		return fmt.Errorf("generate: --max-tokens %d must be at least 1", o.maxTokens)
	case o.temperature < 0 || math.IsNaN(o.temperature):
		return fmt.Errorf("generate: --temperature %v must be >= 0", o.temperature)
	case o.threads < 0:
		return fmt.Errorf("generate: --threads %d must be >= 0", o.threads)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	_, err := generate(ctx, o, os.Stdout, os.Stderr)
	return err
}

// generate runs the prompt and the continuation through the runner one sequence at a
// time, streaming text to out and a summary line to info. It returns the generated
// token ids (an eos token included).
func generate(ctx context.Context, o generateOptions, out, info io.Writer) ([]int32, error) {
	tok, err := tokenizer.Load(o.modelDir)
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	r, err := models.OpenRunner(o.modelDir, models.RunnerOptions{ORTLib: o.ortLib, IntraOpThreads: o.threads})
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	defer r.Close()
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
	eos := map[int32]bool{}
	for _, id := range append(spec.EOSTokenIDs, tok.EOS()...) {
		eos[id] = true
	}
	kv := newSeqKV(spec)
	rng := rand.New(rand.NewPCG(o.seed, 0x636f6e7665796f72))
	stream := tok.NewStream(true)
	probs := make([]float64, spec.VocabSize)

	start := time.Now()
	var firstToken time.Duration
	var generated []int32
	next := ids
	for len(generated) < o.maxTokens && kv.pastLen+len(next) <= spec.MaxPositions {
		if err := ctx.Err(); err != nil {
			break
		}
		kv.newTokens = len(next)
		res, err := r.Forward(&models.Batch{Seqs: []models.SeqInput{{Tokens: next, PastLen: kv.pastLen}}}, kv)
		if err != nil {
			return nil, fmt.Errorf("generate: %w", err)
		}
		kv.pastLen += len(next)
		id := sample(res.Logits[0], o.temperature, rng, probs)
		if len(generated) == 0 {
			firstToken = time.Since(start)
		}
		generated = append(generated, id)
		if eos[id] {
			break
		}
		if _, err := io.WriteString(out, stream.Add(id)); err != nil {
			return nil, err
		}
		next = []int32{id}
	}
	if _, err := fmt.Fprintln(out, stream.Flush()); err != nil {
		return nil, err
	}
	elapsed := time.Since(start)
	decodeRate := 0.0
	if len(generated) > 1 {
		decodeRate = float64(len(generated)-1) / (elapsed - firstToken).Seconds()
	}
	fmt.Fprintf(info, "[%d prompt tokens, %d generated; first token %.0f ms, %.1f tokens/s after]\n",
		len(ids), len(generated), firstToken.Seconds()*1e3, decodeRate)
	return generated, nil
}

// sample picks the next token: the argmax when temperature is 0, else a draw from
// softmax(logits / temperature). probs is scratch space of the vocabulary's size.
func sample(logits []float32, temperature float64, rng *rand.Rand, probs []float64) int32 {
	best := 0
	for i, x := range logits {
		if x > logits[best] {
			best = i
		}
	}
	if temperature == 0 {
		return int32(best)
	}
	top := float64(logits[best])
	sum := 0.0
	for i, x := range logits {
		probs[i] = math.Exp((float64(x) - top) / temperature)
		sum += probs[i]
	}
	u := rng.Float64() * sum
	for i, p := range probs[:len(logits)] {
		if u -= p; u < 0 {
			return int32(i)
		}
	}
	return int32(best)
}

// seqKV keeps one sequence's keys and values densely, per layer as [position][kvHead][headDim]
// elements of the model's KV type, for the single-sequence generate path.
type seqKV struct {
	spec      models.Spec
	k, v      [][]byte
	pastLen   int // positions stored
	newTokens int // tokens of the pass in flight
}

func newSeqKV(spec models.Spec) *seqKV {
	return &seqKV{spec: spec, k: make([][]byte, spec.NumLayers), v: make([][]byte, spec.NumLayers)}
}

// GatherPast copies the stored positions into row 0 of each dense past tensor.
func (s *seqKV) GatherPast(k, v []models.DenseKV) error {
	row := s.spec.HeadDim * s.spec.KVDType.Size() // bytes of one head at one position
	for l := range k {
		for kind, dst := range []models.DenseKV{k[l], v[l]} {
			src := s.k[l]
			if kind == 1 {
				src = s.v[l]
			}
			if dst.Batch != 1 || dst.Tokens < s.pastLen {
				return fmt.Errorf("unexpected past tensor %dx%dx%dx%d", dst.Batch, dst.KVHeads, dst.Tokens, dst.HeadDim)
			}
			clear(dst.Data)
			for h := 0; h < dst.KVHeads; h++ {
				for p := 0; p < s.pastLen; p++ {
					o := (h*dst.Tokens + p) * row
					copy(dst.Data[o:o+row], src[(p*dst.KVHeads+h)*row:])
				}
			}
		}
	}
	return nil
}

// ScatterNew appends the pass's new positions from row 0 of each present tensor.
func (s *seqKV) ScatterNew(k, v []models.DenseKV, newOffset int) error {
	row := s.spec.HeadDim * s.spec.KVDType.Size()
	for l := range k {
		for kind, src := range []models.DenseKV{k[l], v[l]} {
			dst := &s.k[l]
			if kind == 1 {
				dst = &s.v[l]
			}
			for j := 0; j < s.newTokens; j++ {
				for h := 0; h < src.KVHeads; h++ {
					o := (h*src.Tokens + newOffset + j) * row
					*dst = append(*dst, src.Data[o:o+row]...)
				}
			}
		}
	}
	return nil
}
