package models

import (
	"errors"
	"testing"
)

// TestValidateDevice: RunnerOptions.Device takes cpu, cuda, auto or "" (auto).
func TestValidateDevice(t *testing.T) {
	for _, d := range []string{"", DeviceCPU, DeviceCUDA, DeviceAuto} {
		if err := (RunnerOptions{Device: d}).Validate(); err != nil {
			t.Errorf("device %q: %v", d, err)
		}
	}
	for _, d := range []string{"gpu", "CUDA", "cuda:0", "tpu"} {
		if err := (RunnerOptions{Device: d}).Validate(); !errors.Is(err, ErrModelDir) {
			t.Errorf("device %q: err = %v, want ErrModelDir", d, err)
		}
	}
}
