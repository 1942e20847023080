package tokenizer

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
)

// The fast reader of tokenizer.json. Real files are large (Gemma 3: 33 MB, 262,144 tokens,
// 514,906 merges), and encoding/json takes seconds over them; almost all of it is the
// model's vocab and merges. parseFast reads those two with a small jsonScanner written for
// them and hands everything else (small) to encoding/json. It accepts only what
// encoding/json accepts and newBPEModel builds, and builds the same result; on anything
// unusual (escapes it does not decode itself aside, which it delegates) it gives up and the
// loader falls back to parseSlow, which also produces the error messages. So parseFast
// never reports errors.

// parseFast reads tokenizer.json, or returns false when parseSlow must.
func parseFast(data []byte) (*parsedFile, bool) {
	p := &jsonScanner{s: data}
	f := &parsedFile{}
	var model *modelSpec
	p.ws()
	if !p.eat('{') {
		return nil, false
	}
	first := true
	for {
		p.ws()
		if p.eat('}') {
			break
		}
		if !first && !(p.eat(',') && p.wsThen()) {
			return nil, false
		}
		first = false
		key, ok := p.str()
		if !ok || !p.colon() {
			return nil, false
		}
		start := p.i
		field := foldKey(string(key), "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model")
		if field == "model" && p.peek() == '{' {
			if model, ok = p.model(data); !ok {
				return nil, false
			}
			continue
		}
		end, _, ok := skipValue(p.s, start)
		if !ok {
			return nil, false
		}
		p.i = end
		raw := data[start:end]
		switch field {
		case "":
			if !json.Valid(raw) {
				return nil, false
			}
		case "?", "model": // a near-miss of a field name, or a model that is not an object
			return nil, false
		case "added_tokens":
			f.addedTokens = nil
			if err := json.Unmarshal(raw, &f.addedTokens); err != nil {
				return nil, false
			}
		default:
			if !json.Valid(raw) {
				return nil, false
			}
			raw = bytes.Clone(raw)
			switch field {
			case "normalizer":
				f.normalizer = raw
			case "pre_tokenizer":
				f.preTokenizer = raw
			case "post_processor":
				f.postProcessor = raw
			case "decoder":
				f.decoder = raw
			}
		}
	}
	p.ws()
	if p.i != len(p.s) || model == nil {
		return nil, false
	}
	if model.Type != "" && model.Type != "BPE" {
		return nil, false
	}
	// The ids must be dense (as build checks): bound them by the number of tokens.
	maxID := int32(-1)
	for _, id := range model.vocab {
		maxID = max(maxID, id)
	}
	if len(model.vocab) == 0 || int(maxID) >= 2*(len(model.vocab)+len(f.addedTokens))+1024 {
		return nil, false
	}
	f.model = *model
	return f, true
}

// foldKey returns the name among names that key stands for in encoding/json's
// case-insensitive matching: the name when key is exactly it, "?" when key matches it only
// ignoring case (left to encoding/json), "" when key is none of them.
func foldKey(key string, names ...string) string {
	for _, n := range names {
		if key == n {
			return n
		}
		if strings.EqualFold(key, n) {
			return "?"
		}
	}
	return ""
}

// model reads the model object at p.i: vocab and merges itself, the other members (small)
// with encoding/json.
func (p *jsonScanner) model(data []byte) (*modelSpec, bool) {
	if !p.eat('{') {
		return nil, false
	}
	m := &modelSpec{}
	var rest []byte // the other members, as a JSON object
	rest = append(rest, '{')
	var merges []byte // the merges array
	var delims []int  // and the offsets of its delimiters in it
	first := true
	for {
		p.ws()
		if p.eat('}') {
			break
		}
		if !first && !(p.eat(',') && p.wsThen()) {
			return nil, false
		}
		first = false
		keyStart := p.i
		key, ok := p.str()
		keyEnd := p.i
		if !ok || !p.colon() {
			return nil, false
		}
		start := p.i
		switch foldKey(string(key), "vocab", "merges") {
		case "vocab":
			if m.vocab != nil || !p.vocab(&m.vocab) {
				return nil, false
			}
		case "merges":
			if merges != nil {
				return nil, false
			}
			end, ok := 0, false
			if delims, end, ok = memberDelims(p.s, start); !ok {
				return nil, false
			}
			p.i = end
			merges = p.s[start:end]
			for i := range delims {
				delims[i] -= start
			}
		case "?":
			return nil, false
		default:
			end, _, ok := skipValue(p.s, start)
			if !ok {
				return nil, false
			}
			p.i = end
			if len(rest) > 1 {
				rest = append(rest, ',')
			}
			rest = append(rest, data[keyStart:keyEnd]...)
			rest = append(rest, ':')
			rest = append(rest, data[start:end]...)
		}
	}
	rest = append(rest, '}')
	if err := json.Unmarshal(rest, &m.modelJSON); err != nil || m.vocab == nil {
		return nil, false
	}
	// newBPEModel refuses an unk_token missing from the vocabulary: left to parseSlow, as
	// merges of missing tokens are, so that what this reader accepts always builds.
	if m.UnkToken != nil {
		if _, ok := m.vocab[*m.UnkToken]; !ok {
			return nil, false
		}
	}
	prefix := ""
	if m.ContinuingSubwordPrefix != nil {
		prefix = *m.ContinuingSubwordPrefix
	}
	m.ranks = make(map[uint64]uint64, max(len(delims)-1, 0))
	if merges != nil && !parseMergesFast(merges, delims, m.vocab, prefix, m.ranks) {
		return nil, false
	}
	return m, true
}

