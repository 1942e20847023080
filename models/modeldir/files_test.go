package modeldir

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func writeTestFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadGenerationConfig(t *testing.T) {
	dir := t.TempDir()
	g, err := LoadGenerationConfig(dir)
	if err != nil || g == nil || g.EOSTokenID != nil || g.Temperature != nil {
		t.Fatalf("missing file: want zero value, got %+v, %v", g, err)
	}
	writeTestFile(t, dir, "generation_config.json", `{"bos_token_id": 1, "eos_token_id": [2, 5], "temperature": 0.6, "top_p": 0.9, "do_sample": true}`)
	g, err = LoadGenerationConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual([]int32(g.EOSTokenID), []int32{2, 5}) || *g.BOSTokenID != 1 || *g.Temperature != 0.6 || *g.TopP != 0.9 || !*g.DoSample {
		t.Fatalf("parsed %+v", g)
	}
	if got := MergeEOS([]int32{5, 3}, g); !reflect.DeepEqual(got, []int32{5, 3, 2}) {
		t.Errorf("MergeEOS = %v, want [5 3 2]", got)
	}
	writeTestFile(t, dir, "generation_config.json", `{"eos_token_id": }`)
	if _, err := LoadGenerationConfig(dir); !errors.Is(err, ErrBadFile) || !strings.Contains(err.Error(), "generation_config.json") {
		t.Errorf("malformed: want ErrBadFile naming the file, got %v", err)
	}
}
