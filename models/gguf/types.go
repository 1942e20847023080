package gguf

import (
	"fmt"
	"strings"
)

// GGMLType is a tensor's element type: ggml's type id as stored in the tensor info
// (enum ggml_type). Block types pack BlockValues values into BlockBytes bytes.
type GGMLType uint32

// The ggml type ids. Ids 4, 5, 31-33 and 36-38 belonged to layouts ggml has removed; they
// are named so that a file holding one is reported clearly, and a file naming them is
// refused like any id without a layout.
const (
	TypeF32      GGMLType = 0
	TypeF16      GGMLType = 1
	TypeQ4_0     GGMLType = 2
	TypeQ4_1     GGMLType = 3
	TypeQ4_2     GGMLType = 4 // removed from ggml
	TypeQ4_3     GGMLType = 5 // removed from ggml
	TypeQ5_0     GGMLType = 6
	TypeQ5_1     GGMLType = 7
	TypeQ8_0     GGMLType = 8
	TypeQ8_1     GGMLType = 9
	TypeQ2_K     GGMLType = 10
	TypeQ3_K     GGMLType = 11
	TypeQ4_K     GGMLType = 12
	TypeQ5_K     GGMLType = 13
	TypeQ6_K     GGMLType = 14
	TypeQ8_K     GGMLType = 15
	TypeIQ2_XXS  GGMLType = 16
	TypeIQ2_XS   GGMLType = 17
	TypeIQ3_XXS  GGMLType = 18
	TypeIQ1_S    GGMLType = 19
	TypeIQ4_NL   GGMLType = 20
	TypeIQ3_S    GGMLType = 21
	TypeIQ2_S    GGMLType = 22
	TypeIQ4_XS   GGMLType = 23
	TypeI8       GGMLType = 24
	TypeI16      GGMLType = 25
	TypeI32      GGMLType = 26
	TypeI64      GGMLType = 27
	TypeF64      GGMLType = 28
	TypeIQ1_M    GGMLType = 29
	TypeBF16     GGMLType = 30
	TypeQ4_0_4_4 GGMLType = 31 // removed from ggml
	TypeQ4_0_4_8 GGMLType = 32 // removed from ggml
	TypeQ4_0_8_8 GGMLType = 33 // removed from ggml
	TypeTQ1_0    GGMLType = 34
	TypeTQ2_0    GGMLType = 35
	TypeIQ4_NL44 GGMLType = 36 // removed from ggml
	TypeIQ4_NL48 GGMLType = 37 // removed from ggml
	TypeIQ4_NL88 GGMLType = 38 // removed from ggml
	TypeMXFP4    GGMLType = 39
	TypeNVFP4    GGMLType = 40
	TypeQ1_0     GGMLType = 41
)

// typeInfo is one ggml type's name and block layout; values 0 mean the id has no layout
// (a removed type).
type typeInfo struct {
	name        string
	blockValues int64 // values per block
	blockBytes  int64 // bytes per block
}

// qkK is the number of values in a K-quant super-block (ggml's QK_K).
const qkK = 256

