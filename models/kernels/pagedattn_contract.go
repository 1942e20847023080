package kernels

// The shapes PagedAttention takes, as ONNX Runtime's CUDA kernel checks them and this
// package's operator checks them on the CPU (pagedattn.h's CV_PA_* limits; pagedattn_doc.go says
// where ONNX Runtime states each): the model builder and the runners read them here.

// Limits of the contract.
const (
	// PagedMaxHeadDim is the largest head size (CUDA: memory-efficient attention's limit, the
	// backend with the largest).
	PagedMaxHeadDim = 1024
	// PagedMinBlockSize is the smallest block size; every block size is a power of two.
	PagedMinBlockSize = 16
)

// PagedHeadFits reports whether PagedAttention takes heads of d values: a multiple of 8, at
// most PagedMaxHeadDim.
func PagedHeadFits(d int) bool { return d >= 8 && d%8 == 0 && d <= PagedMaxHeadDim }

// PagedRotaryFits reports whether PagedAttention's own rotary (do_rotary, with cos and sin
// caches of rotaryDims/2 columns) takes a rotary of rotaryDims values in heads of d:
// the head a multiple of 16, the caches' width a multiple of 8 and at most d/2 (CUDA's
// CheckRotaryCaches). Phi-3.5's 0.75 of a 16-value head (12) does not fit; the model
// builder rotates such heads itself before the node.
func PagedRotaryFits(d, rotaryDims int) bool {
	half := rotaryDims / 2
	return PagedHeadFits(d) && d%16 == 0 && rotaryDims%2 == 0 && half >= 8 && half%8 == 0 && half <= d/16*8
}

// PagedFlashBlockSize returns the smallest block size with which ONNX Runtime's CUDA
// PagedAttention runs FlashAttention for heads of d values (its rule: block sizes a
// multiple of 256 up to heads of 64, of 128 up to 128, of 64 above). With smaller blocks
// a step with a prompt chunk runs memory-efficient attention, which gathers every row's
// whole context into a dense buffer in every layer.
func PagedFlashBlockSize(d int) int {
	switch {
	case d <= 64:
		return 256
	case d <= 128:
		return 128
	}
	return 64
}
