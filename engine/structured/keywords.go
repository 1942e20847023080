package structured

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// maxUnrolled bounds maxLength, maxItems and similar counts the grammar unrolls.
const maxUnrolled = 4096

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
	if n := s.get("nullable"); n != nil && n.kind == 'b' && n.b && !slices.Contains(types, "null") {
		types = append(types, "null")
	}
	for _, t := range types {
		if keywordsByType[t] == nil {
			return nil, fmt.Errorf("unknown type %q", t)
		}
	}
	return types, nil
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
		m := b.seq(b.lit(string(key)), c.colon(), c.value(kv.v, path+"/properties/"+kv.k))
		comma := c.comma()
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
		r, fresh := c.b.rule(name)
		if fresh {
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
	rest := b.repeat(func() frag { return b.seq(c.comma(), item()) }, restLo, restHi)
	body := b.seq(first, rest, c.ws())
	if lo == 0 {
		body = b.opt(body)
	}
	return b.seq(open, body, close)
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
		n, beyond, ok := integerBound(v, exclusive, upper, limit)
		switch {
		case !ok:
			c.bad("%s: %s must be a number (of at most 64 characters, its exponent within ±400)", path, key)
			return false
		case upper && beyond < 0, !upper && beyond > 0:
			c.fail("%s: %s %s leaves no integer of at most %d digits, the most structured output writes", path, key, v.num, maxIntDigits)
			return false
		case beyond != 0: // beyond every integer written: no bound
		case upper:
			hi = min(hi, n)
		default:
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
		digits := c.numeral()
		return c.b.seq(c.b.opt(c.b.lit("-")), digits)
	}
	return c.intRange(lo, hi)
}

// integerBound is the least (upper: the greatest) integer a minimum (maximum) of v
// allows, computed exactly from v's decimal text; beyond is 1 (-1) when that integer is
// above limit (below -limit), n then being 0. ok is false when v is not a number, or
// not one to take exactly.
func integerBound(v *jv, exclusive, upper bool, limit int64) (n int64, beyond int, ok bool) {
	if v.kind != 'n' {
		return 0, 0, false
	}
	f, err := strconv.ParseFloat(string(v.num), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, 0, false
	}
	// Far outside the range (or out of float64's: ±Inf), the float decides.
	if f > 2*float64(limit) {
		return 0, 1, true
	}
	if f < -2*float64(limit) {
		return 0, -1, true
	}
	// Within it the text is taken exactly, unless it is too long or its exponent too
	// large to be a bound anyone writes (and costly to expand).
	if len(v.num) > 64 {
		return 0, 0, false
	}
	if at := strings.IndexAny(string(v.num), "eE"); at >= 0 {
		if e, err := strconv.Atoi(string(v.num[at+1:])); err != nil || e < -400 || e > 400 {
			return 0, 0, false
		}
	}
	r, ok := new(big.Rat).SetString(string(v.num))
	if !ok {
		return 0, 0, false
	}
	var i big.Int
	if upper {
		i.Div(r.Num(), r.Denom()) // floor: the denominator is positive
	} else {
		i.Neg(r.Num()) // ceil(x) = -floor(-x)
		i.Div(&i, r.Denom())
		i.Neg(&i)
	}
	if exclusive && r.IsInt() {
		if upper {
			i.Sub(&i, big.NewInt(1))
		} else {
			i.Add(&i, big.NewInt(1))
		}
	}
	switch n = i.Int64(); {
	case n > limit:
		return 0, 1, true
	case n < -limit:
		return 0, -1, true
	}
	return n, 0, true
}

func isTrue(v *jv) bool { return v != nil && v.kind == 'b' && v.b }
