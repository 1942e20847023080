package tokenizer

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// jsonScanner reads JSON from s at i: the small reader parseFast (fastload.go) reads
// tokenizer.json's vocab and merges with.
type jsonScanner struct {
	s []byte
	i int
}

func (p *jsonScanner) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// wsThen skips white space and returns true (for use in conditions).
func (p *jsonScanner) wsThen() bool { p.ws(); return true }

func (p *jsonScanner) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *jsonScanner) eat(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

// colon reads the ':' after an object key and the white space around it.
func (p *jsonScanner) colon() bool {
	p.ws()
	ok := p.eat(':')
	p.ws()
	return ok
}

// str reads a string. Strings without escapes are slices of s; others are decoded into
// new memory.
func (p *jsonScanner) str() ([]byte, bool) {
	if !p.eat('"') {
		return nil, false
	}
	s := p.s
	start := p.i
	escaped, nonASCII := false, false
	i := start
	for {
		if i >= len(s) {
			return nil, false
		}
		c := s[i]
		if c == '"' {
			break
		}
		switch {
		case c == '\\':
			escaped = true
			i += 2
			continue
		case c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			nonASCII = true
		}
		i++
	}
	p.i = i + 1
	raw := s[start:i:i]
	if !escaped && (!nonASCII || utf8.Valid(raw)) {
		return raw, true
	}
	if nonASCII && !utf8.Valid(raw) || bytes.Contains(raw, []byte(`\u`)) {
		// Replacement of bad UTF-8 and \u escapes (surrogates): as encoding/json does.
		var out string
		if err := json.Unmarshal(s[start-1:i+1], &out); err != nil {
			return nil, false
		}
		return []byte(out), true
	}
	buf := make([]byte, 0, len(raw))
	for j := 0; j < len(raw); j++ {
		c := raw[j]
		if c != '\\' {
			buf = append(buf, c)
			continue
		}
		j++
		switch raw[j] {
		case '"', '\\', '/':
			buf = append(buf, raw[j])
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		default:
			return nil, false
		}
	}
	return buf, true
}

// int reads a JSON integer that fits in 32 bits and is followed by a delimiter (so not a
// fraction or an exponent, which encoding/json refuses for an int).
func (p *jsonScanner) int() (int32, bool) {
	s := p.s
	i := p.i
	neg := i < len(s) && s[i] == '-'
	if neg {
		i++
	}
	start := i
	var v int64
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		v = v*10 + int64(s[i]-'0')
		if v > 1<<31 {
			return 0, false
		}
		i++
	}
	n := i - start
	if n == 0 || (n > 1 && s[start] == '0') {
		return 0, false
	}
	if i < len(s) && (s[i] == '.' || s[i] == 'e' || s[i] == 'E') {
		return 0, false
	}
	if neg {
		v = -v
	}
	if v > 1<<31-1 || v < -1<<31 {
		return 0, false
	}
	p.i = i
	return int32(v), true
}

// skipValue returns the end of the JSON value at s[i:] (after white space) and, for an
// object or array, how many members it has. It only follows strings and nesting, without
// checking the grammar: whatever it skips is checked by whoever reads it.
func skipValue(s []byte, i int) (end, count int, ok bool) {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	if i >= len(s) {
		return 0, 0, false
	}
	switch s[i] {
	case '{', '[':
	case '"':
		end, ok := skipString(s, i)
		return end, 0, ok
	default: // a number, true, false or null
		j := i
		for j < len(s) {
			c := s[j]
			if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
				break
			}
			j++
		}
		return j, 0, j > i
	}
	depth := 0
	empty := true
	for i < len(s) {
		c := s[i]
		switch c {
		case '"':
			var ok bool
			if i, ok = skipString(s, i); !ok {
				return 0, 0, false
			}
			empty = false
			continue
		case '{', '[':
			if depth == 1 {
				empty = false
			}
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				if !empty {
					count++
				}
				return i + 1, count, true
			}
		case ',':
			if depth == 1 {
				count++
			}
		case ' ', '\t', '\n', '\r':
		default:
			empty = false
		}
		i++
	}
	return 0, 0, false
}

// skipString returns the end of the string that starts at s[i] ('"').
func skipString(s []byte, i int) (int, bool) {
	for i++; i < len(s); i++ {
		switch s[i] {
		case '"':
			return i + 1, true
		case '\\':
			i++
		}
	}
	return 0, false
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
