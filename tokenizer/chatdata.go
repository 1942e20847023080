package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"sync"
	"unsafe"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// ChatOptions are the options of ApplyChatTemplateWith.
type ChatOptions struct {
	// AddGenerationPrompt ends the text with the opening of the assistant's turn.
	AddGenerationPrompt bool
	// Tools are OpenAI tool objects ({"type": "function", "function": {...}}), passed to
	// the template as tools, a list of dicts (as vLLM passes request.tools). Empty passes
	// tools as none.
	Tools []json.RawMessage
	// Kwargs, a JSON object, are more variables for the template (vLLM's
	// chat_template_kwargs: {"enable_thinking": false} for Qwen3's). A member named like
	// one of the variables the template always gets (messages, tools, bos_token, ...) is
	// refused.
	Kwargs json.RawMessage
}

// templateVars are the variables every render sets: Kwargs cannot replace them.
var templateVars = []string{"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
	"unk_token", "pad_token", "raise_exception", "strftime_now"}

// ErrTemplateKwargs is ChatOptions.Kwargs that cannot be passed to the template (it also
// wraps ErrTemplate).
var ErrTemplateKwargs = errors.New("bad template keyword arguments")

// templateKwargs decodes ChatOptions.Kwargs into vars.
func templateKwargs(raw json.RawMessage, vars map[string]any, s *orderScope) error {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(raw, &members); err != nil || members == nil {
		return fmt.Errorf("%w: %w: they must be a JSON object", ErrTemplate, ErrTemplateKwargs)
	}
	for name, v := range members {
		if slices.Contains(templateVars, name) {
			return fmt.Errorf("%w: %w: %q is set by the server, not by the request", ErrTemplate, ErrTemplateKwargs, name)
		}
		val, err := decodeJSON(v, s)
		if err != nil {
			return fmt.Errorf("%w: %w: %q: %v", ErrTemplate, ErrTemplateKwargs, name, err)
		}
		vars[name] = val
	}
	return nil
}

// keyOrders remembers the insertion order of the keys of the maps a render builds from
// JSON (tools, tool call arguments) and of the message dicts: Python's dicts keep it and
// json.dumps writes it, Go's maps do not. It maps a map's identity
// (reflect.Value.UnsafePointer) to its keys in order, and holds an entry only while the
// render that registered it runs.
var keyOrders sync.Map

// orderScope collects the maps one render registers, to forget them when it ends.
type orderScope struct{ ptrs []unsafe.Pointer }

func (s *orderScope) register(m map[string]any, keys []string) {
	p := reflect.ValueOf(m).UnsafePointer()
	keyOrders.Store(p, keys)
	s.ptrs = append(s.ptrs, p)
}

func (s *orderScope) release() {
	for _, p := range s.ptrs {
		keyOrders.Delete(p)
	}
	s.ptrs = nil
}

// orderedKeys returns the keys of m: in insertion order when it is registered (keys added
// since, by the template, after them, sorted), sorted otherwise.
func orderedKeys(m map[string]any) []string {
	var keys []string
	seen := map[string]bool{}
	if v, ok := keyOrders.Load(reflect.ValueOf(m).UnsafePointer()); ok {
		for _, k := range v.([]string) {
			if _, present := m[k]; present && !seen[k] {
				keys = append(keys, k)
				seen[k] = true
			}
		}
	}
	n := len(keys)
	for k := range m {
		if !seen[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys[n:])
	return keys
}

// registeredKeys is orderedKeys for the maps registered in keyOrders, nil for others (the
// engine's exec.MapKeyOrder hook: str() of a dict and iteration over it follow it).
func registeredKeys(m map[string]any) []string {
	if _, ok := keyOrders.Load(reflect.ValueOf(m).UnsafePointer()); !ok {
		return nil
	}
	return orderedKeys(m)
}

// decodeJSON parses raw into generic values as Python's json.loads does: objects are
// map[string]any registered with their key order in s, arrays []any, integers int64 (or
// float64 beyond its range), other numbers float64.
func decodeJSON(raw []byte, s *orderScope) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeJSONValue(dec, s)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("invalid JSON: data after the value")
	}
	return v, nil
}

