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
