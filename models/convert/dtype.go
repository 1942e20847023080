package convert

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
