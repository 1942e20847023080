package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// fields holds a request body's top-level members, each decoded lazily by the typed
// getters below so that a wrong type is reported with the parameter's name
// (`"max_tokens":"ten"` -> 400 naming max_tokens). Unknown members are ignored.
// A member whose value is null counts as omitted.
type fields struct {
	m      map[string]json.RawMessage
	prefix string // prepended to member names in errors ("stream_options.")
	err    error  // first error; every getter is a no-op after it
}

// pname is a member's name as errors report it.
func (f *fields) pname(name string) string { return f.prefix + name }

// readBody reads the request body (bounded by the body-limit middleware) and splits it
// into top-level members. It fails with a 400 for anything but a JSON object, with a 413
// when the body is over the limit and with a 415 for a compressed body.
func readBody(r *http.Request) (*fields, error) {
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		// RFC 9110 section 8.4.1: a server refuses an encoding it does not decode with 415.
		return nil, errorf(errContentEncoding, "Content-Encoding %q is not supported; send the JSON body uncompressed", enc)
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errorf(errBodyTooLarge, "request body is larger than %d bytes", mbe.Limit)
		}
		return nil, invalidParam("", "could not read the request body: %v", err)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, invalidParam("", "the request body is empty; expected a JSON object")
	}
	if data[0] != '{' {
		return nil, invalidParam("", "the request body must be a JSON object")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, invalidParam("", "the request body is not valid JSON: %v", err)
	}
	return &fields{m: m}, nil
}

// wrappedErr carries a message and a sentinel to classify.
type wrappedErr struct {
	msg  string
	kind error
}

func (e *wrappedErr) Error() string { return e.msg }
func (e *wrappedErr) Unwrap() error { return e.kind }

func errorf(kind error, format string, args ...any) error {
	return &wrappedErr{msg: fmt.Sprintf(format, args...), kind: kind}
}

// raw returns a member's JSON, or nil when it is absent or null.
func (f *fields) raw(name string) json.RawMessage {
	if f.err != nil {
		return nil
	}
	v, ok := f.m[name]
	if !ok || isNull(v) {
		return nil
	}
	return v
}

// has reports whether a member is present and not null.
func (f *fields) has(name string) bool { return f.raw(name) != nil }

func (f *fields) fail(err error) {
	if f.err == nil {
		f.err = err
	}
}

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

// int reads an integer member within [lo, hi]; def when omitted.
func (f *fields) int(name string, def, lo, hi int64) int64 {
	v := f.raw(name)
	if v == nil {
		return def
	}
	n, ok := parseInt(v)
	if !ok {
		if jsonKind(v) != "a number" {
			f.fail(invalidParam(f.pname(name), "%s must be an integer, got %s", f.pname(name), jsonKind(v)))
			return def
		}
		lit := string(bytes.TrimSpace(v))
		if len(lit) > 40 {
			lit = lit[:40] + "..."
		}
		fl, err := strconv.ParseFloat(string(bytes.TrimSpace(v)), 64)
		if (err == nil || errors.Is(err, strconv.ErrRange)) && fl == math.Trunc(fl) {
			// integral but beyond int64 (or beyond 2^53 written with an exponent)
			f.fail(invalidParam(f.pname(name), "%s must be between %d and %d, got %s", f.pname(name), lo, hi, lit))
			return def
		}
		f.fail(invalidParam(f.pname(name), "%s must be an integer, got %s", f.pname(name), lit))
		return def
	}
	if n < lo || n > hi {
		f.fail(invalidParam(f.pname(name), "%s must be between %d and %d, got %d", f.pname(name), lo, hi, n))
		return def
	}
	return n
}

// float reads a number member within [lo, hi]; def when omitted.
func (f *fields) float(name string, def, lo, hi float64) float64 {
	v := f.raw(name)
	if v == nil {
		return def
	}
	var x float64
	if jsonKind(v) != "a number" || json.Unmarshal(v, &x) != nil {
		f.fail(invalidParam(f.pname(name), "%s must be a number, got %s", f.pname(name), jsonKind(v)))
		return def
	}
	if x < lo || x > hi || math.IsNaN(x) {
		f.fail(invalidParam(f.pname(name), "%s must be between %g and %g, got %g", f.pname(name), lo, hi, x))
		return def
	}
	return x
}

// bool reads a boolean member; def when omitted.
func (f *fields) bool(name string, def bool) bool {
	v := f.raw(name)
	if v == nil {
		return def
	}
	var b bool
	if jsonKind(v) != "a boolean" || json.Unmarshal(v, &b) != nil {
		f.fail(invalidParam(f.pname(name), "%s must be a boolean, got %s", f.pname(name), jsonKind(v)))
		return def
	}
	return b
}

// string reads a string member; ok is false when omitted.
func (f *fields) string(name string) (s string, ok bool) {
	v := f.raw(name)
	if v == nil {
		return "", false
	}
	if jsonKind(v) != "a string" || json.Unmarshal(v, &s) != nil {
		f.fail(invalidParam(f.pname(name), "%s must be a string, got %s", f.pname(name), jsonKind(v)))
		return "", false
	}
	return s, true
}

// object decodes an object member into dst (a pointer to a map or struct); false when omitted.
func (f *fields) object(name string, dst any) bool {
	v := f.raw(name)
	if v == nil {
		return false
	}
	if jsonKind(v) != "an object" || json.Unmarshal(v, dst) != nil {
		f.fail(invalidParam(f.pname(name), "%s must be an object, got %s", f.pname(name), jsonKind(v)))
		return false
	}
	return true
}

// sub returns an object member as its own fields (errors are reported with the
// member's name as a prefix: "stream_options.include_usage"); nil when omitted.
func (f *fields) sub(name string) *fields {
	v := f.raw(name)
	if v == nil {
		return nil
	}
	m, err := splitObject(v)
	if err != nil {
		f.fail(invalidParam(f.pname(name), "%s must be an object, got %s", f.pname(name), jsonKind(v)))
		return nil
	}
	return &fields{m: m, prefix: f.pname(name) + "."}
}

// splitObject decodes a JSON object into its members.
func splitObject(v json.RawMessage) (map[string]json.RawMessage, error) {
	if jsonKind(v) != "an object" {
		return nil, errors.New("not an object")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// array decodes an array member into its elements; ok is false when omitted.
func (f *fields) array(name string) (elems []json.RawMessage, ok bool) {
	v := f.raw(name)
	if v == nil {
		return nil, false
	}
	if jsonKind(v) != "an array" || json.Unmarshal(v, &elems) != nil {
		f.fail(invalidParam(f.pname(name), "%s must be an array, got %s", f.pname(name), jsonKind(v)))
		return nil, false
	}
	return elems, true
}

// absorb takes over a sub-object's first error.
func (f *fields) absorb(sub *fields) {
	if sub != nil && sub.err != nil {
		f.fail(sub.err)
	}
}
