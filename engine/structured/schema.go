package structured

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// ErrUnsupported marks a schema using a keyword or a combination the compiler does not
// implement (under strict), or one too large to compile. Its message names the keyword.
var ErrUnsupported = errors.New("structured: unsupported schema")

// ErrBadSchema marks a schema that is not valid JSON or not a JSON Schema.
var ErrBadSchema = errors.New("structured: bad schema")

// Whitespace allowed between JSON tokens, at most this many bytes at each place: enough
// for ", " and a newline, few enough that a model cannot pad a reply with it.
const maxWhitespace = 2

// Unbounded repetitions are capped so that numbers stay numbers.
const (
	maxIntDigits  = 16
	maxFracDigits = 16
	maxExpDigits  = 2
)

// maxUnrolled bounds maxLength, maxItems and similar counts the grammar unrolls.
const maxUnrolled = 4096

// CompileSchema compiles a JSON Schema (the "schema" of OpenAI's response_format
// json_schema) into a Grammar for one JSON value that validates against it. With
// strict, a keyword the compiler does not implement is an ErrUnsupported naming it;
// without, it is ignored (as OpenAI does for non-strict schemas).
func CompileSchema(schema []byte, strict bool) (*Grammar, error) {
	root, err := parseOrdered(schema)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSchema, err)
	}
	if root.kind != 'o' && root.kind != 'b' {
		return nil, fmt.Errorf("%w: a schema is an object or a boolean", ErrBadSchema)
	}
	c := &compiler{b: newBuilder(), root: root, strict: strict}
	body := c.value(root, "#")
	for len(c.pending) > 0 && c.err == nil && c.b.err == nil {
		p := c.pending[0]
		c.pending = c.pending[1:]
		c.b.define(p.rule, c.value(p.schema, p.ref))
	}
	return c.finish(body)
}

// CompileJSONObject returns the Grammar of any JSON object (response_format
// json_object).
func CompileJSONObject() *Grammar {
	c := &compiler{b: newBuilder()}
	g, _ := c.finish(c.anyObject())
	return g
}

type compiler struct {
	b       *builder
	root    *jv
	strict  bool
	compact bool // no whitespace between JSON tokens
	// indented takes JSON laid out compact or pretty-printed, as models write tool
	// calls, and nothing else: where a pretty-printer breaks lines (after an opening
	// bracket or a comma, before a closing bracket) nothing, one space, or a newline and
	// up to maxIndent spaces or tabs (one kind); after a colon nothing or one space;
	// before a colon or a comma nothing. Every place is bounded, and so few bytes are
	// free that a hot model cannot spend its max_tokens on layout.
	indented bool
	err      error
	pending  []pendingRule
}

type pendingRule struct {
	rule   int32
	schema *jv
	ref    string
}

func (c *compiler) finish(body frag) (*Grammar, error) {
	if c.err == nil {
		c.err = c.b.err
	}
	if c.err != nil {
		return nil, c.err
	}
	top := c.b.seq(c.ws(), body, c.ws())
	c.b.g.start, c.b.g.final = top.in, top.out
	if c.b.err != nil {
		return nil, c.b.err
	}
	return c.b.g, nil
}

func (c *compiler) fail(format string, args ...any) frag {
	if c.err == nil {
		c.err = fmt.Errorf("%w: %s", ErrUnsupported, fmt.Sprintf(format, args...))
	}
	return c.b.empty()
}

func (c *compiler) bad(format string, args ...any) frag {
	if c.err == nil {
		c.err = fmt.Errorf("%w: %s", ErrBadSchema, fmt.Sprintf(format, args...))
	}
	return c.b.empty()
}

// maxIndent bounds the indentation after a newline in the indented layout (llama.cpp's
// JSON grammars allow as much).
const maxIndent = 20

