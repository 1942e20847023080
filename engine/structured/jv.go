package structured

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
)

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
