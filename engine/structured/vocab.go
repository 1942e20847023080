package structured

import (
	"slices"
	"sort"
	"sync"
)

// A Vocabulary is what constraints need of a tokenizer: every token's bytes (byte-level
// tokens, byte-fallback <0xNN> tokens and partial UTF-8 sequences alike), in a trie so
// that one walk decides every token sharing a prefix at once, and the end-of-sequence
// tokens. Special tokens other than those never match.
type Vocabulary struct {
	size  int
	toks  [][]byte
	eos   []int32
	isEnd map[int32]bool
	all   *trie // every matchable token

	// Inside a JSON string most tokens are plain text: strPure[k] holds the tokens made
	// of at most k whole string characters (no quote; k <= maxPureChars), which leave
	// a string body at a character boundary k characters on; strRest is the trie of the
	// others. Built on first use.
	strOnce sync.Once
	strPure [][]uint64
	strRest *trie
}

// maxPureChars bounds the character count of the tokens kept in strPure; longer ones
// are walked.
const maxPureChars = 32

// trie is a byte trie over token ids, node 0 the root, children sorted by byte.
type trie struct {
	childStart []int32 // node -> first index into childB/childNode; len nodes+1
	childB     []byte
	childNode  []int32
	endStart   []int32 // node -> first index into endTok; len nodes+1
	endTok     []int32
}

// NewVocabulary builds the vocabulary of size ids: tokenBytes returns a token's bytes
// (nil or empty for ids the tokenizer does not have), special reports control tokens,
// which never match, and eos lists the end-of-sequence ids.
func NewVocabulary(size int, tokenBytes func(id int32) []byte, special func(id int32) bool, eos []int32) *Vocabulary {
	v := &Vocabulary{size: size, toks: make([][]byte, size), isEnd: map[int32]bool{}}
	for _, e := range eos {
		if e >= 0 && int(e) < size && !v.isEnd[e] {
			v.eos = append(v.eos, e)
			v.isEnd[e] = true
		}
	}
	var ids []int32
	for id := int32(0); int(id) < size; id++ {
		if v.isEnd[id] || special(id) {
			continue
		}
		bs := tokenBytes(id)
		if len(bs) == 0 {
			continue
		}
		v.toks[id] = append([]byte(nil), bs...)
		ids = append(ids, id)
	}
	v.all = v.buildTrie(ids)
	return v
}

// buildTrie returns the trie of the given tokens.
func (v *Vocabulary) buildTrie(ids []int32) *trie {
	type tnode struct {
		kids map[byte]int32
		ends []int32
	}
	nodes := []tnode{{}}
	for _, id := range ids {
		cur := int32(0)
		for _, b := range v.toks[id] {
			if nodes[cur].kids == nil {
				nodes[cur].kids = map[byte]int32{}
			}
			next, ok := nodes[cur].kids[b]
			if !ok {
				next = int32(len(nodes))
				nodes = append(nodes, tnode{})
				nodes[cur].kids[b] = next
			}
			cur = next
		}
		nodes[cur].ends = append(nodes[cur].ends, id)
	}
	t := &trie{childStart: make([]int32, len(nodes)+1), endStart: make([]int32, len(nodes)+1)}
	for i, n := range nodes {
		t.childStart[i] = int32(len(t.childB))
		keys := make([]int, 0, len(n.kids))
		for b := range n.kids {
			keys = append(keys, int(b))
		}
		sort.Ints(keys)
		for _, b := range keys {
			t.childB = append(t.childB, byte(b))
			t.childNode = append(t.childNode, n.kids[byte(b)])
		}
		t.endStart[i] = int32(len(t.endTok))
		t.endTok = append(t.endTok, n.ends...)
	}
	t.childStart[len(nodes)] = int32(len(t.childB))
	t.endStart[len(nodes)] = int32(len(t.endTok))
	return t
}

// stringSplit returns strPure and strRest, building them on first use by running every
// token through the body of an unbounded string (the same characters every schema's
// strings are compiled from).
func (v *Vocabulary) stringSplit() ([][]uint64, *trie) {
	v.strOnce.Do(func() {
		c := &compiler{b: newBuilder()}
		loop := c.b.star(c.char)
		c.b.g.start, c.b.g.final = loop.in, loop.out
		k := NewConstraint(c.b.g, &Vocabulary{})
		byCount := make([][]int32, maxPureChars+1)
		var rest []int32
		for id := int32(0); int(id) < v.size; id++ {
			bs := v.toks[id]
			if len(bs) == 0 {
				continue
			}
			s, chars := int32(0), 0
			for _, b := range bs {
				if s = k.step(s, b); s == dead {
					break
				}
				if s == 0 {
					chars++ // back at the loop head: one more whole character
				}
			}
			if s == 0 && chars <= maxPureChars {
				byCount[chars] = append(byCount[chars], id)
			} else {
				rest = append(rest, id)
			}
		}
		v.strPure = make([][]uint64, maxPureChars+1)
		acc := make([]uint64, v.words())
		for n, ids := range byCount {
			for _, id := range ids {
				acc[id/64] |= 1 << (id % 64)
			}
			v.strPure[n] = slices.Clone(acc)
		}
		v.strRest = v.buildTrie(rest)
	})
	return v.strPure, v.strRest
}

// Size is the number of token ids.
func (v *Vocabulary) Size() int { return v.size }

func (v *Vocabulary) words() int { return (v.size + 63) / 64 }

func (v *Vocabulary) isEOS(id int32) bool { return v.isEnd[id] }

func (v *Vocabulary) bytes(id int32) []byte {
	if id < 0 || int(id) >= v.size {
		return nil
	}
	return v.toks[id]
}

// IsEOS reports whether id ends the sequence.
func (v *Vocabulary) IsEOS(id int32) bool { return v.isEOS(id) }

// Bytes returns token id's bytes (nil for ids that never match).
func (v *Vocabulary) Bytes(id int32) []byte { return v.bytes(id) }