// vocab reads the vocab object {"token": id, ...} at p.i into *vocab. Negative ids are
// left to parseSlow. The tokens are copied into one string.
func (p *jsonScanner) vocab(vocab *map[string]int32) bool {
	type entry struct {
		start, end int // in arena
		id         int32
	}
	var entries []entry
	var arena []byte
	if !p.eat('{') {
		return false
	}
	for {
		p.ws()
		if p.eat('}') {
			break
		}
		if len(entries) > 0 && !(p.eat(',') && p.wsThen()) {
			return false
		}
		tok, ok := p.str()
		if !ok || !p.colon() {
			return false
		}
		id, ok := p.int()
		if !ok || id < 0 {
			return false
		}
		entries = append(entries, entry{len(arena), len(arena) + len(tok), id})
		arena = append(arena, tok...)
	}
	all := string(arena)
	v := make(map[string]int32, len(entries))
	for _, e := range entries {
		v[all[e.start:e.end]] = e.id
	}
	*vocab = v
	return true
}

// parseMergesFast reads the merges array s, "a b" strings or ["a", "b"] pairs, into ranks as
// newBPEModel does; delims are the offsets of the array's '[', ',' and ']' in s, or nil
// when s is null. Malformed merges, and merges of tokens missing from the vocabulary, are
// left to parseSlow. The members are read and looked up in the vocabulary by several
// goroutines (the lookups are most of the time of loading a large tokenizer), then entered
// into ranks in rank order.
func parseMergesFast(s []byte, delims []int, vocab map[string]int32, prefix string, ranks map[uint64]uint64) bool {
	n := len(delims) - 1 // delims[i+1] is the ',' or ']' after member i
	if n <= 0 {
		return true
	}
	pairs := make([]uint64, n)
	merged := make([]int32, n)
	workers := min(runtime.GOMAXPROCS(0), (n+4095)/4096)
	var failed atomic.Bool
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := n*w/workers, n*(w+1)/workers
		wg.Go(func() {
			var buf []byte
			for i := lo; i < hi && !failed.Load(); i++ {
				a, b, ok := readMerge(s[delims[i]+1 : delims[i+1]])
				if !ok {
					failed.Store(true)
					return
				}
				ida, okA := vocab[string(a)]
				idb, okB := vocab[string(b)]
				rest := b
				if len(prefix) <= len(rest) {
					rest = rest[len(prefix):]
				}
				buf = append(append(buf[:0], a...), rest...)
				idn, okN := vocab[string(buf)]
				if !okA || !okB || !okN {
					failed.Store(true)
					return
				}
				pairs[i], merged[i] = pairKey(ida, idb), idn
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		return false
	}
	for rank, key := range pairs {
		ranks[key] = uint64(rank)<<32 | uint64(uint32(merged[rank]))
	}
	return true
}

// memberDelims reads the array or null at s[i:] (after white space) and returns the offsets
// of the array's '[', of the ',' between its members and of its ']' (only the '[' for an
// empty array, nil for null), and the end of the value. It follows only strings and
// nesting: the grammar of the members is checked by their reader, which also refuses empty
// members.
func memberDelims(s []byte, i int) (delims []int, end int, ok bool) {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	if len(s)-i >= 4 && string(s[i:i+4]) == "null" {
		return nil, i + 4, true
	}
	if i == len(s) || s[i] != '[' {
		return nil, 0, false
	}
	delims = []int{i}
	depth := 0
	for ; i < len(s); i++ {
		switch s[i] {
		case '"':
			end, ok := skipString(s, i)
			if !ok {
				return nil, 0, false
			}
			i = end - 1
		case '[', '{':
			depth++
		case ']', '}':
			depth--
			if depth == 0 {
				if s[i] != ']' {
					return nil, 0, false
				}
				delims = append(delims, i)
				if len(delims) == 2 && len(bytes.TrimSpace(s[delims[0]+1:i])) == 0 {
					delims = delims[:1] // []
				}
				return delims, i + 1, true
			}
		case ',':
			if depth == 1 {
				delims = append(delims, i)
			}
		}
	}
	return nil, 0, false
}

// readMerge reads one member of merges, with the white space around it: "a b" or
// ["a", "b"].
func readMerge(s []byte) (a, b []byte, ok bool) {
	p := &jsonScanner{s: s}
	p.ws()
	switch p.peek() {
	case '"':
		m, ok := p.str()
		if !ok {
			return nil, nil, false
		}
		sp := bytes.IndexByte(m, ' ')
		if sp < 0 || bytes.IndexByte(m[sp+1:], ' ') >= 0 {
			return nil, nil, false
		}
		a, b = m[:sp], m[sp+1:]
	case '[':
		p.i++
		p.ws()
		var ok1, ok2 bool
		a, ok1 = p.str()
		p.ws()
		if !ok1 || !p.eat(',') {
			return nil, nil, false
		}
		p.ws()
		b, ok2 = p.str()
		p.ws()
		if !ok2 || !p.eat(']') {
			return nil, nil, false
		}
	default:
		return nil, nil, false
	}
	p.ws()
	return a, b, p.i == len(s)
}
