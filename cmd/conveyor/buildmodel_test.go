package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildModelRefusalsAreOneLine: sizes that used to end the process with "fatal
// error: out of memory" and a stack trace are refused in one line naming the field, or
// the memory needed; a failed build leaves the existing --out as it was.
func TestBuildModelRefusalsAreOneLine(t *testing.T) {
	tmp := t.TempDir()
	src, err := os.ReadFile(filepath.Join("..", "..", "models", "testdata", "tiny-llama", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	config := func(name string, fields map[string]any) string {
		var obj map[string]any
		if err := json.Unmarshal(src, &obj); err != nil {
			t.Fatal(err)
		}
		for k, v := range fields {
			obj[k] = v
		}
		b, _ := json.Marshal(obj)
		p := filepath.Join(tmp, name+".json")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	out := filepath.Join(tmp, "model")
	var stdout, stderr bytes.Buffer
	if code := runMain([]string{"build-model", "--random", "--config", config("good", nil), "--out", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	before, err := os.ReadFile(filepath.Join(out, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		fields map[string]any
		want   string
	}{
		{"vocab", map[string]any{"vocab_size": int64(1e12)}, "vocab_size 1000000000000 is above"},
		{"hidden", map[string]any{"hidden_size": int64(1) << 40}, "hidden_size 1099511627776 is above"},
		{"context", map[string]any{"max_position_embeddings": int64(1)<<31 - 1}, "max_position_embeddings 2147483647 is above"},
		{"memory", map[string]any{"hidden_size": 1 << 20, "intermediate_size": 1 << 20, "num_attention_heads": 1 << 10}, "the model needs 44.0 TiB of memory to build; this machine has "},
		{"context", map[string]any{"max_position_embeddings": 0}, "max_position_embeddings must be positive, got 0"},
	} {
		for _, extra := range [][]string{nil, {"--hf-checkpoint"}} {
			if _, err := os.Stat("/proc/meminfo"); err != nil && tc.name == "memory" {
				continue // nothing to check the memory against: the build would try
			}
			stderr.Reset()
			args := append([]string{"build-model", "--random", "--config", config(tc.name, tc.fields), "--out", out}, extra...)
			code := runMain(args, &stdout, &stderr)
			if code != 1 || !strings.Contains(stderr.String(), tc.want) || strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("%s %v: exit %d, stderr %q; want one line with %q", tc.name, extra, code, stderr.String(), tc.want)
			}
		}
	}
	after, err := os.ReadFile(filepath.Join(out, "config.json"))
	if err != nil || !bytes.Equal(after, before) {
		t.Errorf("the failed builds changed %s: %v", out, err)
	}
	if entries, _ := filepath.Glob(filepath.Join(tmp, ".model.*")); len(entries) > 0 {
		t.Errorf("the failed builds left %v", entries)
	}
}
