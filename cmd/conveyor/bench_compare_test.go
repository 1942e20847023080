package main

import (
	"strings"
	"testing"
)

func TestBenchCompareFlagErrors(t *testing.T) {
	err := runBenchCompare([]string{"--attention", "flash", "--model", t.TempDir(), "--out", t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "--attention") {
		t.Errorf("bench compare --attention flash: %v, want an error naming --attention", err)
	}
}
