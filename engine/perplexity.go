package engine

import (
	"errors"
	"fmt"
	"math"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models"
)

// PerplexityOptions shape a Perplexity run.
type PerplexityOptions struct {
	// Context is the window length: the stream is cut into consecutive windows of
	// Context+1 tokens, and each window's last Context tokens are predicted from the
	// tokens before them in the window.
	Context int
	// ChunkTokens feeds each window in prompt chunks of this many tokens (0 = the
	// whole window at once), so later chunks read the earlier ones from the KV cache
	// as chunked prefill does in serving.
	ChunkTokens int
	// MaxWindows stops after this many windows (0 = all).
	MaxWindows int
	// BlockSizeTokens is the KV cache's block size (0 = the model's default, Spec.BlockSize).
	BlockSizeTokens int
}

// PerplexityResult is the mean next-token negative log-likelihood over the predicted
// tokens, and its exponential.
type PerplexityResult struct {
	Windows    int
	Tokens     int // predicted tokens
	NLL        float64
	Perplexity float64
}

// Perplexity runs model over the token stream window by window, as a training script's
// evaluation does (consecutive non-overlapping windows of Context+1 tokens), through a
// paged KV cache of the model's KV type, and returns the perplexity of the predicted
// tokens. Logits are turned into log-probabilities in float64.
func Perplexity(model models.Model, stream []int32, o PerplexityOptions) (PerplexityResult, error) {
	spec := model.Spec()
	if o.Context <= 0 || o.Context+1 > spec.MaxPositions {
		return PerplexityResult{}, fmt.Errorf("%w: perplexity context %d must be in [1, %d)", ErrInvalidConfig, o.Context, spec.MaxPositions)
	}
	if len(stream) < o.Context+1 {
		return PerplexityResult{}, fmt.Errorf("%w: %d tokens, fewer than one window of %d", ErrInvalidConfig, len(stream), o.Context+1)
	}
	chunk := o.ChunkTokens
	if chunk <= 0 || chunk > o.Context {
		chunk = o.Context
	}
	bs, err := spec.BlockSize(max(o.BlockSizeTokens, 0))
	if err != nil {
		return PerplexityResult{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	dt, err := kvDType(spec.KVDType)
	if err != nil {
		return PerplexityResult{}, err
	}
	blocks := (o.Context + bs - 1) / bs
	st, err := kvcache.NewStorage(kvcache.StorageConfig{NumBlocks: blocks, BlockSizeTokens: bs, Layers: spec.NumLayers,
		KVHeads: spec.NumKVHeads, HeadDim: spec.HeadDim, DType: dt, TokenMajor: spec.KVTokenMajor, NoArenas: spec.KVOnDevice})
	if err != nil {
		return PerplexityResult{}, err
	}
	defer st.Close()
	table := make([]kvcache.BlockID, blocks)
	for i := range table {
		table[i] = kvcache.BlockID(i)
	}
	vocab := spec.VocabSize
	windows := (len(stream) - 1) / o.Context
	if o.MaxWindows > 0 {
		windows = min(windows, o.MaxWindows)
	}
	var res PerplexityResult
	for w := 0; w < windows; w++ {
		win := stream[w*o.Context : w*o.Context+o.Context+1]
		for start := 0; start < o.Context; start += chunk {
			toks := win[start:min(start+chunk, o.Context)]
			row := models.SeqInput{Tokens: toks, PastLen: start, Blocks: table, AllLogits: true}
			out, err := model.Forward(&models.Batch{Seqs: []models.SeqInput{row}, Cache: st})
			if err != nil {
				return PerplexityResult{}, err
			}
			if len(out.Logits) != 1 || len(out.Logits[0]) != len(toks)*vocab {
				return PerplexityResult{}, errors.New("engine: perplexity: the model returned the wrong number of logits")
			}
			for j := range toks {
				res.NLL += nll(out.Logits[0][j*vocab:(j+1)*vocab], win[start+j+1])
				res.Tokens++
			}
		}
		res.Windows++
	}
	res.NLL /= float64(res.Tokens)
	res.Perplexity = math.Exp(res.NLL)
	return res, nil
}

// nll returns -log softmax(logits)[target], in float64.
func nll(logits []float32, target int32) float64 {
	m := math.Inf(-1)
	for _, v := range logits {
		m = math.Max(m, float64(v))
	}
	sum := 0.0
	for _, v := range logits {
		sum += math.Exp(float64(v) - m)
	}
	return m + math.Log(sum) - float64(logits[target])
}
