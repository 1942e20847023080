package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strconv"
)

// opt is an optional member of a wire struct. Set is false when the member is absent
// or null (null counts as omitted). A value that does not decode as T does not fail the
// body's decoding: OK stays false and the value is kept, so that the endpoint's
// validation, which knows the parameter's name and the order in which parameters are
// checked, reports it ("max_tokens must be an integer, got a string").
type opt[T any] struct {
	Set bool
	OK  bool // V holds the value
	V   T
	bad json.RawMessage // the value as sent, when !OK
}

// UnmarshalJSON implements json.Unmarshaler; it never fails.
func (o *opt[T]) UnmarshalJSON(b []byte) error {
	*o = opt[T]{}
	if isNull(b) {
		return nil
	}
	o.Set = true
	var err error
	if reflect.TypeFor[T]().Kind() == reflect.Struct && !reflect.PointerTo(reflect.TypeFor[T]()).Implements(unmarshalerType) {
		err = decodeObject(b, &o.V) // nested objects match member names exactly, like the body
	} else {
		err = json.Unmarshal(b, &o.V)
	}
	if err != nil {
		o.V = *new(T)
		o.bad = bytes.Clone(b)
		return nil
	}
	o.OK = true
	return nil
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// kind names the type of the value as sent ("a string"), for error messages.
func (o opt[T]) kind() string { return jsonKind(o.bad) }

// jsonInt is an integer as sent: an integral JSON number within int64 (1, 1.0 and 1e3
// are integers). Anything else is kept in bad for the error message; decoding never
// fails, so that an array of token ids reports the first bad element by its index.
type jsonInt struct {
	N   int64
	bad json.RawMessage
}

// UnmarshalJSON implements json.Unmarshaler; it never fails.
func (i *jsonInt) UnmarshalJSON(b []byte) error {
	*i = jsonInt{}
	if n, ok := parseInt(b); ok {
		i.N = n
		return nil
	}
	i.bad = bytes.Clone(b)
	return nil
}

func (i jsonInt) ok() bool { return i.bad == nil }

func isNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

// jsonKind names a JSON value's type for error messages.
func jsonKind(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// parseInt decodes an integer (an integral JSON number).
func parseInt(v json.RawMessage) (int64, bool) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || !(v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) {
		return 0, false
	}
	if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
		return n, true
	}
	fl, err := strconv.ParseFloat(string(v), 64)
	if err != nil || fl != math.Trunc(fl) || math.Abs(fl) > 1<<53 {
		return 0, false
	}
	return int64(fl), true
}

// check validates a decoded wire struct, keeping the first error: once one check
// failed the others are no-ops, so the parameters are judged in one fixed order.
type check struct{ err error }

func (c *check) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// failed reports whether a check failed.
func (c *check) failed() bool { return c.err != nil }

// integer returns an integer parameter within [lo, hi]; def when omitted.
func (c *check) integer(name string, o opt[jsonInt], def, lo, hi int64) int64 {
	if c.failed() || !o.Set {
		return def
	}
	if !o.V.ok() { // jsonInt takes any JSON value, keeping what is not an integer
		c.fail(intError(name, o.V.bad, lo, hi))
		return def
	}
	if n := o.V.N; n < lo || n > hi {
		c.fail(rangeError(name, lo, hi, strconv.FormatInt(n, 10)))
		return def
	}
	return o.V.N
}

// intError says what is wrong with a value sent for an integer parameter: not a number,
// a number too large to be any count, or not integral.
func intError(name string, v json.RawMessage, lo, hi int64) error {
	if jsonKind(v) != "a number" {
		return InvalidParam(name, "%s must be an integer, got %s", name, jsonKind(v))
	}
	lit := string(bytes.TrimSpace(v))
	if len(lit) > 40 {
		lit = lit[:40] + "..."
	}
	fl, err := strconv.ParseFloat(string(bytes.TrimSpace(v)), 64)
	if (err == nil || errors.Is(err, strconv.ErrRange)) && fl == math.Trunc(fl) {
		// integral but beyond int64 (or beyond 2^53 written with an exponent)
		return rangeError(name, lo, hi, lit)
	}
	return InvalidParam(name, "%s must be an integer, got %s", name, lit)
}

// rangeError says an integer parameter is out of [lo, hi]. The int32 range is only the
// wire's: the engine's rules hold the real limits (max_tokens up to the context, ...),
// which a value past int32 is beyond too, so that range is not given as if it were one.
func rangeError(name string, lo, hi int64, got string) error {
	if lo == minInt32 && hi == maxInt32 {
		return InvalidParam(name, "%s is out of range, got %s", name, got)
	}
	return InvalidParam(name, "%s must be between %d and %d, got %s", name, lo, hi, got)
}

// number returns a number parameter; def when omitted.
func (c *check) number(name string, o opt[float64], def float64) float64 {
	if c.failed() || !o.Set {
		return def
	}
	if !o.OK {
		c.fail(InvalidParam(name, "%s must be a number, got %s", name, o.kind()))
		return def
	}
	return o.V
}

// boolean returns a boolean parameter; def when omitted.
func (c *check) boolean(name string, o opt[bool], def bool) bool {
	if c.failed() || !o.Set {
		return def
	}
	if !o.OK {
		c.fail(InvalidParam(name, "%s must be a boolean, got %s", name, o.kind()))
		return def
	}
	return o.V
}

// str returns a string parameter; ok is false when it is omitted.
func (c *check) str(name string, o opt[string]) (s string, ok bool) {
	if c.failed() || !o.Set {
		return "", false
	}
	if !o.OK {
		c.fail(InvalidParam(name, "%s must be a string, got %s", name, o.kind()))
		return "", false
	}
	return o.V, true
}

// shape checks that a parameter decoded as the JSON type its wire type wants (what
// names it, "an object" or "an array"); false when it is omitted or wrong.
func shape[T any](c *check, name, what string, o opt[T]) bool {
	if c.failed() || !o.Set {
		return false
	}
	if !o.OK {
		c.fail(InvalidParam(name, "%s must be %s, got %s", name, what, o.kind()))
		return false
	}
	return true
}

// tokenIDs decodes token ids (32-bit integers; whether they are in the vocabulary is the
// engine's rule); name is how the array is named in messages ("prompt[1]"), param the
// parameter errors report ("prompt").
func tokenIDs(param, name string, ids []jsonInt) ([]int32, error) {
	out := make([]int32, len(ids))
	for i, id := range ids {
		if !id.ok() {
			return nil, InvalidParam(param, "%s[%d] must be an integer token id, got %s", name, i, jsonKind(id.bad))
		}
		if id.N < minInt32 || id.N > maxInt32 {
			return nil, InvalidParam(param, "%s[%d] = %d is not a token id", name, i, id.N)
		}
		out[i] = int32(id.N)
	}
	return out, nil
}

// tokenIDList returns an optional array of token ids; nil when omitted.
func (c *check) tokenIDList(name string, o opt[[]jsonInt]) []int32 {
	if !shape(c, name, "an array", o) {
		return nil
	}
	ids, err := tokenIDs(name, name, o.V)
	if err != nil {
		c.fail(err)
		return nil
	}
	return ids
}
