package structured

import "fmt"

// A Grammar is a byte-level pushdown automaton: a graph of nodes joined by byte-range
// edges and empty (epsilon) edges, plus calls into sub-grammars (rules) that return to
// a continuation node, so recursive structures ($ref cycles, any JSON value) need no
// depth limit. CompileSchema builds one from a JSON Schema; a Matcher runs it.
type Grammar struct {
	nodes []node
	start int32 // the top rule's entry
	final int32 // the top rule's exit: reaching it with an empty stack accepts
	rules map[string]int32
	// ruleEntry / ruleExit of each rule, for calls.
	entries, exits []int32
}

// node is one automaton state.
type node struct {
	edges []edge  // consume one byte in [lo, hi]
	eps   []int32 // move without consuming
	// call, when >= 0, enters rule call pushing ret as the continuation.
	call, ret int32
	// exitOf, when >= 0, marks the node as the exit of that rule: the stack is popped.
	exitOf int32
	// loop marks the head of an unbounded string body's character loop; left >= 0 the
	// start of a bounded body's character with that many characters left at most.
	loop bool
	left int32
}

type edge struct {
	lo, hi byte
	to     int32
}

// builder assembles a Grammar from fragments (Thompson's construction).
type builder struct {
	g   *Grammar
	err error
}

// maxNodes bounds a compiled grammar (unrolled counts can grow it quickly).
const maxNodes = 1 << 20

func newBuilder() *builder {
	return &builder{g: &Grammar{rules: map[string]int32{}}}
}

func (b *builder) node() int32 {
	if len(b.g.nodes) >= maxNodes {
		if b.err == nil {
			b.err = fmt.Errorf("%w: the schema's grammar exceeds %d states (reduce maxLength, maxItems or nesting)", ErrUnsupported, maxNodes)
		}
		return 0
	}
	b.g.nodes = append(b.g.nodes, node{call: -1, ret: -1, exitOf: -1, left: -1})
	return int32(len(b.g.nodes) - 1)
}

// frag is a piece of grammar with one entry and one exit node.
type frag struct{ in, out int32 }

func (b *builder) eps(from, to int32) {
	if b.err == nil {
		b.g.nodes[from].eps = append(b.g.nodes[from].eps, to)
	}
}

func (b *builder) edge(from int32, lo, hi byte, to int32) {
	if b.err == nil {
		b.g.nodes[from].edges = append(b.g.nodes[from].edges, edge{lo, hi, to})
	}
}

// empty matches nothing (the empty string).
func (b *builder) empty() frag {
	n := b.node()
	return frag{n, n}
}

// lit matches the bytes of s.
func (b *builder) lit(s string) frag {
	in := b.node()
	cur := in
	for i := 0; i < len(s); i++ {
		next := b.node()
		b.edge(cur, s[i], s[i], next)
		cur = next
	}
	return frag{in, cur}
}

// class matches one byte in any of the ranges (pairs lo, hi).
func (b *builder) class(ranges ...byte) frag {
	in, out := b.node(), b.node()
	for i := 0; i+1 < len(ranges); i += 2 {
		b.edge(in, ranges[i], ranges[i+1], out)
	}
	return frag{in, out}
}

// seq matches the fragments one after the other.
func (b *builder) seq(fs ...frag) frag {
	if len(fs) == 0 {
		return b.empty()
	}
	for i := 1; i < len(fs); i++ {
		b.eps(fs[i-1].out, fs[i].in)
	}
	return frag{fs[0].in, fs[len(fs)-1].out}
}

// alt matches any one of the fragments.
func (b *builder) alt(fs ...frag) frag {
	in, out := b.node(), b.node()
	for _, f := range fs {
		b.eps(in, f.in)
		b.eps(f.out, out)
	}
	return frag{in, out}
}

// opt matches f or nothing.
func (b *builder) opt(f frag) frag {
	b.eps(f.in, f.out)
	return f
}

// star matches f any number of times; make builds a fresh copy of f each call.
func (b *builder) star(make func() frag) frag {
	f := make()
	in, out := b.node(), b.node()
	b.eps(in, f.in)
	b.eps(in, out)
	b.eps(f.out, in)
	return frag{in, out}
}

// repeat matches between lo and hi copies of make's fragment (hi < 0: unbounded).
// The optional copies are chained, and the match may leave before any of them, so
// every count has one path.
func (b *builder) repeat(make func() frag, lo, hi int) frag {
	var parts []frag
	for i := 0; i < lo && b.err == nil; i++ {
		parts = append(parts, make())
	}
	switch {
	case hi < 0:
		parts = append(parts, b.star(make))
	case hi > lo:
		out := b.node()
		var prev int32 = -1
		first := int32(-1)
		for i := lo; i < hi && b.err == nil; i++ {
			c := make()
			b.eps(c.in, out) // stop before this copy
			if prev >= 0 {
				b.eps(prev, c.in)
			} else {
				first = c.in
			}
			prev = c.out
		}
		b.eps(prev, out)
		if first >= 0 {
			parts = append(parts, frag{first, out})
		}
	}
	return b.seq(parts...)
}

// rule returns the index of the named rule, declaring it if new (fresh), in which case
// the caller fills it with define.
func (b *builder) rule(name string) (r int32, fresh bool) {
	if r, ok := b.g.rules[name]; ok {
		return r, false
	}
	r = int32(len(b.g.entries))
	b.g.rules[name] = r
	in, out := b.node(), b.node()
	if b.err == nil {
		b.g.nodes[out].exitOf = r
	}
	b.g.entries = append(b.g.entries, in)
	b.g.exits = append(b.g.exits, out)
	return r, true
}

// define sets rule r's body.
func (b *builder) define(r int32, body frag) {
	b.eps(b.g.entries[r], body.in)
	b.eps(body.out, b.g.exits[r])
}

// call matches rule r at this point.
func (b *builder) call(r int32) frag {
	in, out := b.node(), b.node()
	if b.err == nil {
		b.g.nodes[in].call, b.g.nodes[in].ret = r, out
	}
	return frag{in, out}
}

// matchesSomething reports whether the grammar accepts at least one string: whether its
// final node can be reached from its start, entering a rule only where the rule can
// itself reach its exit. A rule whose every way through calls itself again (the schema
// {"$ref": "#"}, or $refs that only lead to each other) cannot.
func (g *Grammar) matchesSomething() bool {
	productive := make([]bool, len(g.entries))
	seen := make([]uint32, len(g.nodes))
	var stamp uint32
	var work []int32
	reach := func(from, to int32) bool {
		stamp++
		work = append(work[:0], from)
		seen[from] = stamp
		for len(work) > 0 {
			n := work[len(work)-1]
			work = work[:len(work)-1]
			if n == to {
				return true
			}
			nd := &g.nodes[n]
			next := func(m int32) {
				if seen[m] != stamp {
					seen[m] = stamp
					work = append(work, m)
				}
			}
			for _, e := range nd.edges {
				next(e.to)
			}
			for _, m := range nd.eps {
				next(m)
			}
			if nd.call >= 0 && productive[nd.call] {
				next(nd.ret)
			}
		}
		return false
	}
	for changed := true; changed; {
		changed = false
		for r := len(g.entries) - 1; r >= 0; r-- {
			if !productive[r] && reach(g.entries[r], g.exits[r]) {
				productive[r], changed = true, true
			}
		}
	}
	return reach(g.start, g.final)
}
