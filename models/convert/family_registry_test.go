package convert

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models/kernels"
	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// registryTestConfig is familyTestConfig with what Gemma 2 and 3 require (head_dim).
func registryTestConfig(modelType string) *Config {
	c := familyTestConfig(modelType)
	c.HeadDim = 8
	c.NumHiddenLayers = 4
	c.MaxPositionEmbeddings = 128
	return c
}

// TestRegistry checks that the model types config.json may name are exactly the
// registered ones, that each resolves and builds a plan from its own tensors, and that
// Validate lists them when refusing another.
func TestRegistry(t *testing.T) {
	types := supportedModelTypes()
	if len(types) == 0 {
		t.Fatal("no families registered")
	}
	for _, mt := range types {
		if families[mt].text != nil {
			continue // a wrapper: TestTextConfig
		}
		cfg := registryTestConfig(mt)
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", mt, err)
			continue
		}
		if _, err := planModel(cfg, RandomWeights(cfg, 1), Quantization{}); err != nil {
			t.Errorf("%s: %v", mt, err)
		}
	}
	err := registryTestConfig("gpt_neox").Validate()
	if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), strings.Join(types, ", ")) {
		t.Errorf("unknown model_type: got %v, want the registered types listed", err)
	}
}

// layerPlan is what a test expects of a resolved arch, layer by layer.
type layerPlan struct {
	windows      []int
	rotaryDims   []int     // 0 = no rotary
	theta0       []float64 // per layer: 1/invFreq[0]^... the base implied by invFreq[1] (0 when no rotary)
	attnSoftcap  float32
	finalSoftcap float32
	queryScale   float32
}

// thetaOf recovers the rotary base from a plan's second inverse frequency:
// invFreq[1] = theta^(-2/dims).
func thetaOf(r *rotaryPlan) float64 {
	if r.dims == 0 {
		return 0
	}
	return math.Round(math.Pow(float64(r.invFreq[1]), -float64(r.dims)/2))
}