// ws matches the whitespace allowed where a pretty-printer breaks lines: after '{', '['
// and ',', and before '}' and ']' (and around the whole value).
func (c *compiler) ws() frag {
	if c.compact {
		return c.b.empty()
	}
	if c.indented {
		b := c.b
		spaces := b.repeat(func() frag { return b.lit(" ") }, 0, maxIndent)
		tabs := b.repeat(func() frag { return b.lit("\t") }, 1, maxIndent)
		return b.opt(b.alt(b.lit(" "), b.seq(b.lit("\n"), b.alt(spaces, tabs))))
	}
	return c.b.repeat(func() frag { return c.b.class(' ', ' ', '\n', '\n', '\t', '\t', '\r', '\r') }, 0, maxWhitespace)
}

// wsBefore matches the whitespace allowed before ':' and ',': none in the indented
// layout, where no pretty-printer puts any.
func (c *compiler) wsBefore() frag {
	if c.indented {
		return c.b.empty()
	}
	return c.ws()
}

// wsColon matches the whitespace allowed after ':': one space at most in the indented
// layout.
func (c *compiler) wsColon() frag {
	if c.indented {
		return c.b.opt(c.b.lit(" "))
	}
	return c.ws()
}

// annotation keywords never constrain the value.
var annotations = map[string]bool{"title": true, "description": true, "default": true, "examples": true,
	"$schema": true, "$id": true, "$comment": true, "deprecated": true, "readOnly": true, "writeOnly": true,
	"$defs": true, "definitions": true, "strict": true}

