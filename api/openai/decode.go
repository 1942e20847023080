package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
)

// DecodeBody decodes a request body into dst, a pointer to one endpoint's wire struct
// (CompletionRequest, ChatRequest, ...). It fails with a 400 naming no parameter for
// anything but one JSON object. Members of the wrong type do not fail here: the wire
// types keep them for the endpoint's validation, which names the parameter.
func DecodeBody(data []byte, dst any) error {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return InvalidParam("", "the request body is empty; expected a JSON object")
	}
	if data[0] != '{' {
		return InvalidParam("", "the request body must be a JSON object")
	}
	if err := decodeObject(data, dst); err != nil {
		return InvalidParam("", "the request body is not valid JSON: %v", err)
	}
	return nil
}

// decodeObject decodes a JSON object into the struct dst points to, matching member
// names to the fields' json tags exactly. encoding/json matches them case-insensitively,
// which would make "Stream" or "MAX_TOKENS" mean stream and max_tokens; OpenAI's names
// are case-sensitive and a member that is not one of them is ignored. Untagged embedded
// structs contribute their fields. It fails only when data is not a JSON object: every
// field type of a wire struct accepts any JSON value (see opt).
func decodeObject(data []byte, dst any) error {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil {
		return err
	}
	if members == nil {
		return errors.New("not an object")
	}
	v := reflect.ValueOf(dst).Elem()
	for _, f := range wireFields(v.Type()) {
		raw, ok := members[f.name]
		if !ok {
			continue
		}
		if err := json.Unmarshal(raw, v.FieldByIndex(f.index).Addr().Interface()); err != nil {
			return err
		}
	}
	return nil
}

// wireField is one member of a wire struct: its JSON name and where it lives.
type wireField struct {
	name  string
	index []int
}

var wireFieldCache sync.Map // reflect.Type -> []wireField

// wireFields lists a struct type's members in declaration order.
func wireFields(t reflect.Type) []wireField {
	if fs, ok := wireFieldCache.Load(t); ok {
		return fs.([]wireField)
	}
	var fs []wireField
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if sf.Anonymous && tag == "" && sf.Type.Kind() == reflect.Struct {
			for _, inner := range wireFields(sf.Type) {
				fs = append(fs, wireField{name: inner.name, index: append([]int{i}, inner.index...)})
			}
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if name == "" || name == "-" || !sf.IsExported() {
			continue
		}
		fs = append(fs, wireField{name: name, index: []int{i}})
	}
	wireFieldCache.Store(t, fs)
	return fs
}
