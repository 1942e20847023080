package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Hand-written scanners for the three word-splitting expressions nearly every byte-level
// model uses. They give the same pieces as the expressions (checked against regexp2 by
// TestScannersMatchRegexp) about ten times faster. Other expressions run on regexp2.

// Llama-3's Split expression; Qwen2's is the same with \p{N} instead of \p{N}{1,3}.
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// scanner returns the end of the match starting at i (> i), for text that has one there.
type scanner func(s string, i int) int

// scannerFor returns the hand-written scanner of a known expression, or nil.
func scannerFor(expr string) scanner {
	switch expr {
	case gpt2Pattern:
		return scanGPT2
	case llama3Pattern:
		return func(s string, i int) int { return scanLlama3(s, i, 3) }
	case qwen2Pattern:
		return func(s string, i int) int { return scanLlama3(s, i, 1) }
	}
	return nil
}

// scanSplit cuts w into the consecutive matches of sc. The expressions above match every
// character, so the pieces cover w.
func scanSplit(sc scanner, w string) []string {
	var out []string
	for i := 0; i < len(w); {
		j := sc(w, i)
		if j <= i { // cannot happen for the expressions above; never loop forever
			j = i + runeLen(w, i)
		}
		out = append(out, w[i:j])
		i = j
	}
	return out
}

func runeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	return utf8.DecodeRuneInString(s[i:])
}

func runeLen(s string, i int) int {
	_, n := utf8.DecodeRuneInString(s[i:])
	return n
}

func isL(r rune) bool     { return r >= 0 && unicode.IsLetter(r) }
func isN(r rune) bool     { return r >= 0 && unicode.IsNumber(r) }
func isS(r rune) bool     { return r >= 0 && unicode.IsSpace(r) }
func isOther(r rune) bool { return r >= 0 && !isS(r) && !isL(r) && !isN(r) }

// span extends from i over runes satisfying ok, at most max runes (max < 0: no limit).
func span(s string, i int, ok func(rune) bool, max int) int {
	for n := 0; max < 0 || n < max; n++ {
		r, size := runeAt(s, i)
		if size == 0 || !ok(r) {
			break
		}
		i += size
	}
	return i
}

// contraction returns the end of 's 't 're 've 'm 'll 'd at i, or i.
func contraction(s string, i int, fold bool) int {
	if i >= len(s) || s[i] != '\'' {
		return i
	}
	lower := func(c byte) byte {
		if fold && c >= 'A' && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	if i+2 < len(s) {
		two := string([]byte{lower(s[i+1]), lower(s[i+2])})
		if two == "re" || two == "ve" || two == "ll" {
			return i + 3
		}
	}
	if i+1 < len(s) {
		switch lower(s[i+1]) {
		case 's', 't', 'm', 'd':
			return i + 2
		}
	}
	return i
}

// whitespace handles `\s+(?!\S)|\s+` at i (which holds white space): the run of white space,
// less its last character when a non-space follows and the run is longer than one.
func whitespace(s string, i int) int {
	j := span(s, i, isS, -1)
	if j == len(s) {
		return j
	}
	_, last := utf8.DecodeLastRuneInString(s[i:j])
	if j-last > i {
		return j - last
	}
	return j
}

// scanGPT2 matches `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
func scanGPT2(s string, i int) int {
	if j := contraction(s, i, false); j > i {
		return j
	}
	k := i
	if s[i] == ' ' {
		k++
	}
	r, _ := runeAt(s, k)
	switch {
	case isL(r):
		return span(s, k, isL, -1)
	case isN(r):
		return span(s, k, isN, -1)
	case isOther(r):
		return span(s, k, isOther, -1)
	}
	return whitespace(s, i)
}

// scanLlama3 matches Llama-3's expression with \p{N}{1,maxDigits}.
func scanLlama3(s string, i int, maxDigits int) int {
	if j := contraction(s, i, true); j > i {
		return j
	}
	r, size := runeAt(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isL(r) {
		return span(s, i, isL, -1)
	}
	if r != '\r' && r != '\n' && !isN(r) {
		if next, _ := runeAt(s, i+size); isL(next) {
			return span(s, i+size, isL, -1)
		}
	}
	// \p{N}{1,n}
	if isN(r) {
		return span(s, i, isN, maxDigits)
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	k := i
	if r == ' ' {
		k++
	}
	if next, _ := runeAt(s, k); isOther(next) {
		j := span(s, k, isOther, -1)
		return span(s, j, func(r rune) bool { return r == '\r' || r == '\n' }, -1)
	}
	// \s*[\r\n]+ : up to the last line break of the white-space run
	j := span(s, i, isS, -1)
	for p := j; p > i; {
		r, n := utf8.DecodeLastRuneInString(s[i:p])
		if r == '\r' || r == '\n' {
			return p
		}
		p -= n
	}
	return whitespace(s, i)
}
