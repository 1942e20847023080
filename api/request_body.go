package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"

	"github.com/gin-gonic/gin"
)

// openRequest opens every handler that takes a body: the model must be loaded and the
// server not draining, the body is read and decoded once into the endpoint's wire struct
// W, and parse validates it into the endpoint's request R. On any failure the OpenAI
// error object is written with its status and ok is false; the handler then returns.
func openRequest[W, R any](s *Server, c *gin.Context, parse func(w *W, b *Backend) (R, error)) (b *Backend, req R, ok bool) {
	b, err := s.ready()
	if err == nil {
		var w W
		if err = readBody(c.Request, &w); err == nil {
			req, err = parse(&w, b)
		}
	}
	if err != nil {
		writeError(c.Writer, err)
		return nil, req, false
	}
	return b, req, true
}

// readBody reads a request body (bounded by limitBody) and decodes it into dst, a
// pointer to one endpoint's wire struct. It fails with a 415 for a compressed body, a
// 413 when the body is over the limit, and a 400 naming no parameter for anything but
// one JSON object. Members of the wrong type do not fail here: the wire types keep
// them for the endpoint's validation, which names the parameter.
func readBody(r *http.Request, dst any) error {
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		// RFC 9110 section 8.4.1: a server refuses an encoding it does not decode with 415.
		return errorf(errContentEncoding, "Content-Encoding %q is not supported; send the JSON body uncompressed", enc)
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errorf(errBodyTooLarge, "request body is larger than %d bytes", mbe.Limit)
		}
		return invalidParam("", "could not read the request body: %v", err)
	}
	return decodeBody(data, dst)
}

// decodeBody decodes one JSON object into dst; see readBody.
func decodeBody(data []byte, dst any) error {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return invalidParam("", "the request body is empty; expected a JSON object")
	}
	if data[0] != '{' {
		return invalidParam("", "the request body must be a JSON object")
	}
	if err := decodeObject(data, dst); err != nil {
		return invalidParam("", "the request body is not valid JSON: %v", err)
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
