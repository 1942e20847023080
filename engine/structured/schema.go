package structured

import (
	"errors"
	"fmt"
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
	return c.finish(c.value(root, "#"))
}

// CompileJSONObject returns the Grammar of any JSON object (response_format
// json_object).
func CompileJSONObject() *Grammar {
	c := &compiler{b: newBuilder()}
	g, _ := c.finish(c.anyObject())
	return g
}

type compiler struct {
	b      *builder
	root   *jv
	strict bool
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

// finish makes body, with the whitespace allowed around it, the grammar's top.
func (c *compiler) finish(body frag) (*Grammar, error) {
	if err := c.definePending(); err != nil {
		return nil, err
	}
	top := c.b.seq(c.ws(), body, c.ws())
	c.b.g.start, c.b.g.final = top.in, top.out
	if c.b.err != nil {
		return nil, c.b.err
	}
	if !c.b.g.matchesSomething() {
		return nil, errMatchesNothing
	}
	return c.b.g, nil
}

// definePending compiles the rules that $refs declared, and those their bodies declare,
// and returns the first error of the compilation.
func (c *compiler) definePending() error {
	for len(c.pending) > 0 && c.err == nil && c.b.err == nil {
		p := c.pending[0]
		c.pending = c.pending[1:]
		c.b.define(p.rule, c.value(p.schema, p.ref))
	}
	if c.err == nil {
		c.err = c.b.err
	}
	return c.err
}

func (c *compiler) fail(format string, args ...any) frag {
	if c.err == nil {
		c.err = fmt.Errorf("%w: %s", ErrUnsupported, fmt.Sprintf(format, args...))
	}
	return c.b.empty()
}

// errMatchesNothing: a schema no value can satisfy, for want of a way out of its $refs.
var errMatchesNothing = fmt.Errorf("%w: the schema matches no value (its $refs lead only to each other)", ErrBadSchema)

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

// colon matches the ':' between an object's key and its value, with its whitespace.
func (c *compiler) colon() frag {
	return c.b.seq(c.wsBefore(), c.b.lit(":"), c.wsColon())
}

// comma matches the ',' between members or elements, with its whitespace.
func (c *compiler) comma() frag {
	return c.b.seq(c.wsBefore(), c.b.lit(","), c.ws())
}

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
	r, fresh := c.b.rule(name)
	if fresh {
		c.pending = append(c.pending, pendingRule{rule: r, schema: target, ref: ref})
	}
	return c.b.call(r)
}