func decodeJSONValue(dec *json.Decoder, s *orderScope) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '{':
			m := map[string]any{}
			var keys []string
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok {
					return nil, errors.New("invalid JSON object key")
				}
				v, err := decodeJSONValue(dec, s)
				if err != nil {
					return nil, err
				}
				if _, dup := m[k]; !dup {
					keys = append(keys, k)
				}
				m[k] = v // a repeated key keeps its first place and its last value, as in Python
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			s.register(m, keys)
			return m, nil
		case '[':
			l := []any{}
			for dec.More() {
				v, err := decodeJSONValue(dec, s)
				if err != nil {
					return nil, err
				}
				l = append(l, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return l, nil
		}
		return nil, fmt.Errorf("invalid JSON: unexpected %v", x)
	case json.Number:
		if i, err := strconv.ParseInt(x.String(), 10, 64); err == nil {
			return i, nil
		}
		f, err := strconv.ParseFloat(x.String(), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, err
		}
		return f, nil
	}
	return tok, nil // string, bool, nil
}

// templateMessages turns msgs into the list of dicts the template sees as messages.
func templateMessages(msgs []Message, s *orderScope) []any {
	out := make([]any, len(msgs))
	for i, m := range msgs {
		d := map[string]any{"role": m.Role}
		keys := []string{"role", "content"}
		if m.Parts != nil {
			parts := make([]any, len(m.Parts))
			for j, p := range m.Parts {
				typ := p.Type
				if typ == "" {
					typ = "text"
				}
				pd := map[string]any{"type": typ, "text": p.Text}
				s.register(pd, []string{"type", "text"})
				parts[j] = pd
			}
			d["content"] = parts
		} else {
			d["content"] = m.Content
		}
		if len(m.ToolCalls) > 0 {
			calls := make([]any, len(m.ToolCalls))
			for j, tc := range m.ToolCalls {
				typ := tc.Type
				if typ == "" {
					typ = "function"
				}
				var args any = tc.Function.Arguments
				if v, err := decodeJSON([]byte(tc.Function.Arguments), s); err == nil {
					if _, isObject := v.(map[string]any); isObject {
						args = v
					}
				}
				fn := map[string]any{"name": tc.Function.Name, "arguments": args}
				s.register(fn, []string{"name", "arguments"})
				cd := map[string]any{"type": typ, "function": fn}
				ckeys := []string{"type", "function"}
				if tc.ID != "" {
					cd["id"] = tc.ID
					ckeys = []string{"id", "type", "function"}
				}
				s.register(cd, ckeys)
				calls[j] = cd
			}
			d["tool_calls"] = calls
			keys = append(keys, "tool_calls")
		}
		if m.ToolCallID != "" {
			d["tool_call_id"] = m.ToolCallID
			keys = append(keys, "tool_call_id")
		}
		if m.Name != "" {
			d["name"] = m.Name
			keys = append(keys, "name")
		}
		s.register(d, keys)
		out[i] = d
	}
	return out
}

// templateTools parses the tool objects into the list of dicts the template sees as
// tools; no tools is none.
func templateTools(tools []json.RawMessage, s *orderScope) (any, error) {
	if len(tools) == 0 {
		return nil, nil
	}
	out := make([]any, len(tools))
	for i, raw := range tools {
		v, err := decodeJSON(raw, s)
		if err != nil {
			return nil, fmt.Errorf("%w: tools[%d]: %v", ErrTemplate, i, err)
		}
		out[i] = v
	}
	return out, nil
}

