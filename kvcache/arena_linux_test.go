package kvcache

import (
	"os"
	"syscall"
	"testing"
	"unsafe"
)

// TestArenaIsFaultedIn: the K/V arena's pages are resident once it is allocated, so no
// step pays for touching a fresh page of it.
func TestArenaIsFaultedIn(t *testing.T) {
	const n = 8 << 20
	mem, release := allocArena(n)
	defer release()
	if len(mem) != n {
		t.Fatalf("arena of %d bytes, want %d", len(mem), n)
	}
	page := os.Getpagesize()
	vec := make([]byte, (n+page-1)/page)
	if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(n),
		uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Skipf("mincore: %v (the arena is not a mapping here)", errno)
	}
	missing := 0
	for _, v := range vec {
		if v&1 == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d pages of a new arena are not resident", missing, len(vec))
	}
	for i := 0; i < n; i += page {
		if mem[i] != 0 {
			t.Fatalf("byte %d of a new arena is %d, want 0", i, mem[i])
		}
	}
}
