package convert

import (
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

func familyTestConfig(modelType string) *Config {
	return &Config{ModelType: modelType, VocabSize: 64, HiddenSize: 32, IntermediateSize: 48,
		NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, MaxPositionEmbeddings: 128}
}

// TestArchRefusals checks that what the graphs do not compute is refused at build time
// with a message naming the config.json field and its value.
func TestArchRefusals(t *testing.T) {
	yes, four, cap := true, 4, 30.0
	for _, tc := range []struct {
		name, modelType string
		modify          func(*Config)
		want            []string // substrings of the error
	}{
		{"unknown rope type", "llama", func(c *Config) { c.RopeScaling = json.RawMessage(`{"rope_type":"yarn","factor":4}`) }, []string{"rope_scaling", `"yarn"`}},
		{"longrope factors", "phi3", func(c *Config) {
			c.RopeScaling = json.RawMessage(`{"type":"longrope","short_factor":[1],"long_factor":[2]}`)
		}, []string{"longrope", "short_factor and long_factor have 1 and 1 values, want 4"}},
		{"dynamic", "llama", func(c *Config) { c.RopeScaling = json.RawMessage(`{"type":"dynamic","factor":2}`) }, []string{"rope_scaling", `"dynamic"`}},
		{"malformed rope_scaling", "llama", func(c *Config) { c.RopeScaling = json.RawMessage(`[1,2]`) }, []string{"rope_scaling", "[1,2]"}},
		{"linear without factor", "llama", func(c *Config) { c.RopeScaling = json.RawMessage(`{"type":"linear"}`) }, []string{"factor"}},
		{"llama3 bad bands", "llama", func(c *Config) {
			c.RopeScaling = json.RawMessage(`{"rope_type":"llama3","factor":8,"low_freq_factor":4,"high_freq_factor":1,"original_max_position_embeddings":8192}`)
		}, []string{"llama3", "low_freq_factor 4"}},
		{"qwen2 layer_types", "qwen2", func(c *Config) {
			c.UseSlidingWindow = &yes
			c.SlidingWindow = &four
			c.LayerTypes = []string{"full_attention", "chunked_attention"}
		}, []string{"layer_types[1]", `"chunked_attention"`}},
		{"mixture of experts", "qwen2", func(c *Config) { c.NumExperts = 8 }, []string{"num_experts", "8"}},
		{"mlp bias", "llama", func(c *Config) { c.MLPBias = true }, []string{"mlp_bias"}},
		{"attention bias", "llama", func(c *Config) { c.AttentionBias = true }, []string{"attention_bias"}},
		{"activation", "llama", func(c *Config) { c.HiddenAct = "relu" }, []string{"hidden_act", `"relu"`}},
		{"softcapping", "gemma", func(c *Config) { c.FinalLogitSoftcapping = &cap }, []string{"softcapping"}},
		{"zero window", "mistral", func(c *Config) { zero := 0; c.SlidingWindow = &zero }, []string{"sliding_window 0"}},
		{"odd partial rotary", "phi3", func(c *Config) { c.PartialRotaryFactor = 0.4 }, []string{"partial_rotary_factor 0.4", "odd rotary size 3"}},
		{"gemma2 without head_dim", "gemma2", func(c *Config) {}, []string{"head_dim", `"gemma2"`}},
		{"mixtral", "mixtral", func(c *Config) {}, []string{"model_type", `"mixtral"`}},
	} {
		c := familyTestConfig(tc.modelType)
		tc.modify(c)
		err := c.Validate()
		if err == nil {
			_, err = WeightShapes(c)
		}
		checkBadConfig(t, tc.name, err, tc.want)
	}
}

// checkBadConfig requires err to be an ErrBadConfig that mentions every string of want.
func checkBadConfig(t *testing.T, name string, err error, want []string) {
	t.Helper()
	if !errors.Is(err, ErrBadConfig) {
		t.Errorf("%s: want ErrBadConfig, got %v", name, err)
		return
	}
	for _, s := range want {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: error %q does not mention %q", name, err, s)
		}
	}
}

// TestCheckWeightsByFamily checks the tensors each family must have and must not have.
func TestCheckWeightsByFamily(t *testing.T) {
	for _, tc := range []struct {
		modelType string
		edit      func(w Weights)
		want      string // "" = accepted
	}{
		{"qwen2", func(w Weights) {}, ""},
		{"qwen2", func(w Weights) { delete(w, "model.layers.1.self_attn.k_proj.bias") }, "k_proj.bias is missing"},
		{"llama", func(w Weights) {
			w["model.layers.0.self_attn.q_proj.bias"] = &Tensor{Shape: []int{32}, Data: make([]float32, 32)}
		}, "q_proj.bias is a bias"},
		{"qwen3", func(w Weights) {}, ""},
		{"qwen3", func(w Weights) { delete(w, "model.layers.0.self_attn.q_norm.weight") }, "q_norm.weight is missing"},
		{"llama", func(w Weights) {
			w["model.layers.0.self_attn.q_norm.weight"] = &Tensor{Shape: []int{8}, Data: make([]float32, 8)}
		}, "not part of a model_type"},
		{"phi3", func(w Weights) {}, ""},
		{"phi3", func(w Weights) {
			w["model.layers.0.mlp.gate_up_proj.weight"].Shape = []int{48, 32}
		}, "gate_up_proj.weight has shape [48 32]"},
		{"llama", func(w Weights) { w["model.layers.0.self_attn.rotary_emb.inv_freq"] = &Tensor{Shape: []int{4}} }, ""},
	} {
		cfg := familyTestConfig(tc.modelType)
		cfg.TieWordEmbeddings = true
		w := RandomWeights(cfg, 1)
		tc.edit(w)
		_, err := planModel(cfg, w, Quantization{})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tc.modelType, err)
		case tc.want != "" && (!errors.Is(err, ErrBadWeights) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: want ErrBadWeights mentioning %q, got %v", tc.modelType, tc.want, err)
		}
	}
}

