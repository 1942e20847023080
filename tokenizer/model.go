package tokenizer

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// modelJSON is the "model" object of a BPE tokenizer.json.
type modelJSON struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]int    `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	ByteFallback            bool              `json:"byte_fallback"`
	FuseUnk                 bool              `json:"fuse_unk"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	Dropout                 *float64          `json:"dropout"`
}

// modelSpec is the model object as the loader parsed it: the scalar settings, the vocabulary
// (ids checked to be non-negative and dense enough, see build) and the merges, either in
// rank order or already as the merge table of bpeModel. Vocab and Merges of the embedded
// modelJSON are not used.
type modelSpec struct {
	modelJSON
	vocab  map[string]int32
	merges [][2]string
	ranks  map[uint64]uint64 // when set, merges is not used
}

// bpeModel is a Hugging Face BPE model (tokenizers/src/models/bpe): the merge loop of
// word.rs merge_all, with byte fallback, fuse_unk, ignore_merges, continuing_subword_prefix
// and end_of_word_suffix, and characters outside the vocabulary.
type bpeModel struct {
	vocab        map[string]int32
	ranks        map[uint64]uint64 // pairKey(a, b) -> rank<<32 | id of the merged token
	unk          int32             // -1 when there is no unknown token
	byteFallback bool
	fuseUnk      bool
	ignoreMerges bool
	prefix       string   // continuing_subword_prefix: before every character but a word's first
	suffix       string   // end_of_word_suffix: after a word's last character
	byteIDs      [256]int // ids of the <0xNN> tokens, -1 when missing

	cache      sync.Map     // word -> []int32, for words up to maxCachedWordBytes
	cacheWords atomic.Int64 // entries in cache, at most maxCachedWords
}

// The word cache: frequent words skip the merge loop. It stops growing when full.
const (
	maxCachedWords     = 1 << 16
	maxCachedWordBytes = 64
)

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// parseMerges accepts both forms of "merges": "a b" strings and ["a", "b"] pairs.
func parseMerges(raw []json.RawMessage) ([][2]string, error) {
	out := make([][2]string, len(raw))
	for i, r := range raw {
		var s string
		if err := json.Unmarshal(r, &s); err == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, fmt.Errorf("merge %d %q: want two tokens separated by one space", i, s)
			}
			out[i] = [2]string{a, b}
			continue
		}
		var pair []string
		if err := json.Unmarshal(r, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("merge %d %s: want \"a b\" or [\"a\", \"b\"]", i, r)
		}
		out[i] = [2]string{pair[0], pair[1]}
	}
	return out, nil
}

// newBPEModel builds the model and its merge table: merge i of (a, b) has rank i and
// produces the token a + b (less the continuing_subword_prefix that starts b), as in
// Hugging Face's BPE builder. A pair listed twice keeps its last rank.
func newBPEModel(m modelSpec) (*bpeModel, error) {
	mod := &bpeModel{
		vocab: m.vocab, unk: -1,
		byteFallback: m.ByteFallback, fuseUnk: m.FuseUnk, ignoreMerges: m.IgnoreMerges,
		ranks: m.ranks,
	}
	if m.ContinuingSubwordPrefix != nil {
		mod.prefix = *m.ContinuingSubwordPrefix
	}
	if m.EndOfWordSuffix != nil {
		mod.suffix = *m.EndOfWordSuffix
	}
	if mod.ranks == nil {
		mod.ranks = make(map[uint64]uint64, len(m.merges))
	}
	var buf []byte
	for rank, mg := range m.merges {
		a, okA := m.vocab[mg[0]]
		b, okB := m.vocab[mg[1]]
		rest := mg[1]
		if len(mod.prefix) <= len(rest) {
			rest = rest[len(mod.prefix):]
		}
		buf = append(append(buf[:0], mg[0]...), rest...)
		n, okN := m.vocab[string(buf)]
		if !okA || !okB || !okN {
			return nil, fmt.Errorf("model: merge %d (%q, %q) uses tokens missing from the vocab", rank, mg[0], mg[1])
		}
		mod.ranks[pairKey(a, b)] = uint64(rank)<<32 | uint64(uint32(n))
	}
	if m.UnkToken != nil {
		id, ok := m.vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model: unk_token %q is not in the vocab", *m.UnkToken)
		}
		mod.unk = id
	}
	var name [6]byte
	for b := range mod.byteIDs {
		id, ok := m.vocab[string(fmt.Appendf(name[:0], "<0x%02X>", b))]
		if !ok {
			id = -1
		}
		mod.byteIDs[b] = int(id)
	}
	return mod, nil
}

// tokenize appends the ids of one pre-tokenized word to out. It never fails; the error is
// kept for the callers.
func (m *bpeModel) tokenize(word string, out []int32) ([]int32, error) {
	if word == "" {
		return out, nil
	}
	if ids, ok := m.cache.Load(word); ok {
		return append(out, ids.([]int32)...), nil
	}
	start := len(out)
	out = m.tokenizeWord(word, out)
	if len(word) <= maxCachedWordBytes && m.cacheWords.Load() < maxCachedWords {
		if _, loaded := m.cache.LoadOrStore(word, slices.Clone(out[start:])); !loaded {
			m.cacheWords.Add(1)
		}
	}
	return out, nil
}

