package tokenizer

import "unicode/utf8"

// The byte-level alphabet of GPT-2: every byte maps to one printable rune, so that a byte
// string can be written as a Unicode string whose characters are all "visible". Printable
// ASCII and most of Latin-1 map to themselves; the other 68 bytes map to U+0100 and up.
var byteToRune [256]rune

func init() {
	n := rune(0)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = 256 + n
			n++
		}
	}
}

// byteLevelEncode maps every byte of s to its byte-level rune.
func byteLevelEncode(s string) string {
	buf := make([]byte, 0, len(s)*2)
	for i := 0; i < len(s); i++ {
		buf = utf8.AppendRune(buf, byteToRune[s[i]])
	}
	return string(buf)
}

// appendLossy appends b to dst as text, replacing every byte that does not start a valid
// UTF-8 sequence by U+FFFD, one replacement per byte. Because the rule is local to each
// byte, converting a byte string piecewise (at rune boundaries) gives the same text as
// converting it at once, which the incremental detokenizer relies on.
func appendLossy(dst []byte, b []byte) []byte {
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size <= 1 {
			dst = utf8.AppendRune(dst, utf8.RuneError)
			b = b[1:]
			continue
		}
		dst = append(dst, b[:size]...)
		b = b[size:]
	}
	return dst
}

// completePrefix returns the length of the longest prefix of b that can be turned into text
// now: everything except a trailing incomplete (but so far valid) UTF-8 sequence.
func completePrefix(b []byte) int {
	i := 0
	for i < len(b) {
		if !utf8.FullRune(b[i:]) {
			return i
		}
		_, size := utf8.DecodeRune(b[i:])
		i += size
	}
	return i
}
