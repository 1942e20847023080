package kernels

import "fmt"

// panelCols is the packed layout's panel width (CV_PANEL in int8gemm.c).
const panelCols = 64

// Int8PackedSize is the size in bytes of [K][N] weights in the packed layout: K rounded up
// to a multiple of 4 times N rounded up to a multiple of 64.
func Int8PackedSize(K, N int) int {
	return (K + 3) / 4 * 4 * ((N + panelCols - 1) / panelCols * panelCols)
}

// PackInt8Layout lays w (int8 codes as bytes, [K][N] row-major) out as the kernel reads them:
// panels of 64 columns, each [K/4][64 columns][4 k], zero-padded, byte (k, n) at
// (n/64)·Kp·64 + (k/4)·256 + (n%64)·4 + k%4 (Kp = K rounded up to 4). The builder
// stores an Int8Linear node's weights this way, so the kernel uses the initializer in
// place (see WrapInt8) instead of keeping a second, packed copy.
func PackInt8Layout(w []byte, K, N int) ([]byte, error) {
	if K < 1 || N < 1 || K > Int8MaxK || len(w) != K*N {
		return nil, fmt.Errorf("%w: PackInt8Layout needs 1 <= K <= %d, N >= 1 and len(w) = K*N (K %d, N %d, len(w) %d)", ErrInt8Shape, Int8MaxK, K, N, len(w))
	}
	kp := (K + 3) / 4 * 4
	out := make([]byte, Int8PackedSize(K, N))
	for n0 := 0; n0 < N; n0 += panelCols {
		panel := out[n0/panelCols*kp*panelCols:]
		cols := min(panelCols, N-n0)
		for k := range K {
			src := w[k*N+n0 : k*N+n0+cols]
			row := panel[k/4*4*panelCols+k%4:]
			for j, v := range src {
				row[4*j] = v
			}
		}
	}
	return out, nil
}