// keywordsByType are the validation keywords each type implements.
var keywordsByType = map[string]map[string]bool{
	"object":  {"properties": true, "required": true, "additionalProperties": true},
	"array":   {"items": true, "minItems": true, "maxItems": true},
	"string":  {"minLength": true, "maxLength": true},
	"integer": {"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true},
	"number":  {},
	"boolean": {},
	"null":    {},
}

var jsonTypes = []string{"object", "array", "string", "integer", "number", "boolean", "null"}

// value compiles schema s (at JSON pointer path) into a fragment matching one value.
func (c *compiler) value(s *jv, path string) frag {
	if c.err != nil {
		return c.b.empty()
	}
	switch s.kind {
	case 'b':
		if !s.b {
			return c.fail("%s: the schema false matches no value", path)
		}
		return c.anyValue()
	case 'o':
	default:
		return c.bad("%s: a schema must be an object or a boolean", path)
	}
	if ref := s.get("$ref"); ref != nil {
		if ref.kind != 's' {
			return c.bad("%s: $ref must be a string", path)
		}
		for _, kv := range s.obj {
			if kv.k != "$ref" && !annotations[kv.k] && c.strict {
				return c.fail("%s: %s next to $ref", path, kv.k)
			}
		}
		return c.ref(ref.str, path)
	}
	if v := s.get("const"); v != nil {
		return c.b.lit(v.compact())
	}
	if v := s.get("enum"); v != nil {
		if v.kind != 'a' || len(v.arr) == 0 {
			return c.bad("%s: enum must be a non-empty array", path)
		}
		var alts []frag
		for _, e := range v.arr {
			alts = append(alts, c.b.lit(e.compact()))
		}
		return c.b.alt(alts...)
	}
	if v := s.get("anyOf"); v != nil {
		if v.kind != 'a' || len(v.arr) == 0 {
			return c.bad("%s: anyOf must be a non-empty array", path)
		}
		var alts []frag
		for i, sub := range v.arr {
			alts = append(alts, c.value(sub, fmt.Sprintf("%s/anyOf/%d", path, i)))
		}
		return c.b.alt(alts...)
	}
	types, err := schemaTypes(s)
	if err != nil {
		return c.bad("%s: %v", path, err)
	}
	// Keywords no type of this schema implements.
	for _, kv := range s.obj {
		if annotations[kv.k] || kv.k == "type" || kv.k == "nullable" {
			continue
		}
		known := false
		for _, t := range types {
			known = known || keywordsByType[t][kv.k]
		}
		if !known && c.strict {
			return c.fail("%s: keyword %q is not supported", path, kv.k)
		}
	}
	var alts []frag
	for _, t := range types {
		alts = append(alts, c.typed(s, t, path))
	}
	if len(alts) == 1 {
		return alts[0]
	}
	return c.b.alt(alts...)
}

// schemaTypes returns the types s allows: its "type" (a name or a list), plus null
// when "nullable" is true, or every type when it names none (inferred from the
// keywords present when they belong to one type).
func schemaTypes(s *jv) ([]string, error) {
	var types []string
	switch t := s.get("type"); {
	case t == nil:
		for _, tn := range jsonTypes {
			for _, kv := range s.obj {
				if keywordsByType[tn][kv.k] {
					types = append(types, tn)
					break
				}
			}
		}
		if len(types) == 0 {
			types = append(types, jsonTypes...)
		}
	case t.kind == 's':
		types = []string{t.str}
	case t.kind == 'a' && len(t.arr) > 0:
		for _, e := range t.arr {
			if e.kind != 's' {
				return nil, errors.New("type lists hold type names")
			}
			types = append(types, e.str)
		}
	default:
		return nil, errors.New("type must be a name or a non-empty list of names")
	}
	if n := s.get("nullable"); n != nil && n.kind == 'b' && n.b && !contains(types, "null") {
		types = append(types, "null")
	}
	for _, t := range types {
		if keywordsByType[t] == nil {
			return nil, fmt.Errorf("unknown type %q", t)
		}
	}
	return types, nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func (c *compiler) typed(s *jv, t, path string) frag {
	switch t {
	case "object":
		return c.object(s, path)
	case "array":
		return c.array(s, path)
	case "string":
		lo, hi, ok := c.bounds(s, "minLength", "maxLength", path)
		if !ok {
			return c.b.empty()
		}
		return c.str(lo, hi)
	case "integer":
		return c.integer(s, path)
	case "number":
		return c.number()
	case "boolean":
		return c.b.alt(c.b.lit("true"), c.b.lit("false"))
	default:
		return c.b.lit("null")
	}
}

// bounds reads a pair of count keywords (minLength/maxLength, minItems/maxItems);
// hi is -1 when unbounded.
func (c *compiler) bounds(s *jv, minKey, maxKey, path string) (lo, hi int, ok bool) {
	lo, hi = 0, -1
	if v := s.get(minKey); v != nil {
		n, err := v.count()
		if err != nil {
			c.bad("%s: %s: %v", path, minKey, err)
			return 0, 0, false
		}
		lo = n
	}
	if v := s.get(maxKey); v != nil {
		n, err := v.count()
		if err != nil {
			c.bad("%s: %s: %v", path, maxKey, err)
			return 0, 0, false
		}
		hi = n
	}
	if hi >= 0 && hi < lo {
		c.bad("%s: %s %d is below %s %d", path, maxKey, hi, minKey, lo)
		return 0, 0, false
	}
	if lo > maxUnrolled || hi > maxUnrolled {
		c.fail("%s: %s/%s above %d", path, minKey, maxKey, maxUnrolled)
		return 0, 0, false
	}
	return lo, hi, true
}

// ref compiles a $ref to the root ("#") or to a definition ("#/$defs/name",
// "#/definitions/name", any JSON pointer into the root) as a call of a rule.
func (c *compiler) ref(ref, path string) frag {
	if c.root == nil || !strings.HasPrefix(ref, "#") {
		return c.fail("%s: $ref %q: only references into the schema itself (#...) are supported", path, ref)
	}
	target := c.root
	if ref != "#" {
		if !strings.HasPrefix(ref, "#/") {
			return c.fail("%s: $ref %q is not a JSON pointer", path, ref)
		}
		for _, part := range strings.Split(ref[2:], "/") {
			part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
			var next *jv
			switch target.kind {
			case 'o':
				next = target.get(part)
			case 'a':
				if i, err := strconv.Atoi(part); err == nil && i >= 0 && i < len(target.arr) {
					next = target.arr[i]
				}
			}
			if next == nil {
				return c.bad("%s: $ref %q points to nothing", path, ref)
			}
			target = next
		}
	}
	name := "ref:" + ref
	_, known := c.b.g.rules[name]
	r := c.b.rule(name)
	if !known {
		c.pending = append(c.pending, pendingRule{rule: r, schema: target, ref: ref})
	}
	return c.b.call(r)
}

// object compiles an object schema: the listed properties in schema order, the
// required ones always, the others optionally, with commas placed right. Other keys
// are never generated (an object without them validates whatever
// additionalProperties says); an object schema without properties is any object.
func (c *compiler) object(s *jv, path string) frag {
	props := s.get("properties")
	if ap := s.get("additionalProperties"); ap != nil && ap.kind != 'b' && c.strict {
		return c.fail("%s: additionalProperties as a schema is not supported (use true or false)", path)
	}
	if props == nil {
		if ap := s.get("additionalProperties"); ap != nil && ap.kind == 'b' && !ap.b {
			return c.b.seq(c.b.lit("{"), c.ws(), c.b.lit("}"))
		}
		return c.anyObject()
	}
	if props.kind != 'o' {
		return c.bad("%s: properties must be an object", path)
	}
	required := map[string]bool{}
	if r := s.get("required"); r != nil {
		if r.kind != 'a' {
			return c.bad("%s: required must be an array", path)
		}
		for _, e := range r.arr {
			if e.kind != 's' {
				return c.bad("%s: required lists property names", path)
			}
			if props.get(e.str) == nil {
				return c.fail("%s: required property %q has no schema in properties", path, e.str)
			}
			required[e.str] = true
		}
	}
	b := c.b
	open := b.seq(b.lit("{"), c.ws())
	// none[i] / some[i]: before property i, with no property / some property written.
	none, some := open.out, b.node()
	for _, kv := range props.obj {
		key, _ := json.Marshal(kv.k)
		// One copy of the member, entered directly when it is the first one written
		// and after a comma otherwise.
		start := b.node()
		m := b.seq(b.lit(string(key)), c.wsBefore(), b.lit(":"), c.wsColon(), c.value(kv.v, path+"/properties/"+kv.k))
		comma := b.seq(c.wsBefore(), b.lit(","), c.ws())
		nextNone, nextSome := b.node(), b.node()
		b.eps(none, start)
		b.eps(some, comma.in)
		b.eps(comma.out, start)
		b.eps(start, m.in)
		b.eps(m.out, nextSome)
		if !required[kv.k] {
			b.eps(none, nextNone)
			b.eps(some, nextSome)
		}
		none, some = nextNone, nextSome
	}
	end := b.seq(c.ws(), b.lit("}"))
	b.eps(some, end.in)
	if len(required) == 0 {
		b.eps(none, end.in)
	}
	return frag{open.in, end.out}
}

// array compiles an array schema with items and minItems / maxItems.
func (c *compiler) array(s *jv, path string) frag {
	lo, hi, ok := c.bounds(s, "minItems", "maxItems", path)
	if !ok {
		return c.b.empty()
	}
	items := s.get("items")
	item := c.anyValue
	if items != nil {
		// The item schema is a rule, so the copies a count unrolls are only calls.
		name := "items:" + path
		_, known := c.b.g.rules[name]
		r := c.b.rule(name)
		if !known {
			c.b.define(r, c.value(items, path+"/items"))
		}
		item = func() frag { return c.b.call(r) }
	}
	b := c.b
	open := b.seq(b.lit("["), c.ws())
	close := b.lit("]")
	if hi == 0 {
		return b.seq(open, close)
	}
	first := item()
	restLo, restHi := max(lo-1, 0), hi-1
	if hi < 0 {
		restHi = -1
	}
	rest := b.repeat(func() frag { return b.seq(c.wsBefore(), b.lit(","), c.ws(), item()) }, restLo, restHi)
	body := b.seq(first, rest, c.ws())
	if lo == 0 {
		body = b.opt(body)
	}
	return b.seq(open, body, close)
}

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
	digit := func() frag { return b.class('0', '9') }
	intPart := b.alt(b.lit("0"), b.seq(b.class('1', '9'), b.repeat(digit, 0, maxIntDigits-1)))
	frac := b.opt(b.seq(b.lit("."), b.repeat(digit, 1, maxFracDigits)))
	exp := b.opt(b.seq(b.class('e', 'e', 'E', 'E'), b.opt(b.class('+', '+', '-', '-')), b.repeat(digit, 1, maxExpDigits)))
	return b.seq(b.opt(b.lit("-")), intPart, frac, exp)
}

// integer matches a JSON integer within the schema's bounds.
func (c *compiler) integer(s *jv, path string) frag {
	limit := int64(math.Pow10(maxIntDigits)) - 1
	lo, hi := -limit, limit
	bound := func(key string, exclusive, upper bool) bool {
		v := s.get(key)
		if v == nil {
			return true
		}
		if v.kind == 'b' { // draft-4 exclusiveMinimum: true
			return true
		}
		f, ok := v.number()
		if !ok {
			c.bad("%s: %s must be a number", path, key)
			return false
		}
		var n int64
		if upper {
			n = int64(math.Floor(f))
			if exclusive && float64(n) == f {
				n--
			}
			hi = min(hi, n)
		} else {
			n = int64(math.Ceil(f))
			if exclusive && float64(n) == f {
				n++
			}
			lo = max(lo, n)
		}
		return true
	}
	if !bound("minimum", isTrue(s.get("exclusiveMinimum")), false) || !bound("maximum", isTrue(s.get("exclusiveMaximum")), true) ||
		!bound("exclusiveMinimum", true, false) || !bound("exclusiveMaximum", true, true) {
		return c.b.empty()
	}
	if lo > hi {
		return c.bad("%s: no integer lies within its bounds", path)
	}
	if lo == -limit && hi == limit {
		b := c.b
		digits := b.alt(b.lit("0"), b.seq(b.class('1', '9'), b.repeat(func() frag { return b.class('0', '9') }, 0, maxIntDigits-1)))
		return b.seq(b.opt(b.lit("-")), digits)
	}
	return c.intRange(lo, hi)
}

func isTrue(v *jv) bool { return v != nil && v.kind == 'b' && v.b }

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
		return b.seq(b.class(lo[0], hi[0]), b.repeat(func() frag { return b.class('0', '9') }, n, n))
	}
	if lo[0] == hi[0] {
		return b.seq(b.lit(lo[:1]), c.sameLength(lo[1:], hi[1:]))
	}
	alts := []frag{b.seq(b.lit(lo[:1]), c.sameLength(lo[1:], strings.Repeat("9", n)))}
	if hi[0]-lo[0] > 1 {
		alts = append(alts, b.seq(b.class(lo[0]+1, hi[0]-1), b.repeat(func() frag { return b.class('0', '9') }, n, n)))
	}
	alts = append(alts, b.seq(b.lit(hi[:1]), c.sameLength(strings.Repeat("0", n), hi[1:])))
	return b.alt(alts...)
}

