package main

import (
	"slices"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/attention"
	"github.com/conveyor-llm/conveyor/models/int8gemm"
)

// TestKernelAttrs: the ready line names the attention kernel's instruction set on the
// paged path only, and the int8 kernel's only for int8 models (whose paged products
// run on it).
func TestKernelAttrs(t *testing.T) {
	for _, tc := range []struct {
		path, quant string
		want        []any
	}{
		{models.AttentionPaged, "int8", []any{"attention_isa", attention.ISA(), "int8_isa", int8gemm.ISA()}},
		{models.AttentionPaged, "int4", []any{"attention_isa", attention.ISA()}},
		{models.AttentionPaged, "none", []any{"attention_isa", attention.ISA()}},
		{models.AttentionDense, "int8", nil},
	} {
		if got := kernelAttrs(tc.path, tc.quant); !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: %v, want %v", tc.path, tc.quant, got, tc.want)
		}
	}
}
