package structured

import "fmt"

// CompileWrapped compiles between min and max values of schema, each written as
// prefix + value + suffix and separated by sep (max < 0: no limit): the shape of tool
// calls in a model's own format, e.g. `<tool_call>\n` + {"name": ..., "arguments": ...}
// + `\n</tool_call>`. Inside the value the rules of CompileSchema hold, laid out compact
// or pretty-printed as models write calls, and no looser: where a pretty-printer breaks
// lines, nothing, one space, or a newline and up to 20 spaces or 1 to 20 tabs; after a
// colon one space at most; before a colon or a comma nothing. The literals are matched
// byte for byte, with no whitespace around them.
func CompileWrapped(prefix string, schema []byte, suffix, sep string, min, max int, strict bool) (*Grammar, error) {
	if min < 1 || (max >= 0 && max < min) {
		return nil, fmt.Errorf("%w: between %d and %d values", ErrBadSchema, min, max)
	}
	root, err := parseOrdered(schema)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSchema, err)
	}
	c := &compiler{b: newBuilder(), root: root, strict: strict, indented: true}
	b := c.b
	// The value is a rule, so the repeated calls share one copy of it.
	r, _ := b.rule("wrapped")
	b.define(r, c.value(root, "#"))
	one := func() frag { return b.seq(b.lit(prefix), b.call(r), b.lit(suffix)) }
	body := b.seq(one(), b.repeat(func() frag { return b.seq(b.lit(sep), one()) }, min-1, minus1(max)))
	if err := c.definePending(); err != nil {
		return nil, err
	}
	// No free whitespace around the literals: the format fixes them.
	b.g.start, b.g.final = body.in, body.out
	if b.err == nil && !b.g.matchesSomething() {
		return nil, errMatchesNothing
	}
	return b.g, b.err
}

func minus1(n int) int {
	if n < 0 {
		return -1
	}
	return n - 1
}
