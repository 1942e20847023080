package tokenizer

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// GGUF files (llama.cpp's format) carry their tokenizer as metadata under tokenizer.ggml.*.
// TokenizerFilesFromGGUF turns that metadata back into the tokenizer.json and
// tokenizer_config.json it was made from, inverting llama.cpp's convert_hf_to_gguf.py and
// reading the keys as llama.cpp's src/llama-vocab.cpp does, so that the rest of this package
// serves GGUF models unchanged:
//
//   - "gpt2" (byte-level BPE): the vocabulary and tokenizer.ggml.merges as they are; the
//     pre-tokenizer is the Split expression(s) llama.cpp uses for tokenizer.ggml.pre (written
//     in their original Hugging Face form, see ggufPreTokenizers) followed by
//     ByteLevel(use_regex=false), or ByteLevel with GPT-2's own expression; a ByteLevel
//     decoder; ignore_merges where llama.cpp sets it (Llama 3).
//   - "llama" (SentencePiece BPE): the pieces with byte_fallback and fuse_unk, and merges
//     rebuilt from the scores as transformers' SentencePieceExtractor (generate_merges)
//     builds them from a tokenizer.model: every split of a piece into two pieces of the
//     vocabulary is a merge, ordered by the piece's score (highest first), then by the
//     lengths in characters of the left and right parts (longest first), then by the
//     piece's id and the parts' ids. Pieces that are not normal rank with score 0, the
//     score SentencePiece gives its control, user-defined and byte pieces (the converter
//     overwrites the scores of added tokens with -1000, which says nothing). Without usable
//     scores (none, or one score for every normal piece, as convert_hf_to_gguf.py writes
//     when it has no tokenizer.model) the merges follow the ids, as the extractor orders
//     them without scores. The space prefix is the Llama 2 normalizer (Prepend "▁", Replace
//     " " by "▁"), only Replace when tokenizer.ggml.add_space_prefix is false (Gemma); the
//     decoder is Replace "▁" by " ", ByteFallback, Fuse and, with the prefix, Strip(1).
//
// Tokens of type control (3) and unknown (2) become special added tokens, user-defined ones
// (4) added tokens that are not special; all tokens are also in the model's vocabulary.
// convert_hf_to_gguf.py writes the "▁" of SentencePiece user-defined tokens as spaces (so that
// llama.cpp matches them in raw text); they are written back as "▁", so that runs of spaces
// are tokenized by the BPE model as in Hugging Face (Gemma's "▁▁" ... tokens), not matched as
// added tokens as llama.cpp does. Other differences from llama.cpp, in favour of the original
// files: the Qwen pre-tokenizers get Qwen's NFC normalizer, and a "gpt2" vocabulary without
// bos/eos ids gets none (llama.cpp defaults both to id 11). A "llama" vocabulary without them
// gets llama.cpp's defaults (bos 1, eos 2, unk 0). tokenizer.ggml.eot_token_id and
// eom_token_id are checked but have no place in these files.

// GGUFVocab is the tokenizer metadata of a GGUF file (keys tokenizer.ggml.* and
// tokenizer.chat_template).
type GGUFVocab struct {
	Model  string    // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE); others refused
	Pre    string    // tokenizer.ggml.pre: the pre-tokenizer name ("llama-bpe", "qwen2", "default", "gpt-2", "smollm", ...)
	Tokens []string  // tokenizer.ggml.tokens, by id
	Scores []float32 // tokenizer.ggml.scores (SentencePiece), may be nil
	Types  []int32   // tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
	Merges []string  // tokenizer.ggml.merges ("a b"), gpt2 only

	BOS, EOS, UNK, PAD, EOT, EOM int32 // -1 when absent (tokenizer.ggml.bos_token_id, ...)

	AddBOS, AddEOS, AddSpacePrefix *bool // nil when absent

	ChatTemplate string
}

