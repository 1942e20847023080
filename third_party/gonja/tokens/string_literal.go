package tokens

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// DecodeStringLiteral decodes the escapes of a string literal's text (between its quotes)
// as Jinja does, that is as Python's "unicode-escape" codec decodes the text with its
// non-ASCII characters written as backslash escapes: \\ \' \" \a \b \f \n \r \t \v, \ooo
// (octal), \xhh, \uhhhh and \Uhhhhhhhh (code points), a backslash before a newline drops
// both, and any other backslash is kept with the character after it (one that is not
// ASCII then reads as its escape: '\é' is `\xe9`). \N{name} is not supported.
func DecodeStringLiteral(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			b.WriteByte(c)
			i++
			continue
		}
		if i+1 == len(s) {
			return "", fmt.Errorf(`\ at end of string`)
		}
		n := s[i+1]
		i += 2
		switch n {
		case '\n':
		case '\\', '\'', '"':
			b.WriteByte(n)
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := rune(n - '0')
			for k := 0; k < 2 && i < len(s) && s[i] >= '0' && s[i] <= '7'; k++ {
				v = v*8 + rune(s[i]-'0')
				i++
			}
			b.WriteRune(v)
		case 'x', 'u', 'U':
			size := map[byte]int{'x': 2, 'u': 4, 'U': 8}[n]
			if i+size > len(s) {
				return "", fmt.Errorf(`truncated \%c escape`, n)
			}
			v, err := strconv.ParseUint(s[i:i+size], 16, 32)
			if err != nil || strings.ContainsAny(s[i:i+size], "+-_") {
				return "", fmt.Errorf(`truncated \%c escape`, n)
			}
			if v > utf8.MaxRune {
				return "", fmt.Errorf(`illegal Unicode character \%c%s`, n, s[i:i+size])
			}
			b.WriteRune(rune(v))
			i += size
		case 'N':
			return "", fmt.Errorf(`\N{...} escapes are not supported`)
		default:
			b.WriteByte('\\')
			if n < utf8.RuneSelf {
				b.WriteByte(n)
				continue
			}
			// Python escapes a character that is not ASCII before decoding: the
			// backslash written before it escapes the backslash of that escape.
			r, size := utf8.DecodeRuneInString(s[i-1:])
			i += size - 1
			switch {
			case r < 0x100:
				fmt.Fprintf(&b, `x%02x`, r)
			case r < 0x10000:
				fmt.Fprintf(&b, `u%04x`, r)
			default:
				fmt.Fprintf(&b, `U%08x`, r)
			}
		}
	}
	return b.String(), nil
}
