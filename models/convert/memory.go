package convert

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrTooLarge means a model needs more memory to build than the machine has available.
var ErrTooLarge = errors.New("convert: model too large to build here")

// availableMemory returns the memory the kernel reports available, in bytes, and false
// when it reports none (a system without /proc/meminfo). A variable for tests.
var availableMemory = func() (int64, bool) { return meminfoAvailable("/proc/meminfo") }

// meminfoAvailable reads MemAvailable from a meminfo file.
func meminfoAvailable(path string) (int64, bool) {
	avail, _, ok := ReadMeminfo(path)
	return avail, ok
}

// ReadMeminfo reads MemAvailable and MemTotal, in bytes, from a Linux meminfo file
// (/proc/meminfo); ok is false when it cannot be read or gives no MemAvailable (total is
// then -1 too when it gives no MemTotal).
func ReadMeminfo(path string) (avail, total int64, ok bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, -1, false
	}
	avail, total = -1, -1
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		f := strings.Fields(v)
		if !ok || len(f) != 2 || f[1] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemAvailable":
			avail = n << 10
		case "MemTotal":
			total = n << 10
		}
	}
	return max(avail, 0), total, avail >= 0
}

// buildMemoryBytes estimates the memory a build of cfg holds at its peak, in bytes:
// every weight in float32 (a checkpoint's and a GGUF file's are decoded to float32,
// random ones made so) and the one buffer each derived tensor is computed in, as large as
// the largest of them (a transposed or quantized weight, or a rotary cos or sin table of
// a row per position). The arithmetic is float64, so that no size overflows; cfg must
// be valid.
func buildMemoryBytes(cfg *Config) float64 {
	shapes, err := WeightShapes(cfg)
	if err != nil {
		return 0
	}
	var total, largest float64
	for _, s := range shapes {
		n := 1.0
		for _, d := range s {
			n *= float64(d)
		}
		total += n
		largest = max(largest, n)
	}
	largest = max(largest, float64(cfg.MaxPositionEmbeddings)*float64(cfg.HeadDimOrDefault()/2))
	return 4 * (total + largest)
}

// checkBuildMemory refuses, before anything is allocated, a build of cfg that needs more
// memory than the machine has available. name says what is built, for the error.
func checkBuildMemory(name string, cfg *Config) error {
	avail, ok := availableMemory()
	if need := buildMemoryBytes(cfg); ok && need > float64(avail) {
		return fmt.Errorf("%w: %s: the model needs %s of memory to build; this machine has %s available",
			ErrTooLarge, name, formatSize(need), formatSize(float64(avail)))
	}
	return nil
}

// formatSize prints a size in bytes with one decimal in the largest binary unit it
// reaches: "3.7 TiB".
func formatSize(b float64) string {
	units := []string{"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f bytes", b)
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}
