package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/sugarme/tokenizer/model/bpe"
	"github.com/sugarme/tokenizer/pretrained"
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

// bpeModel is the BPE model of github.com/sugarme/tokenizer with the parts of the Hugging
// Face model it lacks around it: byte fallback, fuse_unk, ignore_merges, and words with
// characters outside the vocabulary (on which sugarme panics).
type bpeModel struct {
	inner        *bpe.BPE
	vocab        map[string]int
	unk          int // -1 when there is no unknown token
	byteFallback bool
	fuseUnk      bool
	ignoreMerges bool
	byteIDs      [256]int // ids of the <0xNN> tokens, -1 when missing

	cache      sync.Map     // word -> []int32, for words up to maxCachedWordBytes
	cacheWords atomic.Int64 // entries in cache, at most maxCachedWords
}

// The word cache: frequent words skip the merge loop. It stops growing when full.
const (
	maxCachedWords     = 1 << 16
	maxCachedWordBytes = 64
)

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

// newBPEModel builds the model. The model is handed to sugarme as a normalised
// tokenizer.json (merges as "a b" strings, the parts sugarme does not know removed) and
// loaded with pretrained.FromReader. When some merges cannot be written as strings (their
// tokens contain spaces, which only the pair form can express), the merge table built here
// replaces sugarme's, so every merge keeps its rank.
func newBPEModel(m modelJSON) (mod *bpeModel, err error) {
	if m.Type != "" && m.Type != "BPE" {
		return nil, fmt.Errorf("model: unsupported type %q (only BPE)", m.Type)
	}
	if len(m.Vocab) == 0 {
		return nil, fmt.Errorf("model: empty or missing vocab")
	}
	if (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") ||
		(m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return nil, fmt.Errorf("model: continuing_subword_prefix and end_of_word_suffix are not supported")
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return nil, fmt.Errorf("model: %v", err)
	}
	for tok, id := range m.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("model: token %q has negative id %d", tok, id)
		}
	}
	table := make(bpe.Merges, len(merges))
	mergeStrings := make([]string, 0, len(merges))
	for rank, mg := range merges {
		a, okA := m.Vocab[mg[0]]
		b, okB := m.Vocab[mg[1]]
		n, okN := m.Vocab[mg[0]+mg[1]]
		if !okA || !okB || !okN {
			return nil, fmt.Errorf("model: merge %d (%q, %q) uses tokens missing from the vocab", rank, mg[0], mg[1])
		}
		// A pair listed twice keeps its last rank, as in the reference implementation.
		table[bpe.Pair{C1: a, C2: b}] = bpe.PairVal{Rank: rank, NewId: n}
		if !strings.Contains(mg[0], " ") && !strings.Contains(mg[1], " ") {
			mergeStrings = append(mergeStrings, mg[0]+" "+mg[1])
		}
	}

	normalised := map[string]any{
		"version": "1.0",
		"model": map[string]any{
			"type":   "BPE",
			"vocab":  m.Vocab,
			"merges": mergeStrings,
		},
		"normalizer": nil, "pre_tokenizer": nil, "post_processor": nil, "decoder": nil,
		"added_tokens": []any{},
	}
	data, err := json.Marshal(normalised)
	if err != nil {
		return nil, fmt.Errorf("model: %v", err)
	}
	defer func() {
		if r := recover(); r != nil {
			mod, err = nil, fmt.Errorf("model: %v", r)
		}
	}()
	tk, err := pretrained.FromReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("model: %v", err)
	}
	inner, ok := tk.GetModel().(*bpe.BPE)
	if !ok {
		return nil, fmt.Errorf("model: sugarme built %T, want *bpe.BPE", tk.GetModel())
	}
	if len(mergeStrings) != len(merges) {
		// Some merges could not be written as "a b" strings: use the full table.
		inner.Merges = &table
	}
	inner.UnkToken = nil // unknown characters are handled before the inner model sees them
	inner.Dropout = nil

	mod = &bpeModel{
		inner: inner, vocab: m.Vocab, unk: -1,
		byteFallback: m.ByteFallback, fuseUnk: m.FuseUnk, ignoreMerges: m.IgnoreMerges,
	}
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model: unk_token %q is not in the vocab", *m.UnkToken)
		}
		mod.unk = id
	}
	for b := range mod.byteIDs {
		id, ok := m.Vocab[fmt.Sprintf("<0x%02X>", b)]
		if !ok {
			id = -1
		}
		mod.byteIDs[b] = id
	}
	return mod, nil
}

// tokenize appends the ids of one pre-tokenized word to out.
func (m *bpeModel) tokenize(word string, out []int32) ([]int32, error) {
	if word == "" {
		return out, nil
	}
	if ids, ok := m.cache.Load(word); ok {
		return append(out, ids.([]int32)...), nil
	}
	start := len(out)
	out, err := m.tokenizeWord(word, out)
	if err == nil && len(word) <= maxCachedWordBytes && m.cacheWords.Load() < maxCachedWords {
		if _, loaded := m.cache.LoadOrStore(word, slices.Clone(out[start:])); !loaded {
			m.cacheWords.Add(1)
		}
	}
	return out, err
}

// tokenizeWord is tokenize without the cache.
func (m *bpeModel) tokenizeWord(word string, out []int32) ([]int32, error) {
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(out, int32(id)), nil
		}
	}
	// Cut the word into runs of characters the vocabulary knows; merges never cross an
	// unknown character, so each run can be merged on its own.
	start := 0 // start of the current run of known characters
	lastUnk := false
	for i := 0; i < len(word); {
		_, size := utf8.DecodeRuneInString(word[i:]) // size 1 for a byte that is not UTF-8
		ch := word[i : i+size]
		if _, ok := m.vocab[ch]; ok {
			i += size
			continue
		}
		if start < i {
			var err error
			if out, err = m.merge(word[start:i], out); err != nil {
				return nil, err
			}
			lastUnk = false
		}
		out, lastUnk = m.unknown(ch, out, lastUnk)
		i += size
		start = i
	}
	return m.merge(word[start:], out)
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
	return append(out, int32(m.unk)), true
}

// merge runs the sugarme BPE merges over a run of known characters.
func (m *bpeModel) merge(run string, out []int32) (res []int32, err error) {
	if run == "" {
		return out, nil
	}
	defer func() {
		if r := recover(); r != nil {
			res, err = nil, fmt.Errorf("bpe: %v", r)
		}
	}()
	toks, err := m.inner.Tokenize(run)
	if err != nil {
		return nil, fmt.Errorf("bpe: %v", err)
	}
	for _, t := range toks {
		out = append(out, int32(t.Id))
	}
	return out, nil
}
