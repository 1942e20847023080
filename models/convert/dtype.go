package convert

import (
	"fmt"
	"strings"
)

// DType is the element type weights are stored in.
type DType int

// Weight element types.
const (
	Float32 DType = iota
	Float16
	BFloat16
)

// String returns "float32", "float16" or "bfloat16".
func (d DType) String() string {
	switch d {
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	}
	return "float32"
}

// ParseDType reads "float32", "float16" or "bfloat16".
func ParseDType(s string) (DType, error) {
	for _, d := range []DType{Float32, Float16, BFloat16} {
		if s == d.String() {
			return d, nil
		}
	}
	return Float32, fmt.Errorf("%w: dtype %q: want float32, float16 or bfloat16", ErrBadConfig, s)
}

// GPUStepDType returns the float type of the step graph cfg is built with for a GPU:
// asked when it is float16 or bfloat16 ("" or "auto": the default; float32 is the CPU's,
// refused), else, as vLLM's --dtype auto, bfloat16 when the checkpoint's torch_dtype (or
// dtype) is bfloat16 and float16 otherwise — except Gemma 2 and 3, whose activations
// overflow float16: bfloat16 for them unless float16 is asked for.
func GPUStepDType(cfg *Config, asked string) (DType, error) {
	switch asked {
	case "", "auto":
	case Float16.String():
		return Float16, nil
	case BFloat16.String():
		return BFloat16, nil
	default:
		return Float16, fmt.Errorf("--dtype %q on the GPU: want auto, float16 or bfloat16", asked)
	}
	if cfg == nil {
		return Float16, nil
	}
	checkpoint := cfg.TorchDType
	if checkpoint == "" {
		checkpoint = cfg.DTypeName
	}
	if checkpoint == BFloat16.String() || strings.HasPrefix(cfg.ModelType, "gemma2") || strings.HasPrefix(cfg.ModelType, "gemma3") {
		return BFloat16, nil
	}
	return Float16, nil
}