// anyValue calls the rule matching any JSON value.
func (c *compiler) anyValue() frag {
	const name = "any"
	_, known := c.b.g.rules[name]
	r := c.b.rule(name)
	if !known {
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
		return b.seq(c.str(0, -1), c.wsBefore(), b.lit(":"), c.wsColon(), c.anyValue())
	}
	more := b.star(func() frag { return b.seq(c.wsBefore(), b.lit(","), c.ws(), member()) })
	return b.seq(b.lit("{"), c.ws(), b.opt(b.seq(member(), more, c.ws())), b.lit("}"))
}

// anyArray matches any JSON array.
func (c *compiler) anyArray() frag {
	b := c.b
	more := b.star(func() frag { return b.seq(c.wsBefore(), b.lit(","), c.ws(), c.anyValue()) })
	return b.seq(b.lit("["), c.ws(), b.opt(b.seq(c.anyValue(), more, c.ws())), b.lit("]"))
}

// jv is a JSON value that keeps the order of object keys (schemas list properties in
// the order the output should have them).
type jv struct {
	kind byte // 'o' object, 'a' array, 's' string, 'n' number, 'b' boolean, 'z' null
	obj  []member
	arr  []*jv
	str  string
	num  json.Number
	b    bool
}

type member struct {
	k string
	v *jv
}

