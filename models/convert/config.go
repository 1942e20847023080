package convert

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/conveyor-llm/conveyor/models/modeldir"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ErrBadConfig marks a config.json or generation_config.json that cannot be parsed or
// describes an impossible model.
var ErrBadConfig = errors.New("convert: bad model config")

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
	// DTypeName is the same as TorchDType in the files of transformers 4.56 and later.
	DTypeName string `json:"dtype"`
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
	// Mixtures of experts, which the builder refuses.
	NumLocalExperts int `json:"num_local_experts"`
	NumExperts      int `json:"num_experts"`
	// AttnLogitSoftcapping bounds the scaled attention scores s to c*tanh(s/c) before
	// the mask, FinalLogitSoftcapping the logits likewise (Gemma 2, 3): null means none;
	// left out, the family's default applies (Gemma 2: 50 and 30).
	AttnLogitSoftcapping  *float64 `json:"attn_logit_softcapping"`
	FinalLogitSoftcapping *float64 `json:"final_logit_softcapping"`
	// QueryPreAttnScalar replaces head_dim in the attention scale 1/sqrt(head_dim)
	// (Gemma 2 and 3).
	QueryPreAttnScalar *float64 `json:"query_pre_attn_scalar"`
	// LayerTypes names every layer's attention, "full_attention" or
	// "sliding_attention" (transformers writes it since 4.53).
	LayerTypes []string `json:"layer_types"`
	// MaxWindowLayers is the first layer of Qwen2/Qwen3 with a sliding window when
	// use_sliding_window is set.
	MaxWindowLayers *int `json:"max_window_layers"`
	// SlidingWindowPattern makes every SlidingWindowPattern-th layer a full-attention
	// layer and the others sliding (Gemma 3, without layer_types).
	SlidingWindowPattern *int `json:"sliding_window_pattern"`
	// RopeLocalBaseFreq is the rotary base of Gemma 3's sliding layers.
	RopeLocalBaseFreq *float64 `json:"rope_local_base_freq"`
	// NoRopeLayers holds 1 for every layer with rotary embeddings and 0 for a layer
	// without (SmolLM3; the name reads the other way round); without it, every
	// NoRopeLayerInterval-th layer has none.
	NoRopeLayers        []int `json:"no_rope_layers"`
	NoRopeLayerInterval *int  `json:"no_rope_layer_interval"`

	// TextConfig is a multimodal wrapper's text model config (Gemma 3), which
	// LoadConfigFile reads in place of the wrapper's.
	TextConfig json.RawMessage `json:"text_config,omitempty"`

	// ropeFreqFactors, when set, divide the rotary's frequencies one by one: llama 3's
	// rope scaling as a GGUF file stores it (its rope_freqs tensor), which config.json
	// cannot say.
	ropeFreqFactors []float32
	// wrapper is the multimodal model_type whose text_config this config was read
	// from ("" for a text model's own config.json).
	wrapper string
	// raw holds config.json's fields as written, for the families that tell an absent
	// field (which takes transformers' default) from a null one; nil for a Config made
	// in code, whose nil fields read as absent.
	raw map[string]json.RawMessage
}

// isNull reports whether config.json set key to null (rather than leaving it out).
func (c *Config) isNull(key string) bool {
	v, ok := c.raw[key]
	return ok && strings.TrimSpace(string(v)) == "null"
}

// has reports whether config.json has key (null included).
func (c *Config) has(key string) bool {
	_, ok := c.raw[key]
	return ok
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

// MaxConfigSize bounds every size in config.json (vocab_size, hidden_size,
// intermediate_size, head counts, head_dim, max_position_embeddings) and MaxConfigLayers
// num_hidden_layers: far above any released model's (a vocabulary of 262,144, a hidden
// size of 18,432, a context of 10M), they refuse a mistyped size by name before anything
// is allocated, and keep every product of two sizes well inside an int64. The step
// graph stores a rotary cos and sin table of a row per position, which PagedAttention
// indexes by position: at the bound, 16M positions of a 128-wide head are 4 GiB a table.
const (
	MaxConfigSize   = 1 << 24
	MaxConfigLayers = 1 << 12
)

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
	case c.MaxPositionEmbeddings <= 0 && c.raw != nil && !c.has("max_position_embeddings"):
		// The step graph's rotary tables and the served context length come from it, and
		// transformers' defaults differ by family: config.json must say.
		return bad("max_position_embeddings is missing; it must give the model's context length")
	case c.MaxPositionEmbeddings <= 0:
		return bad("max_position_embeddings must be positive, got %d", c.MaxPositionEmbeddings)
	}
	for _, f := range []struct {
		name  string
		value int
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_attention_heads", c.NumAttentionHeads}, {"num_key_value_heads", c.NumKeyValueHeads}, {"head_dim", c.HeadDim},
		{"max_position_embeddings", c.MaxPositionEmbeddings}, {"num_hidden_layers", c.NumHiddenLayers},
	} {
		limit := MaxConfigSize
		if f.name == "num_hidden_layers" {
			limit = MaxConfigLayers
		}
		if f.value > limit {
			return bad("%s %d is above %d, the most Conveyor builds", f.name, f.value, limit)
		}
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
	if c.ModelType != "" && families[c.ModelType] == nil {
		return bad("model_type %q is not supported (supported: %s)", c.ModelType, strings.Join(supportedModelTypes(), ", "))
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

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	return LoadConfigFile(filepath.Join(dir, "config.json"))
}

// LoadConfigFile reads and validates a config.json at an explicit path.
func LoadConfigFile(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("models: read %s: %w", path, err)
	}
	c, err := parseConfig(b)
	if err == nil {
		err = c.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// parseConfig decodes a config.json: a multimodal wrapper's (see textModel) is read
// as its text_config, keeping the wrapper's token ids and dtype where the text config
// has none; the family's defaults fill the sizes it leaves out.
func parseConfig(b []byte) (*Config, error) {
	c, err := decodeConfig(b)
	if err != nil {
		return nil, err
	}
	if f := families[c.ModelType]; f != nil && f.text != nil {
		if len(c.TextConfig) == 0 || strings.TrimSpace(string(c.TextConfig)) == "null" {
			return nil, badConfig("model_type %q needs text_config", c.ModelType)
		}
		t, err := decodeConfig(c.TextConfig)
		if err != nil {
			return nil, fmt.Errorf("text_config: %w", err)
		}
		if t.ModelType != "" && t.ModelType != f.text.modelType {
			return nil, badConfig("text_config model_type %q, want %q", t.ModelType, f.text.modelType)
		}
		t.ModelType, t.wrapper = f.text.modelType, c.ModelType
		if t.BOSTokenID == nil {
			t.BOSTokenID = c.BOSTokenID
		}
		if t.EOSTokenID == nil {
			t.EOSTokenID = c.EOSTokenID
		}
		if t.TorchDType == "" {
			t.TorchDType = c.TorchDType
		}
		if t.DTypeName == "" {
			t.DTypeName = c.DTypeName
		}
		c = t
	}
	if f := families[c.ModelType]; f != nil && f.defaults != nil {
		f.defaults(c)
	}
	return c, nil
}

// decodeConfig decodes one config object, keeping its raw fields.
func decodeConfig(b []byte) (*Config, error) {
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, badConfig("%v", err)
	}
	if err := json.Unmarshal(b, &c.raw); err != nil {
		return nil, badConfig("%v", err)
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