// usesContentParts reports whether a chat template iterates over a message's content
// ({% for part in message['content'] %}, as vLLM's content format detection looks for):
// such a template expects content as a list of parts, others as a string.
var contentLoop = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+\w+\s*(\[\s*['"]content['"]\s*\]|\.content)\s*-?%\}`)

// ChatUsesContentParts reports whether the model's chat template iterates over a
// message's content, i.e. expects content as a list of parts (Message.Parts) rather than
// a string; vLLM's "auto" content format decides the same way.
func (t *Tokenizer) ChatUsesContentParts() bool {
	return t.chat != nil && t.chat.contentParts
}

// ordered is a JSON object with its keys in the order to write them.
type ordered struct {
	keys []string
	vals map[string]any
}

// jsonValue converts a template value for tojson: lists and dicts walked with their
// identity kept (so registered maps keep their key order; dict literals keep theirs),
// anything else as the engine's plain Go value.
func jsonValue(v *exec.Value) any {
	if v == nil || v.IsNil() || v.IsError() {
		if v != nil && v.IsError() {
			return v.ToGoSimpleType(true)
		}
		return nil
	}
	switch {
	case v.IsString():
		return v.String()
	case v.IsList():
		out := []any{}
		v.Iterate(func(_, _ int, e, _ *exec.Value) bool {
			out = append(out, jsonValue(e))
			return true
		}, func() {})
		return out
	case v.IsDict():
		if m, ok := v.Interface().(map[string]any); ok {
			o := ordered{keys: orderedKeys(m), vals: make(map[string]any, len(m))}
			for _, k := range o.keys {
				o.vals[k] = jsonValue(exec.AsValue(m[k]))
			}
			return o
		}
		o := ordered{vals: map[string]any{}}
		v.Iterate(func(_, _ int, k, e *exec.Value) bool {
			key := fmt.Sprint(k.ToGoSimpleType(true))
			if _, dup := o.vals[key]; !dup {
				o.keys = append(o.keys, key)
			}
			o.vals[key] = jsonValue(e)
			return true
		}, func() {})
		if reflectKind(v) == reflect.Map {
			sort.Strings(o.keys) // a Go map of other key types: no order to keep
		}
		return o
	}
	return jsonable(v.ToGoSimpleType(true))
}

func reflectKind(v *exec.Value) reflect.Kind {
	r := v.Val
	if r.Kind() == reflect.Pointer || r.Kind() == reflect.Interface {
		r = r.Elem()
	}
	return r.Kind()
}

// dictMethods are the engine's dict methods with keys, values and items in the dict's
// order (insertion order for the maps registered in keyOrders and for dict literals,
// sorted for other maps) and with the dict's own values (not copies, so that nested
// dicts keep their order too).
func dictMethods(base *exec.MethodSet[map[string]any]) *exec.MethodSet[map[string]any] {
	m := map[string]exec.Method[map[string]any]{}
	for _, name := range []string{"get", "pop", "setdefault", "update", "copy", "clear"} {
		if fn, ok := base.Get(name); ok {
			m[name] = fn
		}
	}
	pairs := func(self map[string]any, sv *exec.Value) ([]string, []any) {
		var keys []string
		var vals []any
		if orig, ok := sv.Interface().(map[string]any); ok {
			keys = orderedKeys(orig)
			for _, k := range keys {
				vals = append(vals, orig[k])
			}
			return keys, vals
		}
		if reflectKind(sv) == reflect.Map {
			keys = orderedKeys(self)
			for _, k := range keys {
				vals = append(vals, self[k])
			}
			return keys, vals
		}
		sv.Iterate(func(_, _ int, k, e *exec.Value) bool { // a dict literal: its own order
			keys = append(keys, k.String())
			vals = append(vals, e.Interface())
			return true
		}, func() {})
		return keys, vals
	}
	m["keys"] = func(self map[string]any, sv *exec.Value, args *exec.VarArgs) (any, error) {
		if err := args.Take(); err != nil {
			return nil, exec.ErrInvalidCall(err)
		}
		keys, _ := pairs(self, sv)
		return keys, nil
	}
	m["values"] = func(self map[string]any, sv *exec.Value, args *exec.VarArgs) (any, error) {
		if err := args.Take(); err != nil {
			return nil, exec.ErrInvalidCall(err)
		}
		_, vals := pairs(self, sv)
		return vals, nil
	}
	m["items"] = func(self map[string]any, sv *exec.Value, args *exec.VarArgs) (any, error) {
		if err := args.Take(); err != nil {
			return nil, exec.ErrInvalidCall(err)
		}
		keys, vals := pairs(self, sv)
		items := make([]any, len(keys))
		for i := range keys {
			items[i] = []any{keys[i], vals[i]}
		}
		return items, nil
	}
	return exec.NewMethodSet(m)
}
