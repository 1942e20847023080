package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf16"

	"github.com/nikolalohinski/gonja/v2"
	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// chatTemplate is a compiled Jinja chat template.
type chatTemplate struct {
	tpl *exec.Template
	err error // parse error, reported by every ApplyChatTemplate
	// contentParts: the template iterates over a message's content (ChatUsesContentParts).
	contentParts bool
	src          string
}

// chatEnv is the Jinja environment of chat templates: gonja's built-ins with tojson
// replaced by transformers' (filterToJSON: Python's json.dumps, non-ASCII kept), and trim
// and some string methods by ones with Python's behaviour (chatpy.go).
var chatEnv = sync.OnceValue(func() *exec.Environment {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{})
	filters.Update(builtins.Filters)
	_ = filters.Replace("tojson", filterToJSON)
	_ = filters.Replace("trim", filterTrim)
	methods := builtins.Methods
	methods.Str = strMethods(builtins.Methods.Str)
	methods.Dict = dictMethods(builtins.Methods.Dict)
	exec.MapKeyOrder = registeredKeys
	return &exec.Environment{
		Context:           gonja.DefaultContext,
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           methods,
	}
})

// compileChatTemplate parses src with the options transformers renders chat templates with
// (trim_blocks and lstrip_blocks on).
func compileChatTemplate(src string) *chatTemplate {
	ct := &chatTemplate{contentParts: contentLoop.MatchString(src), src: src}
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	tpl, err := exec.NewTemplate(chatTemplateName, cfg, &templateLoader{src: src}, chatEnv())
	if err != nil {
		ct.err = fmt.Errorf("%w: parse: %v", ErrTemplate, err)
	}
	ct.tpl = tpl
	return ct
}

const chatTemplateName = "chat_template"

// templateLoader serves the chat template itself, once, and nothing else: a template from
// a model directory cannot include, import or extend files, nor itself (which would recurse
// without end).
type templateLoader struct {
	src    string
	served atomic.Bool
}

var _ loaders.Loader = (*templateLoader)(nil)

// Read returns the template's source the first time it is asked for, and an error after.
func (l *templateLoader) Read(path string) (io.Reader, error) {
	if path != chatTemplateName || !l.served.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("chat templates cannot load templates (%q)", path)
	}
	return strings.NewReader(l.src), nil
}

// Resolve returns path unchanged.
func (l *templateLoader) Resolve(path string) (string, error) { return path, nil }

// Inherit returns the same loader.
func (l *templateLoader) Inherit(string) (loaders.Loader, error) { return l, nil }

// raisedError carries the message of raise_exception out of the template engine.
type raisedError struct{ msg string }

func (e *raisedError) Error() string { return e.msg }

// ApplyChatTemplate renders msgs with the model's chat template: ApplyChatTemplateWith
// with no tools.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) (string, error) {
	return t.ApplyChatTemplateWith(msgs, ChatOptions{AddGenerationPrompt: addGenerationPrompt})
}

// ApplyChatTemplateWith renders msgs with the model's chat template (chat_template of
// tokenizer_config.json). The template sees messages (a list of dicts: see Message),
// tools (opts.Tools as a list of dicts, or none), documents (none), add_generation_prompt,
// bos_token, eos_token, unk_token, pad_token, raise_exception(msg) and strftime_now(fmt),
// and opts.Kwargs' members.
// Dicts built from JSON (tools, tool call arguments) and the message dicts keep their key
// order in tojson and in keys(), values() and items(), as Python's dicts do.
// A model without a template gets the fallback format described in the package
// documentation (which ignores tools and tool calls). Template errors, including
// raise_exception, wrap ErrTemplate.
func (t *Tokenizer) ApplyChatTemplateWith(msgs []Message, opts ChatOptions) (string, error) {
	if t.chat == nil {
		return fallbackChat(msgs, opts.AddGenerationPrompt), nil
	}
	if t.chat.err != nil {
		return "", t.chat.err
	}
	scope := &orderScope{}
	defer scope.release()
	messages := templateMessages(msgs, scope)
	tools, err := templateTools(opts.Tools, scope)
	if err != nil {
		return "", err
	}
	var raised *raisedError
	vars := map[string]any{
		"messages":              messages,
		"tools":                 tools,
		"documents":             nil,
		"add_generation_prompt": opts.AddGenerationPrompt,
		"bos_token":             t.specialText(t.bos),
		"eos_token":             t.specialText(t.firstEOS()),
		"unk_token":             t.unkText,
		"pad_token":             t.padText,
		"raise_exception": func(msg string) (string, error) {
			raised = &raisedError{msg: msg}
			return "", raised
		},
		"strftime_now": func(format string) string { return strftime(time.Now(), format) },
	}
	if err := templateKwargs(opts.Kwargs, vars, scope); err != nil {
		return "", err
	}
	out, err := renderSafely(t.chat.tpl, exec.NewContext(vars))
	if raised != nil {
		return "", fmt.Errorf("%w: template raised: %s", ErrTemplate, raised.msg)
	}
	if err != nil {
		return "", fmt.Errorf("%w: render: %v", ErrTemplate, err)
	}
	return out, nil
}

