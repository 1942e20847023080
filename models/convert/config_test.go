package convert

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/conveyor-llm/conveyor/models/modeldir"
)

func writeTestFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

const validConfigJSON = `{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 2048,
  "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": %EOS%,
  "torch_dtype": "bfloat16"
}`

func TestLoadConfigEOSForms(t *testing.T) {
	for _, tc := range []struct {
		eos  string
		want []int32
	}{
		{"2", []int32{2}},
		{"[2, 7, 9]", []int32{2, 7, 9}},
		{"null", nil},
		{"[]", []int32{}},
	} {
		dir := t.TempDir()
		writeTestFile(t, dir, "config.json", strings.Replace(validConfigJSON, "%EOS%", tc.eos, 1))
		c, err := LoadConfig(dir)
		if err != nil {
			t.Fatalf("eos %s: %v", tc.eos, err)
		}
		if !reflect.DeepEqual([]int32(c.EOSTokenID), tc.want) {
			t.Errorf("eos %s: got %v, want %v", tc.eos, c.EOSTokenID, tc.want)
		}
		if bos, ok := c.BOS(); !ok || bos != 1 {
			t.Errorf("BOS() = %d, %v; want 1, true", bos, ok)
		}
		if c.HeadDimOrDefault() != 16 || c.KVHeads() != 2 || c.Theta() != 500000 {
			t.Errorf("derived sizes: head dim %d, kv heads %d, theta %g", c.HeadDimOrDefault(), c.KVHeads(), c.Theta())
		}
	}
}

func TestLoadConfigRejectsBadEOS(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, dir, "config.json", strings.Replace(validConfigJSON, "%EOS%", `"two"`, 1))
	_, err := LoadConfig(dir)
	if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "config.json") {
		t.Fatalf("want ErrBadConfig naming config.json, got %v", err)
	}
}

