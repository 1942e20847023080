package build

// DType is the element type weights are stored in.
type DType int

// Weight element types.
const (
	Float32 DType = iota
	Float16
)

// String returns "float32" or "float16".
func (d DType) String() string {
	if d == Float16 {
		return "float16"
	}
	return "float32"
}