// typeTable holds every id ggml has assigned, with the block layouts of ggml's type traits
// (ggml.c) and gguf-py's GGML_QUANT_SIZES.
var typeTable = [...]typeInfo{
	TypeF32:      {"F32", 1, 4},
	TypeF16:      {"F16", 1, 2},
	TypeQ4_0:     {"Q4_0", 32, 2 + 16},
	TypeQ4_1:     {"Q4_1", 32, 2 + 2 + 16},
	TypeQ4_2:     {"Q4_2", 0, 0},
	TypeQ4_3:     {"Q4_3", 0, 0},
	TypeQ5_0:     {"Q5_0", 32, 2 + 4 + 16},
	TypeQ5_1:     {"Q5_1", 32, 2 + 2 + 4 + 16},
	TypeQ8_0:     {"Q8_0", 32, 2 + 32},
	TypeQ8_1:     {"Q8_1", 32, 2 + 2 + 32},
	TypeQ2_K:     {"Q2_K", qkK, 2 + 2 + qkK/16 + qkK/4},
	TypeQ3_K:     {"Q3_K", qkK, 2 + qkK/4 + qkK/8 + 12},
	TypeQ4_K:     {"Q4_K", qkK, 2 + 2 + 12 + qkK/2},
	TypeQ5_K:     {"Q5_K", qkK, 2 + 2 + 12 + qkK/8 + qkK/2},
	TypeQ6_K:     {"Q6_K", qkK, qkK/2 + qkK/4 + qkK/16 + 2},
	TypeQ8_K:     {"Q8_K", qkK, 4 + qkK + qkK/8},
	TypeIQ2_XXS:  {"IQ2_XXS", qkK, 2 + qkK/4},
	TypeIQ2_XS:   {"IQ2_XS", qkK, 2 + qkK/4 + qkK/32},
	TypeIQ3_XXS:  {"IQ3_XXS", qkK, 2 + qkK/4 + qkK/8},
	TypeIQ1_S:    {"IQ1_S", qkK, 2 + qkK/8 + qkK/16},
	TypeIQ4_NL:   {"IQ4_NL", 32, 2 + 16},
	TypeIQ3_S:    {"IQ3_S", qkK, 2 + qkK/4 + qkK/8 + qkK/32 + 4},
	TypeIQ2_S:    {"IQ2_S", qkK, 2 + qkK/4 + qkK/16},
	TypeIQ4_XS:   {"IQ4_XS", qkK, 2 + 2 + qkK/2 + qkK/64},
	TypeI8:       {"I8", 1, 1},
	TypeI16:      {"I16", 1, 2},
	TypeI32:      {"I32", 1, 4},
	TypeI64:      {"I64", 1, 8},
	TypeF64:      {"F64", 1, 8},
	TypeIQ1_M:    {"IQ1_M", qkK, qkK/8 + qkK/16 + qkK/32},
	TypeBF16:     {"BF16", 1, 2},
	TypeQ4_0_4_4: {"Q4_0_4_4", 0, 0},
	TypeQ4_0_4_8: {"Q4_0_4_8", 0, 0},
	TypeQ4_0_8_8: {"Q4_0_8_8", 0, 0},
	TypeTQ1_0:    {"TQ1_0", qkK, 2 + 4*13},
	TypeTQ2_0:    {"TQ2_0", qkK, 2 + 64},
	TypeIQ4_NL44: {"IQ4_NL_4_4", 0, 0},
	TypeIQ4_NL48: {"IQ4_NL_4_8", 0, 0},
	TypeIQ4_NL88: {"IQ4_NL_8_8", 0, 0},
	TypeMXFP4:    {"MXFP4", 32, 1 + 16},
	TypeNVFP4:    {"NVFP4", 64, 4 + 32},
	TypeQ1_0:     {"Q1_0", 128, 2 + 16},
}

// String returns ggml's name of the type ("Q4_K"), or "type(N)" for an id ggml never assigned.
func (t GGMLType) String() string {
	if int(t) < len(typeTable) {
		return typeTable[t].name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockValues returns the number of values in one block of the type (1 for plain types such
// as F16, 32 for Q8_0, 256 for the K-quants), or 0 when the id has no layout.
func (t GGMLType) BlockValues() int64 {
	if int(t) < len(typeTable) {
		return typeTable[t].blockValues
	}
	return 0
}

// BlockBytes returns the size in bytes of one block of the type (34 for Q8_0, 144 for
// Q4_K), or 0 when the id has no layout.
func (t GGMLType) BlockBytes() int64 {
	if int(t) < len(typeTable) {
		return typeTable[t].blockBytes
	}
	return 0
}

// hasLayout reports whether the type's block layout is known, which is what Open needs to
// check a tensor's extent; decoding it to float32 needs Supported as well.
func (t GGMLType) hasLayout() bool {
	return t.BlockValues() > 0
}

// WeightBits returns the bits a weight of the type carries before its block's scales: 4
// for Q4_0, Q4_1 and Q4_K, 5 for Q5_0, Q5_1 and Q5_K, 6 for Q6_K, 8 for Q8_0, 16 for F16
// and BF16, 32 for F32, 0 for any other type.
func (t GGMLType) WeightBits() int {
	switch t {
	case TypeQ4_0, TypeQ4_1, TypeQ4_K:
		return 4
	case TypeQ5_0, TypeQ5_1, TypeQ5_K:
		return 5
	case TypeQ6_K:
		return 6
	case TypeQ8_0:
		return 8
	case TypeF16, TypeBF16:
		return 16
	case TypeF32:
		return 32
	}
	return 0
}

// Supported reports whether ReadFloat32 and Dequantize decode the type.
func (t GGMLType) Supported() bool {
	return decoderFor(t) != nil
}

// supportedTypes lists the types this package decodes, in the order error messages name them.
var supportedTypes = []GGMLType{
	TypeF32, TypeF16, TypeBF16, TypeQ8_0, TypeQ4_0, TypeQ4_1, TypeQ5_0, TypeQ5_1,
	TypeQ4_K, TypeQ5_K, TypeQ6_K,
}

// supportedNames is supportedTypes as the comma-separated list error messages show.
var supportedNames = func() string {
	names := make([]string, len(supportedTypes))
	for i, t := range supportedTypes {
		names[i] = t.String()
	}
	return strings.Join(names, ", ")
}()
