package convert

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
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
		if _, err := BuildRandomWith(cfgPath, dir, 1, Options{StepDType: tc.dtype}); err != nil {
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
	_, err = BuildRandomWith(cfgPath, t.TempDir(), 1, Options{Quantize: q, StepDType: Float16})
	if !errors.Is(err, ErrBadConfig) {
		t.Fatalf("int8 with a float16 step graph: %v, want ErrBadConfig", err)
	}
	q4, err := ParseQuantization("int4")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := BuildRandomWith(cfgPath, dir, 1, Options{Quantize: q4, StepDType: Float16}); err != nil {
		t.Fatalf("int4 with a float16 step graph: %v", err)
	}
	if man, err := modeldir.LoadStep(dir); err != nil || man.Quantization != "int4" || man.DType != "float16" {
		t.Fatalf("int4 float16 step manifest: %+v, %v", man, err)
	}
	if _, err := ParseDType("float64"); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("ParseDType(float64): %v", err)
	}
}