// TestLayerParameters checks how each family reads its per-layer fields: which layers
// slide and by how much, which have rotary and with which base, soft-caps and the
// attention scale, with transformers' defaults when config.json leaves a field out.
func TestLayerParameters(t *testing.T) {
	yes, no, one, four, sixteen := true, false, 1, 4, 16.0
	d := float32(1 / math.Sqrt(8))
	for _, tc := range []struct {
		name      string
		modelType string
		edit      func(c *Config)
		want      layerPlan
	}{
		{"llama", "llama", func(c *Config) {}, layerPlan{
			windows: []int{0, 0, 0, 0}, rotaryDims: []int{8, 8, 8, 8}, theta0: []float64{1e4, 1e4, 1e4, 1e4}, queryScale: d}},
		{"qwen2 use_sliding_window, max_window_layers 1", "qwen2", func(c *Config) {
			c.UseSlidingWindow, c.SlidingWindow, c.MaxWindowLayers = &yes, &four, &one
		}, layerPlan{windows: []int{0, 4, 4, 4}, rotaryDims: []int{8, 8, 8, 8}, theta0: []float64{1e4, 1e4, 1e4, 1e4}, queryScale: d}},
		{"qwen2 use_sliding_window, default max_window_layers 28", "qwen2", func(c *Config) {
			c.UseSlidingWindow, c.SlidingWindow = &yes, &four
		}, layerPlan{windows: []int{0, 0, 0, 0}, rotaryDims: []int{8, 8, 8, 8}, theta0: []float64{1e4, 1e4, 1e4, 1e4}, queryScale: d}},
		{"qwen3 without use_sliding_window ignores layer_types", "qwen3", func(c *Config) {
			c.UseSlidingWindow, c.SlidingWindow = &no, &four
			c.LayerTypes = []string{"sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention"}
		}, layerPlan{windows: []int{0, 0, 0, 0}, rotaryDims: []int{8, 8, 8, 8}, theta0: []float64{1e4, 1e4, 1e4, 1e4}, queryScale: d}},
		{"qwen3 layer_types", "qwen3", func(c *Config) {
			c.UseSlidingWindow, c.SlidingWindow, c.MaxWindowLayers = &yes, &four, &one
			c.LayerTypes = []string{"sliding_attention", "full_attention", "full_attention", "sliding_attention"}
		}, layerPlan{windows: []int{4, 0, 0, 4}, rotaryDims: []int{8, 8, 8, 8}, theta0: []float64{1e4, 1e4, 1e4, 1e4}, queryScale: d}},
		{"gemma2 defaults", "gemma2", func(c *Config) {}, layerPlan{
			windows: []int{4096, 0, 4096, 0}, rotaryDims: []int{8, 8, 8, 8}, theta0: []float64{1e4, 1e4, 1e4, 1e4},
			attnSoftcap: 50, finalSoftcap: 30, queryScale: float32(1 / math.Sqrt(256))}},
		{"gemma2 fields", "gemma2", func(c *Config) {
			c.SlidingWindow, c.QueryPreAttnScalar = &four, &sixteen
			cap := 20.0
			c.AttnLogitSoftcapping, c.FinalLogitSoftcapping = &cap, &cap
		}, layerPlan{windows: []int{4, 0, 4, 0}, rotaryDims: []int{8, 8, 8, 8}, theta0: []float64{1e4, 1e4, 1e4, 1e4},
			attnSoftcap: 20, finalSoftcap: 20, queryScale: 0.25}},
		{"gemma3 defaults", "gemma3_text", func(c *Config) { c.NumHiddenLayers = 7 }, layerPlan{
			windows: []int{4096, 4096, 4096, 4096, 4096, 0, 4096}, rotaryDims: []int{8, 8, 8, 8, 8, 8, 8},
			theta0: []float64{1e4, 1e4, 1e4, 1e4, 1e4, 1e6, 1e4}, queryScale: float32(1 / math.Sqrt(256))}},
		{"gemma3 pattern and local base", "gemma3_text", func(c *Config) {
			two, base := 2, 500.0
			c.SlidingWindowPattern, c.RopeLocalBaseFreq, c.SlidingWindow, c.RopeTheta = &two, &base, &four, 2e5
		}, layerPlan{windows: []int{4, 0, 4, 0}, rotaryDims: []int{8, 8, 8, 8}, theta0: []float64{500, 2e5, 500, 2e5},
			queryScale: float32(1 / math.Sqrt(256))}},
		{"smollm3 default interval", "smollm3", func(c *Config) {}, layerPlan{
			windows: []int{0, 0, 0, 0}, rotaryDims: []int{8, 8, 8, 0}, theta0: []float64{1e4, 1e4, 1e4, 0}, queryScale: d}},
		{"smollm3 no_rope_layers and sliding NoPE layers", "smollm3", func(c *Config) {
			c.NoRopeLayers = []int{0, 1, 0, 1}
			c.UseSlidingWindow, c.SlidingWindow = &yes, &four
		}, layerPlan{windows: []int{4, 0, 4, 0}, rotaryDims: []int{0, 8, 0, 8}, theta0: []float64{0, 1e4, 0, 1e4}, queryScale: d}},
	} {
		cfg := registryTestConfig(tc.modelType)
		tc.edit(cfg)
		a, err := archOf(cfg)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		got := layerPlan{windows: a.window, attnSoftcap: a.attnSoftcap, finalSoftcap: a.finalSoftcap, queryScale: a.queryScale}
		for _, r := range a.rotary {
			got.rotaryDims = append(got.rotaryDims, r.dims)
			got.theta0 = append(got.theta0, thetaOf(r))
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

// TestNullSoftcapIsNone checks that config.json's null soft-cap turns it off while an
// absent one takes Gemma2Config's default, and that a null sliding_window with sliding
// layers is refused.
func TestNullSoftcapIsNone(t *testing.T) {
	dir := t.TempDir()
	base := `{"model_type":"gemma2","vocab_size":64,"hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,
		"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,"max_position_embeddings":128%s}`
	for _, tc := range []struct {
		extra       string
		attn, final float32
		err         string
	}{
		{"", 50, 30, ""},
		{`,"attn_logit_softcapping":null,"final_logit_softcapping":null`, 0, 0, ""},
		{`,"attn_logit_softcapping":null`, 0, 30, ""},
		{`,"sliding_window":null`, 0, 0, "sliding_window 0 must be positive for sliding layer 0"},
		{`,"final_logit_softcapping":-1`, 0, 0, "final_logit_softcapping -1"},
	} {
		writeTestFile(t, dir, "config.json", strings.Replace(base, "%s", tc.extra, 1))
		cfg, err := LoadConfig(dir)
		if err != nil {
			t.Fatal(err)
		}
		a, err := archOf(cfg)
		switch {
		case tc.err != "":
			if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: got %v, want an error mentioning %q", tc.extra, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.extra, err)
		case a.attnSoftcap != tc.attn || a.finalSoftcap != tc.final:
			t.Errorf("%s: soft-caps %g, %g; want %g, %g", tc.extra, a.attnSoftcap, a.finalSoftcap, tc.attn, tc.final)
		}
	}
}

// TestNewFamilyRefusals checks what the families with per-layer fields refuse, by field
// and value.
func TestNewFamilyRefusals(t *testing.T) {
	zero := 0.0
	for _, tc := range []struct {
		name, modelType string
		edit            func(*Config)
		want            []string
	}{
		{"gemma2 without head_dim", "gemma2", func(c *Config) { c.HeadDim = 0 }, []string{"head_dim", `"gemma2"`}},
		{"layer_types length", "gemma2", func(c *Config) { c.LayerTypes = []string{"full_attention"} }, []string{"layer_types has 1 entries for 4 layers"}},
		{"query_pre_attn_scalar", "gemma3_text", func(c *Config) { c.QueryPreAttnScalar = &zero }, []string{"query_pre_attn_scalar 0"}},
		{"rope_local_base_freq", "gemma3_text", func(c *Config) { c.RopeLocalBaseFreq = &zero }, []string{"rope_local_base_freq 0"}},
		{"no_rope_layers value", "smollm3", func(c *Config) { c.NoRopeLayers = []int{1, 2, 1, 1} }, []string{"no_rope_layers[1] 2"}},
		{"no_rope_layers length", "smollm3", func(c *Config) { c.NoRopeLayers = []int{1, 0} }, []string{"no_rope_layers has 2 entries for 4 layers"}},
		{"smollm3 sliding layer without use_sliding_window", "smollm3", func(c *Config) {
			c.LayerTypes = []string{"full_attention", "sliding_attention", "full_attention", "full_attention"}
		}, []string{"layer_types[1] sliding_attention without use_sliding_window"}},
		{"softcap on llama", "llama", func(c *Config) { cap := 30.0; c.AttnLogitSoftcapping = &cap }, []string{"attn_logit_softcapping", `"llama"`}},
	} {
		cfg := registryTestConfig(tc.modelType)
		tc.edit(cfg)
		_, err := WeightShapes(cfg)
		checkBadConfig(t, tc.name, err, tc.want)
	}
}

// TestStepGraphLayers checks that every layer's PagedAttention node carries the layer's
// own attention: Gemma 3's windows and two rotary bases, Gemma 2's soft-cap, SmolLM3's
// layers without rotary; that the manifest records the windows and the layer groups they
// make (kvcache.PlanLayout), and that each node reads its group's block table.
func TestStepGraphLayers(t *testing.T) {
	four := 4
	g3 := registryTestConfig("gemma3_text")
	g3.SlidingWindow = &four
	g2 := registryTestConfig("gemma2")
	sm := registryTestConfig("smollm3")
	for _, cfg := range []*Config{g3, g2, sm} {
		dir := t.TempDir()
		if err := buildStep(cfg, RandomWeights(cfg, 3), dir, Quantization{}, Float32, Float32, writeOptions{}); err != nil {
			t.Fatalf("%s: %v", cfg.ModelType, err)
		}
		man, err := modeldir.LoadStep(dir)
		if err != nil {
			t.Fatalf("%s: %v", cfg.ModelType, err)
		}
		a, err := archOf(cfg)
		if err != nil {
			t.Fatal(err)
		}
		lay := kvcache.PlanLayout(a.window, len(a.window), math.MaxInt)
		if !slices.Equal(man.Windows, a.window) || !slices.Equal(man.LayerGroups, lay.LayerGroups) {
			t.Errorf("%s: manifest windows %v groups %v, want %v and %v", cfg.ModelType, man.Windows, man.LayerGroups, a.window, lay.LayerGroups)
		}
		m, err := planModel(cfg, RandomWeights(cfg, 3), Quantization{})
		if err != nil {
			t.Fatal(err)
		}
		layer := 0
		for _, n := range stepGraph(m, Float32, Float32, modeldir.StepDomainConveyor, lay.LayerGroups).Graph.Nodes {
			if n.OpType != pagedAttentionOp {
				continue
			}
			attrs := map[string]onnxAttr{}
			for _, at := range n.Attrs {
				attrs[at.Name] = at
			}
			r := a.rotary[layer]
			// A rotary the node cannot take turns q and k before it (rotatePacked).
			rotates := attrs["do_rotary"].I == 1
			if attrs["local_window_size"].I != int64(a.window[layer]) || float64(attrs["softcap"].F) != float64(float32(a.attnSoftcap)) ||
				rotates != (r.dims > 0 && kernels.PagedRotaryFits(m.headDim, r.dims)) || attrs["scale"].F != 1 {
				t.Errorf("%s layer %d: attributes %+v, want window %d, softcap %g, rotary %d dims", cfg.ModelType, layer, attrs, a.window[layer], a.attnSoftcap, r.dims)
			}
			g := 0
			if lay.LayerGroups != nil {
				g = lay.LayerGroups[layer]
			}
			if n.Inputs[7] != modeldir.StepGroupBlockTable(g) {
				t.Errorf("%s layer %d reads block table %s, want group %d's", cfg.ModelType, layer, n.Inputs[7], g)
			}
			layer++
		}
		if layer != len(a.window) {
			t.Errorf("%s: %d PagedAttention nodes for %d layers", cfg.ModelType, layer, len(a.window))
		}
	}
}

// TestTextConfig checks how a multimodal Gemma 3 checkpoint is read as its text model:
// text_config with Gemma3TextConfig's defaults for what it leaves out, the top level's
// token ids, the language model's tensors under either prefix renamed and the vision
// tensors left out; and what is refused.
func TestTextConfig(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, dir, "config.json", `{"model_type":"gemma3","eos_token_id":[1,106],"torch_dtype":"bfloat16",
		"text_config":{"model_type":"gemma3_text","vocab_size":300,"hidden_size":32,"intermediate_size":48,
		"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,"sliding_window":16},
		"vision_config":{"hidden_size":8}}`)
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	bos, _ := cfg.BOS()
	if cfg.ModelType != "gemma3_text" || cfg.wrapper != "gemma3" || cfg.MaxPositionEmbeddings != 131072 || cfg.RopeTheta != 1e6 ||
		!cfg.TieWordEmbeddings || bos != 2 || !reflect.DeepEqual([]int32(cfg.EOSTokenID), []int32{1, 106}) || cfg.TorchDType != "bfloat16" {
		t.Errorf("read %+v", cfg)
	}
	want := RandomWeights(cfg, 1)
	ckpt := Weights{"vision_tower.vision_model.x.weight": {Shape: []int{2}}, "multi_modal_projector.y": {Shape: []int{2}}}
	for name, w := range want {
		prefix := "language_model."
		if strings.Contains(name, "layers.1.") {
			prefix = "" // later transformers: model.language_model.*
			name = strings.Replace(name, "model.", "model.language_model.", 1)
		}
		ckpt[prefix+name] = w
	}
	got := textWeights(cfg, ckpt)
	if len(got) != len(want) {
		t.Errorf("text weights: %d tensors, want %d", len(got), len(want))
	}
	for name := range want {
		if got[name] == nil {
			t.Errorf("text weights: %s missing", name)
		}
	}
	if _, err := planModel(cfg, got, Quantization{}); err != nil {
		t.Errorf("planModel: %v", err)
	}
	for _, tc := range []struct{ json, want string }{
		{`{"model_type":"gemma3"}`, `"gemma3" needs text_config`},
		{`{"model_type":"gemma3","text_config":{"model_type":"llama","vocab_size":8}}`, `text_config model_type "llama", want "gemma3_text"`},
	} {
		writeTestFile(t, dir, "config.json", tc.json)
		if _, err := LoadConfig(dir); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.json, err, tc.want)
		}
	}
}
