//go:build conveyorgen

package tokenizer

import (
	"os"
	"path/filepath"
	"testing"
)

// TestGenerateTestTokenizer regenerates testdata/tokenizer.json and
// testdata/tokenizer_config.json from testdata/corpus.txt (see gen_test.go).
func TestGenerateTestTokenizer(t *testing.T) {
	corpus, err := os.ReadFile(filepath.Join("testdata", "corpus.txt"))
	if err != nil {
		t.Fatal(err)
	}
	tokJSON, cfgJSON, err := trainTestTokenizer(string(corpus))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("testdata", "tokenizer.json"), tokJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("testdata", "tokenizer_config.json"), cfgJSON, 0o644); err != nil {
		t.Fatal(err)
	}
}