// tokenizeWord is tokenize without the cache.
func (m *bpeModel) tokenizeWord(word string, out []int32) []int32 {
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(out, id)
		}
	}
	// The word's characters become symbols (with the prefix and suffix, as Hugging Face
	// does). A character the vocabulary lacks ends the current run of symbols, which is
	// merged on its own: no merge involves byte-fallback or unknown tokens.
	var symBuf [64]int32
	syms := symBuf[:0]
	var scratch []byte
	lastUnk := false
	for i := 0; i < len(word); {
		_, size := utf8.DecodeRuneInString(word[i:]) // size 1 for a byte that is not UTF-8
		ch := word[i : i+size]
		first, last := i == 0, i+size == len(word)
		i += size
		var id int32
		var ok bool
		if m.prefix == "" && m.suffix == "" {
			id, ok = m.vocab[ch]
		} else {
			scratch = scratch[:0]
			if !first {
				scratch = append(scratch, m.prefix...)
			}
			scratch = append(scratch, ch...)
			if last {
				scratch = append(scratch, m.suffix...)
			}
			id, ok = m.vocab[string(scratch)]
			if !ok {
				ch = string(scratch)
			}
		}
		if ok {
			syms = append(syms, id)
			continue
		}
		if len(syms) > 0 {
			out = m.merge(syms, out)
			syms = syms[:0]
			lastUnk = false
		}
		out, lastUnk = m.unknown(ch, out, lastUnk)
	}
	if len(syms) > 0 {
		out = m.merge(syms, out)
	}
	return out
}

// unknown appends the tokens for a character missing from the vocabulary: its bytes as
// <0xNN> tokens with byte fallback, else the unknown token (once for a run of unknown
// characters with fuse_unk), else nothing.
func (m *bpeModel) unknown(ch string, out []int32, lastUnk bool) ([]int32, bool) {
	if m.byteFallback {
		ok := true
		for i := 0; i < len(ch); i++ {
			ok = ok && m.byteIDs[ch[i]] >= 0
		}
		if ok {
			for i := 0; i < len(ch); i++ {
				out = append(out, int32(m.byteIDs[ch[i]]))
			}
			return out, false
		}
	}
	if m.unk < 0 {
		return out, false
	}
	if m.fuseUnk && lastUnk {
		return out, true
	}
	return append(out, m.unk), true
}

// mergeCand is a pair waiting in the merge queue: the symbol at pos and the one after it
// merge into id, with the merge's rank.
type mergeCand struct {
	rank uint32
	pos  int32
	id   int32
}

// before orders the queue: lowest rank first, then leftmost.
func (c mergeCand) before(d mergeCand) bool {
	return c.rank < d.rank || (c.rank == d.rank && c.pos < d.pos)
}

// lookup returns the merge of the pair (a, b).
func (m *bpeModel) lookup(a, b int32) (rank uint32, id int32, ok bool) {
	v, ok := m.ranks[pairKey(a, b)]
	return uint32(v >> 32), int32(uint32(v)), ok
}

// merge applies the merges to a run of symbols (token ids; syms is overwritten) and
// appends the result to out. It is Hugging Face's Word::merge_all without dropout: a
// priority queue of the adjacent pairs that have a merge, lowest rank first and leftmost
// among equal ranks; a popped pair whose left symbol is gone, or whose symbols have changed
// since it was queued (its pair now merges into another token), is dropped; after a merge
// the new pairs with the neighbours are queued.
func (m *bpeModel) merge(syms []int32, out []int32) []int32 {
	n := len(syms)
	if n == 1 {
		return append(out, syms[0])
	}
	var linkBuf [2 * 64]int32
	var queueBuf [64]mergeCand
	links := linkBuf[:0]
	if 2*n > len(linkBuf) {
		links = make([]int32, 0, 2*n)
	}
	links = links[:2*n]
	prev, next := links[:n], links[n:]
	for i := range n {
		prev[i], next[i] = int32(i-1), int32(i+1)
	}
	next[n-1] = -1
	q := queueBuf[:0]
	for i := 0; i+1 < n; i++ {
		if r, id, ok := m.lookup(syms[i], syms[i+1]); ok {
			q = pushCand(q, mergeCand{rank: r, pos: int32(i), id: id})
		}
	}
	for len(q) > 0 {
		var top mergeCand
		top, q = popCand(q)
		pos := top.pos
		if syms[pos] < 0 { // merged into the symbol before it
			continue
		}
		right := next[pos]
		if right < 0 {
			continue
		}
		if _, id, ok := m.lookup(syms[pos], syms[right]); !ok || id != top.id {
			continue // stale: the pair has changed since it was queued
		}
		syms[pos] = top.id
		syms[right] = -1
		after := next[right]
		next[pos] = after
		if after >= 0 {
			prev[after] = pos
		}
		if p := prev[pos]; p >= 0 {
			if r, id, ok := m.lookup(syms[p], syms[pos]); ok {
				q = pushCand(q, mergeCand{rank: r, pos: p, id: id})
			}
		}
		if after >= 0 {
			if r, id, ok := m.lookup(syms[pos], syms[after]); ok {
				q = pushCand(q, mergeCand{rank: r, pos: pos, id: id})
			}
		}
	}
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}

// pushCand adds c to the binary min-heap q.
func pushCand(q []mergeCand, c mergeCand) []mergeCand {
	q = append(q, c)
	i := len(q) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q[i].before(q[p]) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
	return q
}

// popCand removes and returns the first candidate of the binary min-heap q.
func popCand(q []mergeCand) (mergeCand, []mergeCand) {
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q = q[:last]
	for i := 0; ; {
		l := 2*i + 1
		if l >= len(q) {
			break
		}
		c := l
		if r := l + 1; r < len(q) && q[r].before(q[l]) {
			c = r
		}
		if !q[c].before(q[i]) {
			break
		}
		q[i], q[c] = q[c], q[i]
		i = c
	}
	return top, q
}
