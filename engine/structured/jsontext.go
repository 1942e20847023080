package structured

import (
	"math"
	"strconv"
	"strings"
)

// Unbounded repetitions are capped so that numbers stay numbers.
const (
	maxIntDigits  = 16
	maxFracDigits = 16
	maxExpDigits  = 2
)

// str matches a JSON string of lo to hi characters (hi < 0: unbounded), a character
// being one UTF-8 sequence or one escape.
func (c *compiler) str(lo, hi int) frag {
	b := c.b
	open, close := b.lit(`"`), b.lit(`"`)
	if hi < 0 {
		loop := b.star(c.char)
		if b.err == nil {
			b.g.nodes[loop.in].loop = true
		}
		return b.seq(open, b.repeat(c.char, lo, lo), loop, close)
	}
	// pos[i] is the start of character i: it may close the string once lo characters
	// are written, and records how many more characters may follow.
	prev := open.out
	for i := 0; i <= hi && b.err == nil; i++ {
		pos := b.node()
		b.g.nodes[pos].left = int32(hi - i)
		b.eps(prev, pos)
		if i >= lo {
			b.eps(pos, close.in)
		}
		if i < hi {
			ch := c.char()
			b.eps(pos, ch.in)
			prev = ch.out
		}
	}
	return frag{open.in, close.out}
}

// char matches one JSON string character: printable ASCII but '"' and '\', a well-formed
// UTF-8 sequence of two to four bytes, or an escape.
func (c *compiler) char() frag {
	b := c.b
	cont := func() frag { return b.class(0x80, 0xBF) }
	hex := func() frag { return b.class('0', '9', 'a', 'f', 'A', 'F') }
	// Well-formed UTF-8 only (Unicode's table 3-7: no overlong forms, no surrogates,
	// nothing above U+10FFFF), so a decoder counts exactly the characters counted here.
	return b.alt(
		b.class(0x20, 0x21, 0x23, 0x5B, 0x5D, 0x7E),
		b.seq(b.class(0xC2, 0xDF), cont()),
		b.seq(b.lit("\xE0"), b.class(0xA0, 0xBF), cont()),
		b.seq(b.class(0xE1, 0xEC, 0xEE, 0xEF), cont(), cont()),
		b.seq(b.lit("\xED"), b.class(0x80, 0x9F), cont()),
		b.seq(b.lit("\xF0"), b.class(0x90, 0xBF), cont(), cont()),
		b.seq(b.class(0xF1, 0xF3), cont(), cont(), cont()),
		b.seq(b.lit("\xF4"), b.class(0x80, 0x8F), cont(), cont()),
		b.seq(b.lit(`\`), b.alt(b.class('"', '"', '\\', '\\', '/', '/', 'b', 'b', 'f', 'f', 'n', 'n', 'r', 'r', 't', 't'),
			b.seq(b.lit("u"), hex(), hex(), hex(), hex()))),
	)
}

// number matches a JSON number with bounded digit counts.
func (c *compiler) number() frag {
	b := c.b
	intPart := c.numeral()
	frac := b.opt(b.seq(b.lit("."), c.digits(1, maxFracDigits)))
	exp := b.opt(b.seq(b.class('e', 'e', 'E', 'E'), b.opt(b.class('+', '+', '-', '-')), c.digits(1, maxExpDigits)))
	return b.seq(b.opt(b.lit("-")), intPart, frac, exp)
}

// numeral matches a JSON number's integer part: 0, or up to maxIntDigits digits without a
// leading zero.
func (c *compiler) numeral() frag {
	b := c.b
	return b.alt(b.lit("0"), b.seq(b.class('1', '9'), c.digits(0, maxIntDigits-1)))
}

// digits matches lo to hi decimal digits.
func (c *compiler) digits(lo, hi int) frag {
	return c.b.repeat(func() frag { return c.b.class('0', '9') }, lo, hi)
}

// intRange matches the decimal integers in [lo, hi].
func (c *compiler) intRange(lo, hi int64) frag {
	b := c.b
	var alts []frag
	if lo < 0 {
		neg := c.natRange(max(1, -min(hi, -1)), -lo)
		alts = append(alts, b.seq(b.lit("-"), neg))
	}
	if hi >= 0 {
		alts = append(alts, c.natRange(max(lo, 0), hi))
	}
	if len(alts) == 1 {
		return alts[0]
	}
	return b.alt(alts...)
}

// natRange matches the decimal numerals (no leading zeros) of [lo, hi], 0 <= lo <= hi.
func (c *compiler) natRange(lo, hi int64) frag {
	var alts []frag
	for l := len(strconv.FormatInt(lo, 10)); l <= len(strconv.FormatInt(hi, 10)); l++ {
		from, to := int64(0), int64(math.Pow10(l))-1
		if l > 1 {
			from = int64(math.Pow10(l - 1))
		}
		from, to = max(from, lo), min(to, hi)
		if from <= to {
			alts = append(alts, c.sameLength(strconv.FormatInt(from, 10), strconv.FormatInt(to, 10)))
		}
	}
	return c.b.alt(alts...)
}

// sameLength matches the numerals between lo and hi, which have the same length.
func (c *compiler) sameLength(lo, hi string) frag {
	b := c.b
	if len(lo) == 1 {
		return b.class(lo[0], hi[0])
	}
	n := len(lo) - 1
	if strings.Trim(lo[1:], "0") == "" && strings.Trim(hi[1:], "9") == "" {
		return b.seq(b.class(lo[0], hi[0]), c.digits(n, n))
	}
	if lo[0] == hi[0] {
		return b.seq(b.lit(lo[:1]), c.sameLength(lo[1:], hi[1:]))
	}
	alts := []frag{b.seq(b.lit(lo[:1]), c.sameLength(lo[1:], strings.Repeat("9", n)))}
	if hi[0]-lo[0] > 1 {
		alts = append(alts, b.seq(b.class(lo[0]+1, hi[0]-1), c.digits(n, n)))
	}
	alts = append(alts, b.seq(b.lit(hi[:1]), c.sameLength(strings.Repeat("0", n), hi[1:])))
	return b.alt(alts...)
}

// anyValue calls the rule matching any JSON value.
func (c *compiler) anyValue() frag {
	const name = "any"
	r, fresh := c.b.rule(name)
	if fresh {
		b := c.b
		c.b.define(r, b.alt(c.anyObject(), c.anyArray(), c.str(0, -1), c.number(),
			b.lit("true"), b.lit("false"), b.lit("null")))
	}
	return c.b.call(r)
}

// anyObject matches any JSON object.
func (c *compiler) anyObject() frag {
	b := c.b
	member := func() frag {
		return b.seq(c.str(0, -1), c.colon(), c.anyValue())
	}
	more := b.star(func() frag { return b.seq(c.comma(), member()) })
	return b.seq(b.lit("{"), c.ws(), b.opt(b.seq(member(), more, c.ws())), b.lit("}"))
}

// anyArray matches any JSON array.
func (c *compiler) anyArray() frag {
	b := c.b
	more := b.star(func() frag { return b.seq(c.comma(), c.anyValue()) })
	return b.seq(b.lit("["), c.ws(), b.opt(b.seq(c.anyValue(), more, c.ws())), b.lit("]"))
}
