package build

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/conveyor-llm/conveyor/models/modeldir"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// ErrBadConfig marks a config.json or generation_config.json that cannot be parsed or
// describes an impossible model.
var ErrBadConfig = errors.New("build: bad model config")

// Config is a model's config.json: the Hugging Face Llama-family fields Conveyor uses.
type Config struct {
	Architectures         []string `json:"architectures"`
	ModelType             string   `json:"model_type"`
	VocabSize             int      `json:"vocab_size"`
	HiddenSize            int      `json:"hidden_size"`
	IntermediateSize      int      `json:"intermediate_size"`
	NumHiddenLayers       int      `json:"num_hidden_layers"`
	NumAttentionHeads     int      `json:"num_attention_heads"`
	NumKeyValueHeads      int      `json:"num_key_value_heads"` // 0 means NumAttentionHeads (no GQA)
	HeadDim               int      `json:"head_dim"`            // 0 means HiddenSize / NumAttentionHeads
	RMSNormEps            float64  `json:"rms_norm_eps"`
	RopeTheta             float64  `json:"rope_theta"` // 0 means 10000
	MaxPositionEmbeddings int      `json:"max_position_embeddings"`
	TieWordEmbeddings     bool     `json:"tie_word_embeddings"`
	// BOSTokenID is the beginning-of-sequence token, nil when the model has none.
	BOSTokenID *int32 `json:"bos_token_id"`
	// EOSTokenID lists the end-of-sequence tokens (JSON: an integer or a list).
	EOSTokenID modeldir.TokenIDs `json:"eos_token_id"`
	TorchDType string            `json:"torch_dtype"`
	// HiddenAct is the MLP activation; Llama uses "silu".
	HiddenAct string `json:"hidden_act"`
	// HiddenActivation is Gemma's name for the MLP activation (it wins over HiddenAct).
	HiddenActivation string `json:"hidden_activation"`
	// RopeScaling is kept raw: the graph builder parses the scalings it implements
	// (see RopeScalingParams) and refuses the others by name.
	RopeScaling   json.RawMessage `json:"rope_scaling"`
	AttentionBias bool            `json:"attention_bias"`
	MLPBias       bool            `json:"mlp_bias"`
	// SlidingWindow limits attention to the last SlidingWindow positions (Mistral,
	// Phi-3); nil means none. Qwen2 and Qwen3 use it only with UseSlidingWindow.
	SlidingWindow    *int  `json:"sliding_window"`
	UseSlidingWindow *bool `json:"use_sliding_window"`
	// OriginalMaxPositionEmbeddings is the pretraining context of a model whose
	// max_position_embeddings was extended by longrope (Phi-3 puts it at top level).
	OriginalMaxPositionEmbeddings int `json:"original_max_position_embeddings"`
	// PartialRotaryFactor is the share of each head that rotary embeddings turn (Phi);
	// 0 means all of it.
	PartialRotaryFactor float64 `json:"partial_rotary_factor"`
	// Fields of architectures the builder refuses (mixtures of experts, soft-capping).
	NumLocalExperts       int      `json:"num_local_experts"`
	NumExperts            int      `json:"num_experts"`
	AttnLogitSoftcapping  *float64 `json:"attn_logit_softcapping"`
	FinalLogitSoftcapping *float64 `json:"final_logit_softcapping"`
}

// DefaultRopeTheta is the rotary base Llama uses when config.json gives none.
const DefaultRopeTheta = 10000.0

// DefaultRMSNormEps is the RMSNorm epsilon used when config.json gives none.
const DefaultRMSNormEps = 1e-6

// KVHeads returns the number of key/value heads (NumKeyValueHeads, or
// NumAttentionHeads when that is 0).
func (c *Config) KVHeads() int {
	if c.NumKeyValueHeads > 0 {
		return c.NumKeyValueHeads
	}
	return c.NumAttentionHeads
}

// HeadDimOrDefault returns the attention head size: HeadDim, or HiddenSize /
// NumAttentionHeads when HeadDim is 0.
func (c *Config) HeadDimOrDefault() int {
	if c.HeadDim > 0 {
		return c.HeadDim
	}
	if c.NumAttentionHeads <= 0 {
		return 0
	}
	return c.HiddenSize / c.NumAttentionHeads
}

// Theta returns the rotary base (RopeTheta, or DefaultRopeTheta when unset).
func (c *Config) Theta() float64 {
	if c.RopeTheta > 0 {
		return c.RopeTheta
	}
	return DefaultRopeTheta
}

