package kernels

import (
	"testing"
)

// TestPagedContractMatchesKernel: PagedHeadFits and PagedRotaryFits, which the model
// builder reads, and the block sizes of PagedMinBlockSize (powers of two of at least it,
// as models.Spec.BlockSize takes them) say exactly what the kernel's checks accept, over
// every head size to 1040, every even rotary size to the head's, and block sizes to 1100.
func TestPagedContractMatchesKernel(t *testing.T) {
	runs := func(d, rotary, bs int) bool {
		dims := PagedDims{HeadDim: d, BlockSize: bs}
		ts := PagedTensors{CumSeqLens: []int32{0}}
		if rotary > 0 {
			dims.RotaryDim, dims.MaxPos = rotary, 1
			ts.Cos, ts.Sin = make([]float32, rotary/2), make([]float32, rotary/2)
		}
		return PagedAttention(PagedAttrs{NumHeads: 2, KVNumHeads: 1}, dims, ts) == nil
	}
	for d := 1; d <= PagedMaxHeadDim+16; d++ {
		if got, want := runs(d, 0, 16), PagedHeadFits(d); got != want {
			t.Fatalf("head %d: the kernel takes it: %v, PagedHeadFits: %v", d, got, want)
		}
		for r := 2; r <= d && d <= 256; r += 2 {
			if got, want := runs(d, r, 16), PagedRotaryFits(d, r); got != want {
				t.Fatalf("head %d, rotary %d: the kernel takes it: %v, PagedRotaryFits: %v", d, r, got, want)
			}
		}
	}
	for bs := 1; bs <= 1100; bs++ {
		if got, want := runs(64, 0, bs), blockSizeFits(bs); got != want {
			t.Fatalf("block size %d: the kernel takes it: %v, the contract: %v", bs, got, want)
		}
	}
	for d, want := range map[int]int{16: 256, 64: 256, 80: 128, 128: 128, 256: 64} {
		if got := PagedFlashBlockSize(d); got != want || !blockSizeFits(got) {
			t.Errorf("PagedFlashBlockSize(%d) = %d, want %d", d, got, want)
		}
	}
	if PagedRotaryFits(16, 12) || !PagedRotaryFits(16, 16) || !PagedRotaryFits(96, 32) || PagedRotaryFits(96, 24) || !PagedRotaryFits(64, 64) {
		t.Error("PagedRotaryFits: Phi-3.5's 12 of 16 must not fit; 16 of 16, 32 of 96 and 64 of 64 must")
	}
}

// blockSizeFits reports whether blocks of n tokens are in the contract: a power of two of
// at least PagedMinBlockSize.
func blockSizeFits(n int) bool { return n >= PagedMinBlockSize && n&(n-1) == 0 }