// EncodeChat renders msgs with ApplyChatTemplate and encodes the result. The special tokens
// of Encode(text, true) are added only when the rendered text does not already start with
// the BOS token (templates usually write it themselves; the fallback format does not).
func (t *Tokenizer) EncodeChat(msgs []Message, addGenerationPrompt bool) ([]int32, error) {
	return t.EncodeChatWith(msgs, ChatOptions{AddGenerationPrompt: addGenerationPrompt})
}

// EncodeChatWith renders msgs with ApplyChatTemplateWith and encodes the result as
// EncodeChat does.
func (t *Tokenizer) EncodeChatWith(msgs []Message, opts ChatOptions) ([]int32, error) {
	text, err := t.ApplyChatTemplateWith(msgs, opts)
	if err != nil {
		return nil, err
	}
	bos := t.specialText(t.bos)
	return t.Encode(text, bos == "" || !strings.HasPrefix(text, bos))
}

// renderSafely executes tpl, turning a panic inside the engine into an error.
func renderSafely(tpl *exec.Template, ctx *exec.Context) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("template engine panic: %v", r)
		}
	}()
	return tpl.ExecuteToString(ctx)
}

// HasChatTemplate reports whether the model ships a chat template (else ApplyChatTemplate
// uses the fallback format).
func (t *Tokenizer) HasChatTemplate() bool { return t.chat != nil }

// ChatTemplateSource returns the chat template's text ("" without one).
func (t *Tokenizer) ChatTemplateSource() string {
	if t.chat == nil {
		return ""
	}
	return t.chat.src
}

func (t *Tokenizer) firstEOS() int32 {
	if len(t.eos) == 0 {
		return -1
	}
	return t.eos[0]
}

// specialText is the token string of id, or "" for -1.
func (t *Tokenizer) specialText(id int32) string {
	s, _ := t.Token(id)
	return s
}

// fallbackChat is the format used when a model has no chat template:
//
//	<|system|>\n{content}\n<|user|>\n{content}\n<|assistant|>\n
//
// one "<|role|>\n" header and the content plus "\n" per message, then "<|assistant|>\n"
// when a generation prompt is wanted.
func fallbackChat(msgs []Message, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range msgs {
		content := m.Content
		if m.Parts != nil {
			var sb strings.Builder
			for _, p := range m.Parts {
				sb.WriteString(p.Text)
			}
			content = sb.String()
		}
		b.WriteString("<|" + m.Role + "|>\n" + content + "\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|assistant|>\n")
	}
	return b.String()
}

// filterToJSON is the tojson filter as transformers defines it: json.dumps(x,
// ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys). Keys of
// mappings come out in insertion order for dict literals and the dicts built from JSON
// and messages (keyOrders), sorted for other Go maps (which keep no order).
func filterToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	a, err := pyArgs("tojson", params, "ensure_ascii", "indent", "separators", "sort_keys")
	if err != nil {
		return exec.AsValue(err)
	}
	o := pyJSON{indent: -1, itemSep: ", ", keySep: ": "}
	if v := a[0]; v != nil && !v.IsNil() {
		o.ensureASCII = v.IsTrue()
	}
	if v := a[1]; v != nil && !v.IsNil() {
		if !v.IsInteger() || v.Integer() < 0 {
			return exec.AsValue(errors.New("tojson: indent must be a non-negative integer or None"))
		}
		o.indent, o.itemSep = v.Integer(), ","
	}
	if v := a[2]; v != nil && !v.IsNil() {
		if !v.IsList() || v.Len() != 2 || !v.Index(0).IsString() || !v.Index(1).IsString() {
			return exec.AsValue(errors.New("tojson: separators must be a pair of strings"))
		}
		o.itemSep, o.keySep = v.Index(0).String(), v.Index(1).String()
	}
	var b strings.Builder
	v := jsonValue(in)
	if a[3] != nil && a[3].IsTrue() {
		v = sortKeys(v)
	}
	if err := o.write(&b, v, 0); err != nil {
		return exec.AsValue(fmt.Errorf("tojson: %v", err))
	}
	return exec.AsSafeValue(b.String())
}

