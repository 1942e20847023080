package convert

import "fmt"

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
