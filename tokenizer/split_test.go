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