// Eps returns the RMSNorm epsilon (RMSNormEps, or DefaultRMSNormEps when unset).
func (c *Config) Eps() float64 {
	if c.RMSNormEps > 0 {
		return c.RMSNormEps
	}
	return DefaultRMSNormEps
}

// BOS returns the beginning-of-sequence token id and whether the model has one.
func (c *Config) BOS() (int32, bool) {
	if c.BOSTokenID == nil {
		return 0, false
	}
	return *c.BOSTokenID, true
}

// NumParams returns the number of weights a checkpoint with this config holds.
func (c *Config) NumParams() int64 {
	shapes, err := WeightShapes(c)
	if err != nil {
		return 0
	}
	var n int64
	for _, s := range shapes {
		p := int64(1)
		for _, d := range s {
			p *= int64(d)
		}
		n += p
	}
	return n
}

// Validate reports the first thing that makes the config unusable for a Llama-family
// decoder. Errors wrap ErrBadConfig.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.VocabSize <= 0:
		return bad("vocab_size must be positive, got %d", c.VocabSize)
	case c.HiddenSize <= 0:
		return bad("hidden_size must be positive, got %d", c.HiddenSize)
	case c.IntermediateSize <= 0:
		return bad("intermediate_size must be positive, got %d", c.IntermediateSize)
	case c.NumHiddenLayers <= 0:
		return bad("num_hidden_layers must be positive, got %d", c.NumHiddenLayers)
	case c.NumAttentionHeads <= 0:
		return bad("num_attention_heads must be positive, got %d", c.NumAttentionHeads)
	case c.NumKeyValueHeads < 0:
		return bad("num_key_value_heads must not be negative, got %d", c.NumKeyValueHeads)
	case c.HeadDim < 0:
		return bad("head_dim must not be negative, got %d", c.HeadDim)
	case c.RMSNormEps < 0:
		return bad("rms_norm_eps must not be negative, got %g", c.RMSNormEps)
	case c.RopeTheta < 0:
		return bad("rope_theta must not be negative, got %g", c.RopeTheta)
	case c.MaxPositionEmbeddings < 0:
		return bad("max_position_embeddings must not be negative, got %d", c.MaxPositionEmbeddings)
	}
	if c.HeadDim == 0 && c.HiddenSize%c.NumAttentionHeads != 0 {
		return bad("num_attention_heads (%d) does not divide hidden_size (%d); set head_dim explicitly", c.NumAttentionHeads, c.HiddenSize)
	}
	if c.NumAttentionHeads%c.KVHeads() != 0 {
		return bad("num_key_value_heads (%d) does not divide num_attention_heads (%d)", c.KVHeads(), c.NumAttentionHeads)
	}
	if d := c.HeadDimOrDefault(); d%2 != 0 {
		return bad("head size %d is odd; rotary embeddings need an even head size", d)
	}
	if c.ModelType != "" && !supportedModelType(c.ModelType) {
		return bad("model_type %q is not supported (supported: %s)", c.ModelType, strings.Join(supportedModelTypes, ", "))
	}
	if c.BOSTokenID != nil && (*c.BOSTokenID < 0 || int(*c.BOSTokenID) >= c.VocabSize) {
		return bad("bos_token_id %d is outside the vocabulary [0,%d)", *c.BOSTokenID, c.VocabSize)
	}
	for _, id := range c.EOSTokenID {
		if id < 0 || int(id) >= c.VocabSize {
			return bad("eos_token_id %d is outside the vocabulary [0,%d)", id, c.VocabSize)
		}
	}
	return nil
}

// supportedModelTypes are the config.json model_type values the builder implements.
var supportedModelTypes = []string{"llama", "mistral", "qwen2", "qwen3", "gemma", "phi3"}

func supportedModelType(t string) bool { return slices.Contains(supportedModelTypes, t) }

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	var c Config
	if err := readJSONFile(path, &c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

// LoadConfigFile reads and validates a config.json at an explicit path.
func LoadConfigFile(path string) (*Config, error) {
	var c Config
	if err := readJSONFile(path, &c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

// readJSONFile decodes path into v. Errors name the file; a missing file's error wraps
// fs.ErrNotExist; malformed JSON wraps ErrBadConfig.
func readJSONFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("models: read %s: %w", path, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadConfig, path, err)
	}
	return nil
}

// sortedKeys returns m's keys in sorted order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// truncateForError shortens b for inclusion in an error message.
func truncateForError(b []byte) string {
	const max = 40
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}