func TestLoadConfigMalformedAndMissing(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadConfig(dir); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Fatalf("missing config.json: got %v", err)
	}
	for _, content := range []string{`{"vocab_size": 10,`, `[1,2]`, `{"hidden_size": "big"}`, ``} {
		writeTestFile(t, dir, "config.json", content)
		_, err := LoadConfig(dir)
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), filepath.Join(dir, "config.json")) {
			t.Errorf("content %q: want ErrBadConfig naming the file, got %v", content, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	base := func() Config {
		return Config{VocabSize: 100, HiddenSize: 64, IntermediateSize: 128, NumHiddenLayers: 1,
			NumAttentionHeads: 4, NumKeyValueHeads: 2, MaxPositionEmbeddings: 128}
	}
	bos := int32(100)
	for _, tc := range []struct {
		name   string
		modify func(*Config)
		errSub string // "" = valid
	}{
		{"valid", func(c *Config) {}, ""},
		{"kv heads default", func(c *Config) { c.NumKeyValueHeads = 0 }, ""},
		{"explicit head dim", func(c *Config) { c.HiddenSize = 60; c.HeadDim = 16 }, ""},
		{"heads do not divide hidden", func(c *Config) { c.HiddenSize = 66 }, "does not divide hidden_size"},
		{"kv heads do not divide heads", func(c *Config) { c.NumKeyValueHeads = 3 }, "does not divide num_attention_heads"},
		{"zero vocab", func(c *Config) { c.VocabSize = 0 }, "vocab_size"},
		{"zero layers", func(c *Config) { c.NumHiddenLayers = 0 }, "num_hidden_layers"},
		{"zero heads", func(c *Config) { c.NumAttentionHeads = 0 }, "num_attention_heads"},
		{"negative kv heads", func(c *Config) { c.NumKeyValueHeads = -1 }, "num_key_value_heads"},
		{"odd head dim", func(c *Config) { c.HeadDim = 15 }, "odd"},
		{"bos outside vocab", func(c *Config) { c.BOSTokenID = &bos }, "bos_token_id"},
		{"eos outside vocab", func(c *Config) { c.EOSTokenID = modeldir.TokenIDs{2, -1} }, "eos_token_id"},
		{"other architecture", func(c *Config) { c.ModelType = "gpt2" }, "model_type"},
		{"zero context", func(c *Config) { c.MaxPositionEmbeddings = 0 }, "max_position_embeddings must be positive, got 0"},
		{"negative context", func(c *Config) { c.MaxPositionEmbeddings = -1 }, "max_position_embeddings must be positive, got -1"},
	} {
		c := base()
		tc.modify(&c)
		err := c.Validate()
		if tc.errSub == "" {
			if err != nil {
				t.Errorf("%s: unexpected error %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.errSub) {
			t.Errorf("%s: want ErrBadConfig mentioning %q, got %v", tc.name, tc.errSub, err)
		}
	}
}

func TestTinyLlamaFixture(t *testing.T) {
	c, err := LoadConfig(filepath.Join("..", "testdata", "tiny-llama"))
	if err != nil {
		t.Fatal(err)
	}
	if c.KVHeads() >= c.NumAttentionHeads || !c.TieWordEmbeddings {
		t.Errorf("fixture should be a tied GQA model: %+v", c)
	}
	if c.NumParams() != int64(len(flattenWeights(RandomWeights(c, 1)))) {
		t.Errorf("NumParams %d disagrees with RandomWeights", c.NumParams())
	}
}

func flattenWeights(w Weights) []float32 {
	var out []float32
	for _, n := range w.Names() {
		out = append(out, w[n].Data...)
	}
	return out
}

// FuzzConfigJSON feeds arbitrary bytes to the config parsers: they must return an
// error or a config, never panic, and an accepted config must pass Validate's promises.
func FuzzConfigJSON(f *testing.F) {
	f.Add([]byte(strings.Replace(validConfigJSON, "%EOS%", "[2,3]", 1)))
	f.Add([]byte(`{"eos_token_id": [1, "x"]}`))
	f.Add([]byte(`{"eos_token_id": 99999999999}`))
	f.Add([]byte(`{"hidden_size": 64, "num_attention_heads": 0}`))
	f.Add([]byte(`{"vocab_size":8,"hidden_size":4,"intermediate_size":1,"num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":-2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if c, err := LoadConfig(dir); err == nil {
			d := c.HeadDimOrDefault()
			if d <= 0 || d%2 != 0 || c.NumAttentionHeads%c.KVHeads() != 0 {
				t.Fatalf("accepted an unusable config: %+v", c)
			}
		}
		_, _ = modeldir.LoadGenerationConfig(dir)
	})
}

// BOS returns the beginning-of-sequence token id and whether the model has one.
func (c *Config) BOS() (int32, bool) {
	if c.BOSTokenID == nil {
		return 0, false
	}
	return *c.BOSTokenID, true
}

// TestContextLengthRequired: a config.json whose max_position_embeddings is 0, or missing,
// is refused by Validate in one line naming the field, before anything is built: a model
// directory is not made (it used to be built, then refused by its own step manifest as
// "max_positions 0"), nor a random checkpoint (which used to be written).
func TestContextLengthRequired(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "testdata", "tiny-llama", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		value any // nil: the field left out
		want  string
	}{
		{"zero", 0, "bad model config: max_position_embeddings must be positive, got 0"},
		{"null", "null", "bad model config: max_position_embeddings must be positive, got 0"},
		{"missing", nil, "bad model config: max_position_embeddings is missing"},
	} {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(src, &obj); err != nil {
			t.Fatal(err)
		}
		delete(obj, "max_position_embeddings")
		if tc.value != nil {
			obj["max_position_embeddings"] = json.RawMessage(fmt.Sprint(tc.value))
		}
		b, _ := json.Marshal(obj)
		dir := t.TempDir()
		path := filepath.Join(dir, "config.json")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadConfigFile(path); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: LoadConfigFile: %v, want one line with %q", tc.name, err, tc.want)
		}
		out := filepath.Join(t.TempDir(), "m")
		if _, err := BuildRandom(path, out, 1, Options{}); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: BuildRandom: %v, want %q", tc.name, err, tc.want)
		}
		if _, err := WriteRandomCheckpoint(path, out, 1); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: WriteRandomCheckpoint: %v, want %q", tc.name, err, tc.want)
		}
		if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: a refused build made %s", tc.name, out)
		}
		if left := leftovers(t, filepath.Dir(out)); len(left) > 0 {
			t.Errorf("%s: a refused build left %v", tc.name, left)
		}
	}
}
