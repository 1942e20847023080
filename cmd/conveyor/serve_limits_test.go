package main

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestServeHTTPLimitFlags: the header cap and the connection timeouts reach api.Config.
func TestServeHTTPLimitFlags(t *testing.T) {
	o, err := parseServeFlags([]string{"--max-header-bytes", "16KiB", "--read-header-timeout", "3s",
		"--idle-timeout", "45s", "--max-connections", "7", "--max-body-bytes-in-flight", "32MiB", "--body-read-timeout", "9s"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, err := o.apiConfig(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxHeaderBytes != 16<<10 || c.ReadHeaderTimeout != 3*time.Second || c.IdleTimeout != 45*time.Second || c.MaxConnections != 7 {
		t.Fatalf("api config: header %d, read-header %v, idle %v, connections %d", c.MaxHeaderBytes, c.ReadHeaderTimeout, c.IdleTimeout, c.MaxConnections)
	}
	if c.MaxBodyBytesInFlight != 32<<20 || c.BodyReadTimeout != 9*time.Second {
		t.Fatalf("api config: bodies in flight %d, body read timeout %v", c.MaxBodyBytesInFlight, c.BodyReadTimeout)
	}
	for _, args := range [][]string{{"--max-header-bytes", "0"}, {"--idle-timeout", "0s"}, {"--read-header-timeout", "0s"},
		{"--max-body-bytes-in-flight", "1MiB"}, {"--body-read-timeout", "0s"}} {
		if _, err := parseServeFlags(args, env(nil), io.Discard); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want a one-line error", args, err)
		}
	}
}

func writeMeminfo(t *testing.T, availKB, totalKB int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "meminfo")
	text := "MemTotal:       " + strconv.Itoa(totalKB) + " kB\nMemFree:         1000 kB\nMemAvailable:   " + strconv.Itoa(availKB) + " kB\nSwapTotal: 0 kB\n"
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKVCacheMemoryOverAvailableRefused: a KV budget above MemAvailable is refused at
// start-up with one line that gives the numbers; one below it is accepted.
func TestKVCacheMemoryOverAvailableRefused(t *testing.T) {
	p := writeMeminfo(t, 2<<20, 8<<20) // 2 GiB available of 8 GiB
	if err := checkKVMemory(1<<30, p); err != nil {
		t.Fatalf("1GiB of 2GiB available: %v", err)
	}
	err := checkKVMemory(3<<30, p)
	if err == nil {
		t.Fatal("3GiB with 2GiB available was accepted")
	}
	msg := err.Error()
	for _, want := range []string{"--kv-cache-memory 3.0GiB", "MemAvailable 2.0GiB", "MemTotal 8.0GiB"} {
		if !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
			t.Errorf("error %q: want one line containing %q", msg, want)
		}
	}
	if err := checkKVMemory(1<<40, filepath.Join(t.TempDir(), "missing")); err != nil {
		t.Errorf("without meminfo: %v, want no check", err)
	}

	// Through the command: serve refuses before loading anything.
	old := meminfoPath
	meminfoPath = p
	defer func() { meminfoPath = old }()
	_, err = parseServeFlags([]string{"--kv-cache-memory", "4GiB"}, env(nil), io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "serve: --kv-cache-memory 4.0GiB is more than the memory available") {
		t.Fatalf("serve --kv-cache-memory 4GiB with 2GiB available: %v", err)
	}
	if _, err := parseServeFlags([]string{"--kv-cache-memory", "512MiB"}, env(nil), io.Discard); err != nil {
		t.Fatalf("serve --kv-cache-memory 512MiB: %v", err)
	}
	// On the GPU the budget is GPU memory: the host's says nothing about it.
	if _, err := parseServeFlags([]string{"--kv-cache-memory", "4GiB", "--device", "cuda"}, env(nil), io.Discard); err != nil {
		t.Fatalf("serve --device cuda --kv-cache-memory 4GiB with 2GiB of host memory available: %v", err)
	}
}
