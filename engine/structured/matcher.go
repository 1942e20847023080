package structured

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"sync"
)

// A Constraint is a Grammar bound to a Vocabulary: it builds, lazily and once, the
// deterministic automaton over the grammar's configurations (sets of node + return
// stack) and each state's token mask, and hands out Matchers that share them. Every
// method is safe for concurrent use.
type Constraint struct {
	g     *Grammar
	vocab *Vocabulary

	mu     sync.Mutex
	stacks stackTable
	states []*dstate
	index  map[string]int32
	masks  int // masks cached so far
}

// maxCachedMasks bounds the masks one Constraint keeps (each is vocab/8 bytes).
const maxCachedMasks = 4096

// maxStates bounds the automaton; a grammar whose matching needs more states is cut
// off there (the sequence then sees no allowed token and ends).
const maxStates = 1 << 18

// maxStackDepth bounds nesting through calls (recursive schemas, any JSON value).
const maxStackDepth = 128

// dstate is one state of the automaton: the configurations the grammar can be in.
type dstate struct {
	configs   []config // consuming nodes and the final node, sorted
	accepting bool     // the value is complete
	next      [256]int32
	mask      []uint64 // allowed tokens, once computed; nil otherwise
	hasMask   bool
	// left: the state is inside a string body at a character boundary (exactly the
	// closure of one character-loop head, or of a bounded body's character start) with
	// at most left more characters (maxPureChars when unbounded), or -1. The
	// vocabulary's string-pure tokens of up to left characters are then allowed
	// without a walk, and only the other tokens are walked.
	left int32
}

// state ids: next[b] holds 0 (not computed yet), -1 (dead) or id+1.
const dead = -1

type config struct{ node, stack int32 }

// stackTable interns return stacks: id 0 is the empty stack; entry i > 0 is (ret,
// parent).
type stackTable struct {
	ret, parent, depth []int32
	index              map[[2]int32]int32
}

func (t *stackTable) push(ret, parent int32) int32 {
	if t.index == nil {
		t.ret, t.parent, t.depth = []int32{-1}, []int32{-1}, []int32{0}
		t.index = map[[2]int32]int32{}
	}
	k := [2]int32{ret, parent}
	if id, ok := t.index[k]; ok {
		return id
	}
	id := int32(len(t.ret))
	t.ret = append(t.ret, ret)
	t.parent = append(t.parent, parent)
	t.depth = append(t.depth, t.depth[parent]+1)
	t.index[k] = id
	return id
}

// NewConstraint binds g to vocab.
func NewConstraint(g *Grammar, vocab *Vocabulary) *Constraint {
	c := &Constraint{g: g, vocab: vocab, index: map[string]int32{}}
	c.stacks.push(-1, 0) // initialise the table (entry 1 is unused)
	c.internClosure([]config{{g.start, 0}})
	return c
}

// internClosure interns the closure of seeds, marking a new state that is exactly a
// string body's loop.
func (c *Constraint) internClosure(seeds []config) int32 {
	out, heads := c.closure(seeds)
	n := len(c.states)
	id := c.intern(out)
	if int(id) == n && len(heads) == 1 {
		if lo, _ := c.closure(heads); slices.Equal(lo, out) {
			left := c.g.nodes[heads[0].node].left
			if c.g.nodes[heads[0].node].loop || left > maxPureChars {
				left = maxPureChars
			}
			c.states[id].left = left
		}
	}
	return id
}

// closure returns the configurations reachable from seeds without consuming a byte,
// keeping those that consume (or accept), sorted and without duplicates, and the
// string-body character starts passed on the way.
func (c *Constraint) closure(seeds []config) (out, loops []config) {
	seen := map[config]bool{}
	work := append([]config(nil), seeds...)
	g := c.g
	for len(work) > 0 {
		cf := work[len(work)-1]
		work = work[:len(work)-1]
		if seen[cf] {
			continue
		}
		seen[cf] = true
		n := &g.nodes[cf.node]
		if len(n.edges) > 0 || (cf.node == g.final && cf.stack == 0) {
			out = append(out, cf)
		}
		if n.loop || n.left >= 0 {
			loops = append(loops, cf)
		}
		for _, to := range n.eps {
			work = append(work, config{to, cf.stack})
		}
		if n.call >= 0 && c.stacks.depth[cf.stack] < maxStackDepth {
			work = append(work, config{g.entries[n.call], c.stacks.push(n.ret, cf.stack)})
		}
		if n.exitOf >= 0 && cf.stack != 0 {
			work = append(work, config{c.stacks.ret[cf.stack], c.stacks.parent[cf.stack]})
		}
	}
	slices.SortFunc(out, func(a, b config) int {
		if a.node != b.node {
			return int(a.node - b.node)
		}
		return int(a.stack - b.stack)
	})
	return slices.Compact(out), loops
}

// intern returns the id of the state holding configs (which must be a closure).
func (c *Constraint) intern(configs []config) int32 {
	if len(configs) == 0 {
		return dead
	}
	key := make([]byte, 0, 8*len(configs))
	for _, cf := range configs {
		key = binary.LittleEndian.AppendUint32(key, uint32(cf.node))
		key = binary.LittleEndian.AppendUint32(key, uint32(cf.stack))
	}
	if id, ok := c.index[string(key)]; ok {
		return id
	}
	if len(c.states) >= maxStates {
		return dead
	}
	s := &dstate{configs: configs, left: -1}
	for _, cf := range configs {
		if cf.node == c.g.final && cf.stack == 0 {
			s.accepting = true
		}
	}
	id := int32(len(c.states))
	c.states = append(c.states, s)
	c.index[string(key)] = id
	return id
}