func (v *jv) get(k string) *jv {
	if v == nil || v.kind != 'o' {
		return nil
	}
	for _, m := range v.obj {
		if m.k == k {
			return m.v
		}
	}
	return nil
}

func (v *jv) number() (float64, bool) {
	if v.kind != 'n' {
		return 0, false
	}
	f, err := v.num.Float64()
	return f, err == nil
}

func (v *jv) count() (int, error) {
	f, ok := v.number()
	if !ok || f < 0 || f != math.Trunc(f) || f > math.MaxInt32 {
		return 0, errors.New("must be a non-negative integer")
	}
	return int(f), nil
}

// compact returns v as compact JSON, object keys in their order.
func (v *jv) compact() string {
	var buf bytes.Buffer
	v.write(&buf)
	return buf.String()
}

func (v *jv) write(buf *bytes.Buffer) {
	switch v.kind {
	case 'o':
		buf.WriteByte('{')
		for i, m := range v.obj {
			if i > 0 {
				buf.WriteByte(',')
			}
			k, _ := json.Marshal(m.k)
			buf.Write(k)
			buf.WriteByte(':')
			m.v.write(buf)
		}
		buf.WriteByte('}')
	case 'a':
		buf.WriteByte('[')
		for i, e := range v.arr {
			if i > 0 {
				buf.WriteByte(',')
			}
			e.write(buf)
		}
		buf.WriteByte(']')
	case 's':
		s, _ := json.Marshal(v.str)
		buf.Write(s)
	case 'n':
		buf.WriteString(canonicalNumber(v.num))
	case 'b':
		buf.WriteString(strconv.FormatBool(v.b))
	default:
		buf.WriteString("null")
	}
}