// TestPhi3SplitSharesMemory checks that the fused Phi-3 projections are split into
// views of the checkpoint's memory, in the order q, k, v and gate, up.
func TestPhi3SplitSharesMemory(t *testing.T) {
	cfg := familyTestConfig("phi3")
	w := RandomWeights(cfg, 2)
	m, err := planModel(cfg, w, Quantization{})
	if err != nil {
		t.Fatal(err)
	}
	fused := w["model.layers.1.self_attn.qkv_proj.weight"].Data
	k := m.w["model.layers.1.self_attn.k_proj.weight"].Data
	if &k[0] != &fused[4*8*32] || len(k) != 2*8*32 {
		t.Errorf("k_proj is not rows [32,48) of qkv_proj")
	}
	up := m.w["model.layers.1.mlp.up_proj.weight"].Data
	gu := w["model.layers.1.mlp.gate_up_proj.weight"].Data
	if &up[0] != &gu[48*32] || cap(up) != len(up) {
		t.Errorf("up_proj is not the second half of gate_up_proj")
	}
	if _, ok := m.w["model.layers.1.mlp.gate_up_proj.weight"]; ok {
		t.Errorf("the fused tensor is still in the plan's weights")
	}
}

// TestLlama3Frequencies checks the three bands of llama3 rope scaling on Llama 3.1's
// own parameters: the fastest frequency is kept, the slowest divided by the factor, and
// the ones between interpolated, strictly between the two.
func TestLlama3Frequencies(t *testing.T) {
	cfg := familyTestConfig("llama")
	cfg.HiddenSize, cfg.NumAttentionHeads, cfg.NumKeyValueHeads = 4096, 32, 8
	cfg.RopeTheta = 500000
	plain, err := rotaryOf(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RopeScaling = json.RawMessage(`{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192,"rope_type":"llama3"}`)
	scaled, err := rotaryOf(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var kept, divided, between int
	for j, f := range plain.invFreq {
		g := scaled.invFreq[j]
		wavelen := 2 * math.Pi / float64(f)
		switch {
		case wavelen < 8192/4.0:
			if g != f {
				t.Errorf("high frequency %d changed: %g -> %g", j, f, g)
			}
			kept++
		case wavelen > 8192:
			if math.Abs(float64(g)-float64(f/8)) > 1e-6*float64(f) {
				t.Errorf("low frequency %d: got %g, want %g", j, g, f/8)
			}
			divided++
		default:
			if !(g < f && g > f/8) {
				t.Errorf("medium frequency %d: %g not strictly between %g and %g", j, g, f/8, f)
			}
			between++
		}
	}
	if kept == 0 || divided == 0 || between == 0 {
		t.Errorf("bands kept %d, divided %d, between %d: each should be non-empty", kept, divided, between)
	}
}

// TestWriteRandomCheckpoint writes a bfloat16 Qwen2 checkpoint and reads it back: the
// tensors are the family's (biases included), rounded to bfloat16, and BuildFromHF
// takes the directory as it would a downloaded one.
func TestWriteRandomCheckpoint(t *testing.T) {
	src := t.TempDir()
	cfg := `{"model_type":"qwen2","vocab_size":64,"hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,
		"num_attention_heads":4,"num_key_value_heads":2,"tie_word_embeddings":true,"torch_dtype":"bfloat16","max_position_embeddings":128}`
	writeTestFile(t, src, "config.json", cfg)
	hf := filepath.Join(t.TempDir(), "hf")
	if _, err := WriteRandomCheckpoint(filepath.Join(src, "config.json"), hf, 4); err != nil {
		t.Fatal(err)
	}
	got, err := LoadSafetensorsDir(hf)
	if err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(hf)
	if err != nil {
		t.Fatal(err)
	}
	want := RandomWeights(c, 4)
	if len(got) != len(want) || got["model.layers.1.self_attn.v_proj.bias"] == nil {
		t.Fatalf("read %d tensors, want %d with q/k/v biases", len(got), len(want))
	}
	for name, w := range want {
		for i, v := range w.Data {
			if r := math.Float32frombits(uint32(float32ToBF16(v)) << 16); got[name].Data[i] != r {
				t.Fatalf("%s[%d] = %g, want %g (bfloat16 of %g)", name, i, got[name].Data[i], r, v)
			}
		}
	}
	if _, err := BuildFromHF(hf, t.TempDir(), Options{}); err != nil {
		t.Fatalf("BuildFromHF: %v", err)
	}
	writeTestFile(t, src, "config.json", strings.Replace(cfg, "bfloat16", "int8", 1))
	if _, err := WriteRandomCheckpoint(filepath.Join(src, "config.json"), hf, 4); err == nil || !strings.Contains(err.Error(), `torch_dtype "int8"`) {
		t.Errorf("torch_dtype int8: got %v", err)
	}
}