// jsonable converts the template engine's values (maps keyed by any, *exec.Value) into
// maps keyed by strings, slices of any and scalars.
func jsonable(v any) any {
	switch x := v.(type) {
	case nil, ordered:
		return v
	case *exec.Value:
		return jsonable(x.ToGoSimpleType(true))
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonable(e)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[fmt.Sprint(k)] = jsonable(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonable(e)
		}
		return out
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return v
		}
		out := make([]any, rv.Len())
		for i := range out {
			out[i] = jsonable(rv.Index(i).Interface())
		}
		return out
	case reflect.Map:
		out := make(map[string]any, rv.Len())
		for it := rv.MapRange(); it.Next(); {
			out[fmt.Sprint(it.Key().Interface())] = jsonable(it.Value().Interface())
		}
		return out
	}
	return v
}

// pyJSON writes values as Python's json.dumps does with these options.
type pyJSON struct {
	ensureASCII     bool
	indent          int // < 0: on one line
	itemSep, keySep string
}

// sortKeys returns v with the keys of every object sorted (tojson's sort_keys).
func sortKeys(v any) any {
	switch x := v.(type) {
	case ordered:
		keys := append([]string(nil), x.keys...)
		sort.Strings(keys)
		vals := make(map[string]any, len(x.vals))
		for k, e := range x.vals {
			vals[k] = sortKeys(e)
		}
		return ordered{keys: keys, vals: vals}
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = sortKeys(e)
		}
		return out
	}
	return v
}

func (o *pyJSON) write(b *strings.Builder, v any, depth int) error {
	newline := func(d int) {
		if o.indent >= 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", o.indent*d))
		}
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
		return nil
	case bool:
		b.WriteString(strconv.FormatBool(x))
		return nil
	case string:
		o.writeString(b, x)
		return nil
	case json.Number:
		b.WriteString(x.String())
		return nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return o.write(b, ordered{keys: keys, vals: x}, depth)
	case ordered:
		if len(x.keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		b.WriteByte('{')
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(depth + 1)
			o.writeString(b, k)
			b.WriteString(o.keySep)
			if err := o.write(b, jsonable(x.vals[k]), depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte('}')
		return nil
	case []any:
		if len(x) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			newline(depth + 1)
			if err := o.write(b, e, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte(']')
		return nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		b.WriteString(strconv.FormatInt(rv.Int(), 10))
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		b.WriteString(strconv.FormatUint(rv.Uint(), 10))
		return nil
	case reflect.Float32, reflect.Float64:
		switch f := rv.Float(); {
		case math.IsNaN(f):
			b.WriteString("NaN")
		case math.IsInf(f, 1):
			b.WriteString("Infinity")
		case math.IsInf(f, -1):
			b.WriteString("-Infinity")
		default:
			b.WriteString(exec.AsValue(f).String()) // Python's repr of a float
		}
		return nil
	}
	// Anything else as encoding/json writes it, read back as generic values.
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var g any
	if err := dec.Decode(&g); err != nil {
		return err
	}
	return o.write(b, g, depth)
}

// writeString writes s as a JSON string as Python's json module does: \" \\ \b \f \n \r \t,
// other control characters as \u00XX, and (with ensureASCII) characters beyond ASCII as
// \uXXXX escapes (two for characters beyond U+FFFF); nothing else is escaped.
func (o *pyJSON) writeString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || o.ensureASCII && r > 0x7e && r < 0x10000:
			fmt.Fprintf(b, `\u%04x`, r)
		case o.ensureASCII && r >= 0x10000:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(b, `\u%04x\u%04x`, r1, r2)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

// strftime formats t with the Python strftime directives chat templates use.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) {
			b.WriteByte(format[i])
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			b.WriteString(t.Format("2006"))
		case 'y':
			b.WriteString(t.Format("06"))
		case 'm':
			b.WriteString(t.Format("01"))
		case 'd':
			b.WriteString(t.Format("02"))
		case 'b':
			b.WriteString(t.Format("Jan"))
		case 'B':
			b.WriteString(t.Format("January"))
		case 'a':
			b.WriteString(t.Format("Mon"))
		case 'A':
			b.WriteString(t.Format("Monday"))
		case 'H':
			b.WriteString(t.Format("15"))
		case 'I':
			b.WriteString(t.Format("03"))
		case 'M':
			b.WriteString(t.Format("04"))
		case 'S':
			b.WriteString(t.Format("05"))
		case 'p':
			b.WriteString(t.Format("PM"))
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