// GGUF token types (tokenizer.ggml.token_type), as llama.cpp numbers them; 0 is "undefined".
const (
	ggufNormal      = 1
	ggufUnknown     = 2
	ggufControl     = 3
	ggufUserDefined = 4
	ggufUnused      = 5
	ggufByte        = 6
)

// ggufError is a refusal of GGUF metadata: one line, wrapping ErrInvalid.
type ggufError string

func (e ggufError) Error() string { return "tokenizer: GGUF " + string(e) }
func (e ggufError) Unwrap() error { return ErrInvalid }

func ggufErrorf(format string, args ...any) error { return ggufError(fmt.Sprintf(format, args...)) }

// ggufPreTokenizer is how llama.cpp pre-tokenizes for one tokenizer.ggml.pre name.
type ggufPreTokenizer struct {
	splits       []string // Split expressions (behavior Isolated), applied one after another
	gpt2Regex    bool     // ByteLevel splits with GPT-2's expression before encoding (use_regex)
	ignoreMerges bool     // a word that is a token is not merged (llama.cpp's ignore_merges)
	addBOS       bool     // llama.cpp's add_bos_token when the file does not say
	nfc          bool     // the original tokenizer.json normalizes to NFC (Qwen)
}

// Expressions of llama.cpp's pre-tokenizers, in the form of the tokenizer.json files they
// come from (llama.cpp rewrites (?i:...) by hand); llama3Pattern, qwen2Pattern and
// gpt2Pattern are in split.go and pretok.go.
const (
	qwen35Pattern    = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	gpt4oPattern     = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	tekkenPattern    = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	seedCoderPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+`
	minicpm5Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	deepseekV3Words  = `[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_` + "`" + `{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// ggufPreTokenizers maps the tokenizer.ggml.pre names to llama.cpp's pre-tokenizers
// (llama_vocab::impl::load and llm_tokenizer_bpe in src/llama-vocab.cpp).
var ggufPreTokenizers = func() map[string]ggufPreTokenizer {
	m := map[string]ggufPreTokenizer{}
	add := func(p ggufPreTokenizer, names ...string) {
		for _, n := range names {
			m[n] = p
		}
	}
	add(ggufPreTokenizer{splits: []string{llama3Pattern}, ignoreMerges: true, addBOS: true},
		"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")
	add(ggufPreTokenizer{splits: []string{llama3Pattern}}, "dbrx", "smaug-bpe", "glm4", "chatglm-bpe")
	add(ggufPreTokenizer{splits: []string{qwen2Pattern}, nfc: true}, "qwen2", "deepseek-r1-qwen")
	add(ggufPreTokenizer{splits: []string{qwen2Pattern}},
		"kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open", "grok-2")
	add(ggufPreTokenizer{splits: []string{qwen35Pattern}, nfc: true}, "qwen35")
	add(ggufPreTokenizer{gpt2Regex: true},
		"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
		"modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4")
	add(ggufPreTokenizer{splits: []string{`\p{N}`}, gpt2Regex: true},
		"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2")
	add(ggufPreTokenizer{splits: []string{`[\p{P}\$\+<=>\^~\|]+`, gpt2Pattern, `\p{N}+`, `[0-9][0-9][0-9]`}}, "default")
	add(ggufPreTokenizer{splits: []string{"[\\p{P}\\$\\+<=>\\^~\\|`]+", gpt2Pattern, `[0-9][0-9][0-9]`}}, "falcon")
	add(ggufPreTokenizer{splits: []string{`[\r\n]`, `\s?\p{L}+`, `\s?\p{P}+`, `[一-龥ࠀ-一가-퟿]+`, `\p{N}`}}, "deepseek-coder")
	add(ggufPreTokenizer{splits: []string{`\p{N}{1,3}`, `[一-龥぀-ゟ゠-ヿ]+`, deepseekV3Words}},
		"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4")
	add(ggufPreTokenizer{splits: []string{gpt4oPattern}}, "gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")
	add(ggufPreTokenizer{splits: []string{tekkenPattern}, ignoreMerges: true, addBOS: true}, "tekken")
	add(ggufPreTokenizer{splits: []string{seedCoderPattern}}, "seed-coder")
	add(ggufPreTokenizer{splits: []string{`\p{N}{1,3}`, minicpm5Pattern}, ignoreMerges: true}, "minicpm5")
	return m
}()

// ggufConversion is a GGUFVocab checked and read for writing out.
type ggufConversion struct {
	v      *GGUFVocab
	spm    bool
	pre    ggufPreTokenizer
	tokens []string // as written in tokenizer.json
	types  []int32
	ids    map[string]int32
	merges [][2]string

	bos, eos, unk, pad int32
	addBOS, addEOS     bool
	spacePrefix        bool
}

// TokenizerFilesFromGGUF writes the tokenizer.json and tokenizer_config.json equivalent to
// the tokenizer metadata of a GGUF file, as the comment at the top of this file describes.
// Metadata it cannot convert (another tokenizer model, an unknown pre-tokenizer, lists of
// different lengths, ids out of range, an empty vocabulary, merges of tokens missing from it)
// is refused with one line wrapping ErrInvalid.
func TokenizerFilesFromGGUF(v *GGUFVocab) (tokenizerJSON, configJSON []byte, err error) {
	c, err := newGGUFConversion(v)
	if err != nil {
		return nil, nil, err
	}
	if tokenizerJSON, err = c.tokenizerJSON(); err != nil {
		return nil, nil, err
	}
	if configJSON, err = c.configJSON(); err != nil {
		return nil, nil, err
	}
	return tokenizerJSON, configJSON, nil
}

func newGGUFConversion(v *GGUFVocab) (*ggufConversion, error) {
	if v == nil {
		return nil, ggufErrorf("vocabulary is missing")
	}
	c := &ggufConversion{v: v}
	switch v.Model {
	case "llama":
		c.spm = true
	case "gpt2":
		name := v.Pre
		if name == "" {
			name = "default" // as llama.cpp does, with a warning
		}
		p, ok := ggufPreTokenizers[name]
		if !ok {
			return nil, ggufErrorf("pre-tokenizer %q is not supported (supported: %s)",
				v.Pre, strings.Join(slices.Sorted(maps.Keys(ggufPreTokenizers)), ", "))
		}
		c.pre = p
	default:
		return nil, ggufErrorf("tokenizer model %q is not supported (supported: gpt2, llama)", v.Model)
	}
	n := len(v.Tokens)
	if n == 0 {
		return nil, ggufErrorf("vocabulary is empty (tokenizer.ggml.tokens)")
	}
	if v.Scores != nil && len(v.Scores) != n {
		return nil, ggufErrorf("%d scores for %d tokens", len(v.Scores), n)
	}
	if v.Types != nil && len(v.Types) != n {
		return nil, ggufErrorf("%d token types for %d tokens", len(v.Types), n)
	}
	if err := c.readTokens(); err != nil {
		return nil, err
	}
	if err := c.readSpecial(); err != nil {
		return nil, err
	}
	if c.spm {
		c.merges = c.sentencePieceMerges()
		return c, nil
	}
	if v.Merges == nil {
		return nil, ggufErrorf("byte-level vocabulary without merges (tokenizer.ggml.merges)")
	}
	c.merges = make([][2]string, len(v.Merges))
	for i, m := range v.Merges {
		// llama.cpp splits at the first space after the first byte.
		j := -1
		if len(m) > 1 {
			j = strings.IndexByte(m[1:], ' ')
		}
		if j < 0 {
			return nil, ggufErrorf("merge %d %q is not two tokens separated by a space", i, m)
		}
		a, b := m[:j+1], m[j+2:]
		_, okA := c.ids[a]
		_, okB := c.ids[b]
		_, okAB := c.ids[a+b]
		if !okA || !okB || !okAB {
			return nil, ggufErrorf("merge %d %q names a token that is not in the vocabulary", i, m)
		}
		c.merges[i] = [2]string{a, b}
	}
	return c, nil
}

// readTokens checks the tokens and their types and fills c.tokens, c.types and c.ids.
func (c *ggufConversion) readTokens() error {
	v := c.v
	n := len(v.Tokens)
	c.tokens = make([]string, n)
	c.types = make([]int32, n)
	c.ids = make(map[string]int32, n)
	for i, tok := range v.Tokens {
		typ := int32(ggufNormal)
		if v.Types != nil {
			typ = v.Types[i]
		}
		switch {
		case typ == 0:
			typ = ggufNormal
		case typ < 0 || typ > ggufByte:
			return ggufErrorf("token %d %q has type %d (want 1 to 6)", i, tok, typ)
		}
		switch {
		case tok == "":
			tok = fmt.Sprintf("[EMPTY_%d]", i) // as llama.cpp names it
		case !utf8.ValidString(tok):
			return ggufErrorf("token %d %q is not valid UTF-8", i, tok)
		case c.spm && typ == ggufUserDefined:
			tok = strings.ReplaceAll(tok, " ", "▁")
		}
		if j, dup := c.ids[tok]; dup {
			return ggufErrorf("token %q has ids %d and %d", tok, j, i)
		}
		c.tokens[i], c.types[i], c.ids[tok] = tok, typ, int32(i)
	}
	return nil
}

// readSpecial checks the special token ids and settles which are added around a sequence.
func (c *ggufConversion) readSpecial() error {
	v := c.v
	n := int32(len(v.Tokens))
	c.bos, c.eos, c.unk, c.pad = v.BOS, v.EOS, v.UNK, v.PAD
	for _, s := range []struct {
		name string
		id   int32
	}{{"bos", v.BOS}, {"eos", v.EOS}, {"unknown", v.UNK}, {"padding", v.PAD}, {"eot", v.EOT}, {"eom", v.EOM}} {
		if s.id < -1 || s.id >= n {
			return ggufErrorf("%s token id %d is out of range (%d tokens)", s.name, s.id, n)
		}
	}
	if c.spm { // llama.cpp's defaults for SentencePiece vocabularies
		for _, d := range []struct {
			id  *int32
			def int32
		}{{&c.bos, 1}, {&c.eos, 2}, {&c.unk, 0}} {
			if *d.id < 0 && d.def < n {
				*d.id = d.def
			}
		}
	}
	c.addBOS = c.spm || c.pre.addBOS
	if v.AddBOS != nil {
		c.addBOS = *v.AddBOS
	}
	if v.AddEOS != nil {
		c.addEOS = *v.AddEOS
	}
	if c.addBOS && c.bos < 0 {
		return ggufErrorf("add_bos_token is true but there is no bos token id")
	}
	if c.addEOS && c.eos < 0 {
		return ggufErrorf("add_eos_token is true but there is no eos token id")
	}
	c.spacePrefix = c.spm
	if v.AddSpacePrefix != nil {
		c.spacePrefix = c.spm && *v.AddSpacePrefix
	}
	return nil
}

// sentencePieceMerges rebuilds the merges of a SentencePiece BPE vocabulary as transformers'
// generate_merges does (see the top of this file).
func (c *ggufConversion) sentencePieceMerges() [][2]string {
	type merge struct{ left, right, piece int32 }
	chars := make([]int32, len(c.tokens)) // length in characters, as Python's len
	for i, tok := range c.tokens {
		chars[i] = int32(utf8.RuneCountInString(tok))
	}
	var all []merge
	for p, tok := range c.tokens {
		start := len(all)
		for k := range tok {
			if k == 0 {
				continue
			}
			l, okL := c.ids[tok[:k]]
			r, okR := c.ids[tok[k:]]
			if okL && okR {
				all = append(all, merge{l, r, int32(p)})
			}
		}
		slices.SortFunc(all[start:], func(a, b merge) int {
			return cmp.Or(cmp.Compare(a.left, b.left), cmp.Compare(a.right, b.right))
		})
	}
	score, byID := c.mergeScores()
	if byID {
		slices.SortStableFunc(all, func(a, b merge) int {
			return cmp.Or(cmp.Compare(a.piece, b.piece),
				cmp.Compare(chars[a.left], chars[b.left]), cmp.Compare(chars[a.right], chars[b.right]))
		})
	} else {
		slices.SortStableFunc(all, func(a, b merge) int {
			return cmp.Or(cmp.Compare(score[b.piece], score[a.piece]),
				cmp.Compare(chars[b.left], chars[a.left]), cmp.Compare(chars[b.right], chars[a.right]))
		})
	}
	out := make([][2]string, len(all))
	for i, m := range all {
		out[i] = [2]string{c.tokens[m.left], c.tokens[m.right]}
	}
	return out
}

// mergeScores returns the score each piece's merges are ranked by, or byID when the file
// has no usable scores.
func (c *ggufConversion) mergeScores() (score []float32, byID bool) {
	if c.v.Scores == nil {
		return nil, true
	}
	score = make([]float32, len(c.tokens))
	distinct := false
	first := true
	var seen float32
	for i, s := range c.v.Scores {
		if c.types[i] != ggufNormal {
			continue // 0, as SentencePiece scores its other pieces
		}
		score[i] = s
		if first {
			seen, first = s, false
		} else if s != seen {
			distinct = true
		}
	}
	return score, !distinct
}

// tokenizerJSON writes tokenizer.json. The vocabulary and merges, large, are written by
// hand; the rest with encoding/json.
func (c *ggufConversion) tokenizerJSON() ([]byte, error) {
	type addedToken struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	}
	added := []addedToken{}
	for i, typ := range c.types {
		if typ == ggufControl || typ == ggufUnknown || typ == ggufUserDefined {
			added = append(added, addedToken{ID: i, Content: c.tokens[i], Special: typ != ggufUserDefined})
		}
	}
	var normalizer, preTokenizer, decoder any
	if c.spm {
		replace := map[string]any{"type": "Replace", "pattern": map[string]string{"String": " "}, "content": "▁"}
		normalizer = replace
		decoders := []any{
			map[string]any{"type": "Replace", "pattern": map[string]string{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"},
			map[string]any{"type": "Fuse"},
		}
		if c.spacePrefix {
			normalizer = map[string]any{"type": "Sequence", "normalizers": []any{
				map[string]any{"type": "Prepend", "prepend": "▁"}, replace}}
			decoders = append(decoders, map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0})
		}
		decoder = map[string]any{"type": "Sequence", "decoders": decoders}
	} else {
		if c.pre.nfc {
			normalizer = map[string]any{"type": "NFC"}
		}
		var steps []any
		for _, expr := range c.pre.splits {
			steps = append(steps, map[string]any{"type": "Split", "pattern": map[string]string{"Regex": expr},
				"behavior": "Isolated", "invert": false})
		}
		steps = append(steps, map[string]any{"type": "ByteLevel", "add_prefix_space": false,
			"trim_offsets": true, "use_regex": c.pre.gpt2Regex})
		preTokenizer = map[string]any{"type": "Sequence", "pretokenizers": steps}
		decoder = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}
	}
	var unk *string
	if c.spm && c.unk >= 0 {
		unk = &c.tokens[c.unk]
	}
	head := struct {
		Version       string       `json:"version"`
		Truncation    any          `json:"truncation"`
		Padding       any          `json:"padding"`
		AddedTokens   []addedToken `json:"added_tokens"`
		Normalizer    any          `json:"normalizer"`
		PreTokenizer  any          `json:"pre_tokenizer"`
		PostProcessor any          `json:"post_processor"`
		Decoder       any          `json:"decoder"`
	}{"1.0", nil, nil, added, normalizer, preTokenizer, c.postProcessor(), decoder}
	model := struct {
		Type                    string  `json:"type"`
		Dropout                 any     `json:"dropout"`
		UnkToken                *string `json:"unk_token"`
		ContinuingSubwordPrefix any     `json:"continuing_subword_prefix"`
		EndOfWordSuffix         any     `json:"end_of_word_suffix"`
		FuseUnk                 bool    `json:"fuse_unk"`
		ByteFallback            bool    `json:"byte_fallback"`
		IgnoreMerges            bool    `json:"ignore_merges"`
	}{"BPE", nil, unk, nil, nil, c.spm, c.spm, c.pre.ignoreMerges}
	headJSON, err := marshalJSON(head)
	if err != nil {
		return nil, err
	}
	modelJSON, err := marshalJSON(model)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Grow(40*len(c.tokens) + 30*len(c.merges))
	b.Write(headJSON[:len(headJSON)-1]) // without its closing brace
	b.WriteString(",\"model\":")
	b.Write(modelJSON[:len(modelJSON)-1])
	b.WriteString(",\"vocab\":{")
	for i, tok := range c.tokens {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSONString(&b, tok)
		fmt.Fprintf(&b, ":%d", i)
	}
	b.WriteString("},\"merges\":[")
	for i, m := range c.merges {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('[')
		writeJSONString(&b, m[0])
		b.WriteByte(',')
		writeJSONString(&b, m[1])
		b.WriteByte(']')
	}
	b.WriteString("]}}")
	return b.Bytes(), nil
}

// postProcessor is the TemplateProcessing that adds the bos and eos tokens, or nil.
func (c *ggufConversion) postProcessor() any {
	if !c.addBOS && !c.addEOS {
		return nil
	}
	type piece = map[string]any
	special := map[string]any{}
	tok := func(id int32, typeID int) piece {
		special[c.tokens[id]] = map[string]any{"id": c.tokens[id], "ids": []int32{id}, "tokens": []string{c.tokens[id]}}
		return piece{"SpecialToken": map[string]any{"id": c.tokens[id], "type_id": typeID}}
	}
	seq := func(name string, typeID int) piece {
		return piece{"Sequence": map[string]any{"id": name, "type_id": typeID}}
	}
	var single, pair []piece
	for i, name := range []string{"A", "B"} {
		if c.addBOS {
			pair = append(pair, tok(c.bos, i))
		}
		pair = append(pair, seq(name, i))
		if c.addEOS {
			pair = append(pair, tok(c.eos, i))
		}
		if i == 0 {
			single = slices.Clone(pair)
		}
	}
	return map[string]any{"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special}
}

// configJSON writes tokenizer_config.json.
func (c *ggufConversion) configJSON() ([]byte, error) {
	ref := func(id int32) *string {
		if id < 0 {
			return nil
		}
		return &c.tokens[id]
	}
	return marshalJSON(struct {
		AddBOSToken    bool    `json:"add_bos_token"`
		AddEOSToken    bool    `json:"add_eos_token"`
		BOSToken       *string `json:"bos_token"`
		EOSToken       *string `json:"eos_token"`
		UnkToken       *string `json:"unk_token"`
		PadToken       *string `json:"pad_token"`
		ChatTemplate   string  `json:"chat_template,omitempty"`
		TokenizerClass string  `json:"tokenizer_class"`
	}{c.addBOS, c.addEOS, ref(c.bos), ref(c.eos), ref(c.unk), ref(c.pad), c.v.ChatTemplate, "PreTrainedTokenizerFast"})
}

// marshalJSON is json.Marshal without escaping <, > and & (special tokens read better).
func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, ggufErrorf("writing JSON: %v", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// writeJSONString writes s, valid UTF-8, as a JSON string.
func writeJSONString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}
