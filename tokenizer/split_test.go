package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
)

// splitText draws n runes from classes that exercise every alternative of the split
// expressions: letters, digits (also non-ASCII), punctuation, contractions, and all kinds
// of white space including line breaks and non-ASCII spaces.
func splitText(rng *rand.Rand, n int) string {
	pools := []string{"abcXYZéß你", "0123٣", ".,!?-'\"(", " ", "  \t", "\n\r", "\u00a0\u3000", "'s'T're'VE'll'd'm"}
	var b strings.Builder
	for range n {
		p := []rune(pools[rng.IntN(len(pools))])
		if rng.IntN(8) == 0 {
			b.WriteString(string(p))
			continue
		}
		b.WriteRune(p[rng.IntN(len(p))])
	}
	return b.String()
}

// TestScannersMatchRegexp checks the hand-written scanners against the expressions run by
// regexp2.
func TestScannersMatchRegexp(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, expr := range []string{gpt2Pattern, llama3Pattern, qwen2Pattern} {
		re := regexp2.MustCompile(expr, regexp2.None)
		sc := scannerFor(expr)
		if sc == nil {
			t.Fatalf("no scanner for %q", expr)
		}
		for range 3000 {
			s := splitText(rng, rng.IntN(16))
			want, err := regexSplit(re, s, splitIsolated, false)
			if err != nil {
				t.Fatal(err)
			}
			if got := scanSplit(sc, s); !slices.Equal(got, want) {
				t.Fatalf("expr %q on %q: scanner %q, regexp %q", expr[:12], s, got, want)
			}
		}
	}
}

// TestSplitBehaviors uses the examples of the Hugging Face documentation of
// SplitDelimiterBehavior, and the other simple pre-tokenizers.
func TestSplitBehaviors(t *testing.T) {
	cases := []struct {
		json string
		in   string
		want []string
	}{
		{`{"type": "Split", "pattern": {"String": "-"}, "behavior": "Removed"}`, "the-final--countdown", []string{"the", "final", "countdown"}},
		{`{"type": "Split", "pattern": {"String": "-"}, "behavior": "Isolated"}`, "the-final--countdown", []string{"the", "-", "final", "-", "-", "countdown"}},
		{`{"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithPrevious"}`, "the-final--countdown", []string{"the-", "final-", "-", "countdown"}},
		{`{"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithNext"}`, "the-final--countdown", []string{"the", "-final", "-", "-countdown"}},
		{`{"type": "Split", "pattern": {"String": "-"}, "behavior": "Contiguous"}`, "the-final--countdown", []string{"the", "-", "final", "--", "countdown"}},
		{`{"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Removed", "invert": true}`, "ab12cd", []string{"ab", "cd"}},
		{`{"type": "Split", "pattern": {"String": "."}, "behavior": "Isolated"}`, "a.b", []string{"a", ".", "b"}},
		{`{"type": "Whitespace"}`, "Hey friend!  How", []string{"Hey", "friend", "!", "How"}},
		{`{"type": "WhitespaceSplit"}`, "Hey friend!  How", []string{"Hey", "friend!", "How"}},
		{`{"type": "Digits", "individual_digits": true}`, "a123", []string{"a", "1", "2", "3"}},
		{`{"type": "Digits", "individual_digits": false}`, "a123b", []string{"a", "123", "b"}},
		{`{"type": "Punctuation", "behavior": "Isolated"}`, "Hi, you!", []string{"Hi", ",", " you", "!"}},
		{`{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}`, "Hey  you", []string{"▁Hey", "▁", "▁you"}},
		{`{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": false}`, "Hey you", []string{"Hey▁you"}},
		{`{"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, {"type": "Digits", "individual_digits": true}]}`, "x1 y22", []string{"x", "1", "y", "2", "2"}},
	}
	for _, c := range cases {
		pt, _, err := buildPreTokenizer([]byte(c.json))
		if err != nil {
			t.Fatalf("%s: %v", c.json, err)
		}
		got, err := pt([]string{c.in}, true)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s on %q: got %q, want %q", c.json, c.in, got, c.want)
		}
	}
}

// TestMetaspaceSplit: Metaspace with split cuts before every replacement character, which
// stays at the start of the piece after it (Hugging Face's split on the replacement with
// MergedWithNext), whatever the prepend scheme; pieces shorter than the replacement and text
// before the first replacement are pieces of their own. Expected pieces follow
// tokenizers/src/pre_tokenizers/metaspace.rs.
func TestMetaspaceSplit(t *testing.T) {
	const meta = `{"type": "Metaspace", "replacement": "▁", "split": true, "prepend_scheme": `
	cases := []struct {
		json  string
		in    string
		first bool // the word starts the input
		want  []string
	}{
		// The fuzz crash: a piece shorter than "▁" (3 bytes) with nothing prepended.
		{meta + `"first"}`, "\n", false, []string{"\n"}},
		{meta + `"never"}`, "a", true, []string{"a"}},
		{meta + `"never"}`, "ab", true, []string{"ab"}},
		// Text before the first replacement is a piece of its own, also when it is shorter
		// than the replacement (the old code skipped its first 3 bytes and missed this ▁).
		{meta + `"never"}`, "ab c", true, []string{"ab", "▁c"}},
		{meta + `"never"}`, "Hey you", true, []string{"Hey", "▁you"}},
		{meta + `"never"}`, "Hey  you ", true, []string{"Hey", "▁", "▁you", "▁"}},
		{meta + `"never"}`, "a▁▁b", true, []string{"a", "▁", "▁b"}},
		{meta + `"never"}`, " Hey", true, []string{"▁Hey"}},
		{meta + `"first"}`, "Hey  you", true, []string{"▁Hey", "▁", "▁you"}},
		{meta + `"first"}`, "how are you", false, []string{"how", "▁are", "▁you"}},
		{meta + `"always"}`, "how are", false, []string{"▁how", "▁are"}},
		{meta + `"always"}`, "", true, nil},
		{`{"type": "Metaspace", "replacement": "_", "split": true, "prepend_scheme": "never"}`, "x y_z", true, []string{"x", "_y", "_z"}},
	}
	for _, c := range cases {
		pt, _, err := buildPreTokenizer([]byte(c.json))
		if err != nil {
			t.Fatalf("%s: %v", c.json, err)
		}
		got, err := pt([]string{c.in}, c.first)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s on %q (first %v): got %q, want %q", c.json, c.in, c.first, got, c.want)
		}
	}
	// "first" prepends only to the word at the start of the input: not after an empty word
	// there (dropped, as Hugging Face drops empty pieces), and not to later words.
	pt, _, err := buildPreTokenizer([]byte(meta + `"first"}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := pt([]string{"", "a", "b"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"▁a", "b"}; !slices.Equal(got, want) {
		t.Errorf("first on [\"\" a b]: got %q, want %q", got, want)
	}
}