// step returns the state after byte b from state id, or dead. c.mu is held.
func (c *Constraint) step(id int32, b byte) int32 {
	s := c.states[id]
	if n := s.next[b]; n != 0 {
		if n < 0 {
			return dead
		}
		return n - 1
	}
	var seeds []config
	for _, cf := range s.configs {
		for _, e := range c.g.nodes[cf.node].edges {
			if e.lo <= b && b <= e.hi {
				seeds = append(seeds, config{e.to, cf.stack})
			}
		}
	}
	next := int32(dead)
	if len(seeds) > 0 {
		next = c.internClosure(seeds)
	}
	if next == dead {
		s.next[b] = -1
	} else {
		s.next[b] = next + 1
	}
	return next
}

// mask returns state id's allowed tokens, computing (and caching, up to a bound) it
// by walking the vocabulary's byte trie from the state. c.mu is held.
func (c *Constraint) mask(id int32, dst []uint64) []uint64 {
	s := c.states[id]
	if s.hasMask {
		return s.mask
	}
	v := c.vocab
	if cap(dst) < v.words() {
		dst = make([]uint64, v.words())
	}
	dst = dst[:v.words()]
	if s.left >= 0 {
		pure, rest := v.stringSplit()
		copy(dst, pure[s.left])
		c.walk(rest, 0, id, dst)
	} else {
		clear(dst)
		c.walk(v.all, 0, id, dst)
	}
	if s.accepting {
		for _, e := range v.eos {
			dst[e/64] |= 1 << (e % 64)
		}
	}
	if c.masks < maxCachedMasks {
		s.mask, s.hasMask = slices.Clone(dst), true
		c.masks++
		return s.mask
	}
	return dst
}

// walk marks every token below node t of trie v that the automaton accepts from state
// id.
func (c *Constraint) walk(v *trie, t int32, id int32, dst []uint64) {
	for i := v.childStart[t]; i < v.childStart[t+1]; i++ {
		next := c.step(id, v.childB[i])
		if next == dead {
			continue
		}
		n := v.childNode[i]
		for _, tok := range v.endTok[v.endStart[n]:v.endStart[n+1]] {
			dst[tok/64] |= 1 << (tok % 64)
		}
		if v.childStart[n+1] > v.childStart[n] {
			c.walk(v, n, next, dst)
		}
	}
}

// A Matcher follows one sequence through a Constraint. It is not safe for concurrent
// use; the Constraint it comes from is.
type Matcher struct {
	c       *Constraint
	state   int32
	scratch []uint64
}

// NewMatcher returns a Matcher at the start of the grammar.
func (c *Constraint) NewMatcher() *Matcher { return &Matcher{c: c, state: 0} }

// Mask returns the tokens allowed next as a bitset over the vocabulary (bit id%64 of
// word id/64); end-of-sequence tokens are allowed once the value is complete. The
// result is valid until the next call and must not be modified.
func (m *Matcher) Mask() []uint64 {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if m.state == dead {
		m.scratch = m.scratch[:0]
		m.scratch = append(m.scratch, make([]uint64, m.c.vocab.words())...)
		return m.scratch
	}
	mask := m.c.mask(m.state, m.scratch)
	if !m.c.states[m.state].hasMask {
		m.scratch = mask
	}
	return mask
}

// Accept advances past token id. An end-of-sequence token is accepted when the value
// is complete; a token the grammar does not allow leaves the matcher dead (Done, and
// no token allowed) and returns false.
func (m *Matcher) Accept(id int32) bool {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if m.state == dead {
		return false
	}
	if m.c.vocab.isEOS(id) {
		ok := m.c.states[m.state].accepting
		m.state = dead
		return ok
	}
	for _, b := range m.c.vocab.bytes(id) {
		m.state = m.c.step(m.state, b)
		if m.state == dead {
			return false
		}
	}
	return len(m.c.vocab.bytes(id)) > 0
}

// AcceptBytes advances past raw bytes (the start of a value that began inside a token,
// for a lazily triggered constraint); false leaves the matcher dead.
func (m *Matcher) AcceptBytes(bs []byte) bool {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	for _, b := range bs {
		if m.state == dead {
			return false
		}
		m.state = m.c.step(m.state, b)
	}
	return m.state != dead
}

// Vocabulary returns the vocabulary the constraint masks.
func (c *Constraint) Vocabulary() *Vocabulary { return c.vocab }

// Complete reports whether what was accepted so far is a whole value.
func (m *Matcher) Complete() bool {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.state != dead && m.c.states[m.state].accepting
}

// Allowed reports whether token id is in mask.
func Allowed(mask []uint64, id int32) bool {
	return int(id/64) < len(mask) && mask[id/64]&(1<<(id%64)) != 0
}

// Count returns the number of tokens in mask.
func Count(mask []uint64) int {
	n := 0
	for _, w := range mask {
		n += bits.OnesCount64(w)
	}
	return n
}
