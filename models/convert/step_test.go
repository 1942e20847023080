package convert

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/conveyor-llm/conveyor/models/modeldir"
)

func TestStepGraphManifestPerDType(t *testing.T) {
	cfgPath := filepath.Join("..", "testdata", "tiny-llama", "config.json")
	for _, tc := range []struct {
		dtype  DType
		domain string
	}{
		{Float32, modeldir.StepDomainConveyor},
		{Float16, modeldir.StepDomainMicrosoft},
		{BFloat16, modeldir.StepDomainMicrosoft},
	} {
		dir := t.TempDir()
		if _, err := BuildRandom(cfgPath, dir, 1, Options{StepDType: tc.dtype}); err != nil {
			t.Fatalf("%v: %v", tc.dtype, err)
		}
		man, err := modeldir.LoadStep(dir)
		if err != nil {
			t.Fatalf("%v: %v", tc.dtype, err)
		}
		if man.DType != tc.dtype.String() || man.AttentionDomain != tc.domain || man.OwnOps != (tc.dtype == Float32) {
			t.Errorf("%v: manifest %+v", tc.dtype, man)
		}
		graph, err := os.ReadFile(filepath.Join(dir, modeldir.StepDir, man.Graph))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(graph, []byte(tc.domain)) || !bytes.Contains(graph, []byte("PagedAttention")) {
			t.Errorf("%v: the graph names no %s PagedAttention", tc.dtype, tc.domain)
		}
	}
}

func TestStepGraphQuantizationOnTheGPU(t *testing.T) {
	cfgPath := filepath.Join("..", "testdata", "tiny-llama", "config.json")
	q, err := ParseQuantization("int8")
	if err != nil {
		t.Fatal(err)
	}
	_, err = BuildRandom(cfgPath, t.TempDir(), 1, Options{Quantize: q, StepDType: Float16})
	if !errors.Is(err, ErrBadConfig) {
		t.Fatalf("int8 with a float16 step graph: %v, want ErrBadConfig", err)
	}
	q4, err := ParseQuantization("int4")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := BuildRandom(cfgPath, dir, 1, Options{Quantize: q4, StepDType: Float16}); err != nil {
		t.Fatalf("int4 with a float16 step graph: %v", err)
	}
	if man, err := modeldir.LoadStep(dir); err != nil || man.Quantization != "int4" || man.DType != "float16" {
		t.Fatalf("int4 float16 step manifest: %+v, %v", man, err)
	}
	if _, err := ParseDType("float64"); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("ParseDType(float64): %v", err)
	}
}

// TestStepGraphNodes: every PagedAttention node of a step graph takes the 17 inputs of
// ONNX Runtime's contract, attention_metadata the 17th; it rotates (do_rotary, cos and
// sin caches) only where the rotary fits CUDA's rule — a full rotary of 16-value heads
// does, Phi-3.5's 0.75 of them does not, and there the graph rotates before the node —
// and every RMSNorm, in float32 and float16 graphs alike, is one
// SimplifiedLayerNormalization computed in float32 (stash_type 1), no Pow left.
func TestStepGraphNodes(t *testing.T) {
	for _, tc := range []struct {
		family      string
		nodeRotates bool
	}{{"llama3", true}, {"phi35", false}, {"phi3", true}} {
		cfg, err := LoadConfigFile(filepath.Join("..", "testdata", "families", tc.family, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		m, err := planModel(cfg, RandomWeights(cfg, 1), Quantization{})
		if err != nil {
			t.Fatal(err)
		}
		for _, dtype := range []DType{Float32, Float16} {
			domain := modeldir.StepDomainConveyor
			if dtype != Float32 {
				domain = modeldir.StepDomainMicrosoft
			}
			g := stepGraph(m, dtype, dtype, domain, nil).Graph
			where := fmt.Sprintf("%s, %v", tc.family, dtype)
			counts := map[string]int{}
			for _, n := range g.Nodes {
				counts[n.OpType]++
				switch n.OpType {
				case pagedAttentionOp:
					rotates := false
					for _, a := range n.Attrs {
						rotates = rotates || (a.Name == "do_rotary" && a.I == 1)
					}
					if len(n.Inputs) != 17 || n.Inputs[16] != modeldir.StepAttentionMetadata {
						t.Fatalf("%s: %s has inputs %q; want 17, attention_metadata last", where, n.Name, n.Inputs)
					}
					if rotates != tc.nodeRotates || (n.Inputs[8] != "") != tc.nodeRotates || slices.ContainsFunc(n.Inputs[10:16], func(s string) bool { return s != "" }) {
						t.Fatalf("%s: %s rotates: %v, inputs %q; want the node to rotate: %v", where, n.Name, rotates, n.Inputs, tc.nodeRotates)
					}
				case "SimplifiedLayerNormalization":
					if !slices.ContainsFunc(n.Attrs, func(a onnxAttr) bool { return a.Name == "stash_type" && a.I == 1 }) {
						t.Fatalf("%s: %s computes its statistics in the graph's type", where, n.Name)
					}
				}
			}
			if counts["Pow"] != 0 || counts["ReduceMean"] != 0 || counts["SimplifiedLayerNormalization"] < 2*cfg.NumHiddenLayers+1 {
				t.Errorf("%s: RMSNorm not one node: %v", where, counts)
			}
			if tc.nodeRotates == (counts["Neg"] > 0) {
				t.Errorf("%s: the graph rotates before the node: %v, want %v", where, counts["Neg"] > 0, !tc.nodeRotates)
			}
		}
	}
}

// TestGPUStepDType: on the GPU a checkpoint is built in its own type as vLLM's --dtype
// auto builds it — bfloat16 when torch_dtype (or transformers' newer dtype) says so,
// float16 otherwise, bfloat16 for Gemma 2 and 3 whatever they say — unless a type is
// asked for; float32 is refused.
func TestGPUStepDType(t *testing.T) {
	for _, tc := range []struct {
		modelType, torch, dtype, asked string
		want                           DType
	}{
		{"llama", "bfloat16", "", "", BFloat16},
		{"llama", "", "bfloat16", "auto", BFloat16},
		{"qwen2", "float16", "", "", Float16},
		{"qwen2", "float32", "", "", Float16},
		{"llama", "", "", "", Float16},
		{"gemma2", "float32", "", "", BFloat16},
		{"gemma3_text", "float16", "", "", BFloat16},
		{"gemma2", "float32", "", "float16", Float16},
		{"llama", "bfloat16", "", "float16", Float16},
	} {
		cfg := &Config{ModelType: tc.modelType, TorchDType: tc.torch, DTypeName: tc.dtype}
		if got, err := GPUStepDType(cfg, tc.asked); err != nil || got != tc.want {
			t.Errorf("%+v: %v, %v; want %v", tc, got, err, tc.want)
		}
	}
	if _, err := GPUStepDType(nil, "float32"); err == nil {
		t.Error("--dtype float32 on the GPU accepted")
	}
	cfg, err := parseConfig([]byte(`{"model_type": "llama", "hidden_size": 8, "num_attention_heads": 1, "num_hidden_layers": 1,
		"intermediate_size": 8, "vocab_size": 8, "dtype": "bfloat16"}`))
	if err != nil || cfg.DTypeName != "bfloat16" {
		t.Fatalf("a config.json with dtype: %+v, %v", cfg, err)
	}
}