// canonicalNumber writes integers without a fraction and others as Go formats them.
func canonicalNumber(n json.Number) string {
	if r, ok := new(big.Rat).SetString(string(n)); ok && r.IsInt() {
		return r.Num().String()
	}
	return string(n)
}

// parseOrdered decodes JSON keeping object key order; duplicate keys are an error.
func parseOrdered(data []byte) (*jv, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := parseValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("trailing data after the schema")
	}
	return v, nil
}

const maxSchemaDepth = 64

func parseValue(dec *json.Decoder, depth int) (*jv, error) {
	if depth > maxSchemaDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxSchemaDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			v := &jv{kind: 'o'}
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k := kt.(string)
				if seen[k] {
					return nil, fmt.Errorf("duplicate key %q", k)
				}
				seen[k] = true
				e, err := parseValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				v.obj = append(v.obj, member{k, e})
			}
			_, err := dec.Token()
			return v, err
		case '[':
			v := &jv{kind: 'a'}
			for dec.More() {
				e, err := parseValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				v.arr = append(v.arr, e)
			}
			_, err := dec.Token()
			return v, err
		}
	case string:
		return &jv{kind: 's', str: t}, nil
	case json.Number:
		return &jv{kind: 'n', num: t}, nil
	case bool:
		return &jv{kind: 'b', b: t}, nil
	case nil:
		return &jv{kind: 'z'}, nil
	}
	return nil, fmt.Errorf("unexpected token %v", tok)
}

// sortedKeys is used by tests and error messages.
func sortedKeys(m map[string]bool) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
