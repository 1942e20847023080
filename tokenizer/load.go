package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// fileJSON is tokenizer.json.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         json.RawMessage  `json:"model"`
}

type addedTokenJSON struct {
	ID         *int   `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Special    bool   `json:"special"`
}

// configJSON is the part of tokenizer_config.json the tokenizer reads.
type configJSON struct {
	BOSToken     tokenRef        `json:"bos_token"`
	EOSToken     tokenRef        `json:"eos_token"`
	UnkToken     tokenRef        `json:"unk_token"`
	PadToken     tokenRef        `json:"pad_token"`
	AddBOSToken  *bool           `json:"add_bos_token"`
	AddEOSToken  *bool           `json:"add_eos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// tokenRef is a special token in tokenizer_config.json: a string, an object with a
// "content" field, or null.
type tokenRef struct {
	Content string
	Set     bool
}

// UnmarshalJSON accepts "text", {"content": "text", ...} and null.
func (r *tokenRef) UnmarshalJSON(b []byte) error {
	if isNull(b) {
		*r = tokenRef{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*r = tokenRef{Content: s, Set: true}
		return nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(b, &obj); err != nil || obj.Content == nil {
		return fmt.Errorf("want a string or an object with \"content\", got %s", b)
	}
	*r = tokenRef{Content: *obj.Content, Set: true}
	return nil
}

// Load reads dir/tokenizer.json and, when present, dir/tokenizer_config.json. Errors about
// the files' content wrap ErrInvalid.
func Load(dir string) (*Tokenizer, error) {
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var cfgData []byte
	cfgData, err = os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return FromBytes(data, cfgData)
}

// FromBytes builds a tokenizer from the contents of tokenizer.json and of
// tokenizer_config.json (nil when there is none). Errors wrap ErrInvalid.
func FromBytes(tokenizerJSON, configJSONData []byte) (*Tokenizer, error) {
	t, err := build(tokenizerJSON)
	if err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: %v", ErrInvalid, err)
	}
	if configJSONData != nil {
		if err := t.applyConfig(configJSONData); err != nil {
			return nil, fmt.Errorf("%w: tokenizer_config.json: %v", ErrInvalid, err)
		}
	}
	return t, nil
}

// parsedFile is tokenizer.json as the loader reads it.
type parsedFile struct {
	addedTokens                                      []addedTokenJSON
	normalizer, preTokenizer, postProcessor, decoder json.RawMessage
	model                                            modelSpec
}

// parseSlow reads tokenizer.json with encoding/json. It is the reference for parseFast,
// which falls back on it for anything unusual and for the error messages.
func parseSlow(data []byte) (*parsedFile, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	if isNull(f.Model) {
		return nil, fmt.Errorf("no \"model\" object")
	}
	var head component
	if err := json.Unmarshal(f.Model, &head); err != nil {
		return nil, fmt.Errorf("model: %v", err)
	}
	if head.Type != "" && head.Type != "BPE" {
		return nil, fmt.Errorf("model: unsupported type %q (only BPE)", head.Type)
	}
	var m modelJSON
	if err := json.Unmarshal(f.Model, &m); err != nil {
		return nil, fmt.Errorf("model: %v", err)
	}
	if m.Type != "" && m.Type != "BPE" {
		return nil, fmt.Errorf("model: unsupported type %q (only BPE)", m.Type)
	}
	if len(m.Vocab) == 0 {
		return nil, fmt.Errorf("model: empty or missing vocab")
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return nil, fmt.Errorf("model: %v", err)
	}
	// Ids are dense in real files; bound them by the number of tokens so that a stray huge
	// id cannot allocate gigabytes.
	limit := 2*(len(m.Vocab)+len(f.AddedTokens)) + 1024
	vocab := make(map[string]int32, len(m.Vocab))
	for tok, id := range m.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("model: token %q has negative id %d", tok, id)
		}
		if id >= limit {
			return nil, fmt.Errorf("token %q: id %d is too large for %d tokens (ids must be dense)", tok, id, len(m.Vocab)+len(f.AddedTokens))
		}
		vocab[tok] = int32(id)
	}
	return &parsedFile{
		addedTokens: f.AddedTokens,
		normalizer:  f.Normalizer, preTokenizer: f.PreTokenizer,
		postProcessor: f.PostProcessor, decoder: f.Decoder,
		model: modelSpec{modelJSON: m, vocab: vocab, merges: merges},
	}, nil
}

func build(data []byte) (*Tokenizer, error) {
	f, ok := parseFast(data)
	if !ok {
		var err error
		if f, err = parseSlow(data); err != nil {
			return nil, err
		}
	}
	m := f.model
	model, err := newBPEModel(m)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{model: model, bos: -1}
	if t.normalize, err = buildNormalizer(f.normalizer); err != nil {
		return nil, err
	}
	var preByteLevel bool
	if t.preTokenize, preByteLevel, err = buildPreTokenizer(f.preTokenizer); err != nil {
		return nil, err
	}
	dec, err := parseDecoder(f.decoder)
	if err != nil {
		return nil, err
	}
	if isNull(f.decoder) && preByteLevel {
		dec.byteLevel = true
	}
	if isNull(f.decoder) && m.ByteFallback {
		dec.byteFallback = true
	}
	t.stripLeadingSpaces = dec.strip

	// Token tables: the model's vocabulary, then the added tokens (which may reuse model ids).
	// The vocabulary's ids are bounded by the parser; bound the added tokens' in the same way.
	limit := 2*(len(m.vocab)+len(f.addedTokens)) + 1024
	size := 0
	for _, id := range m.vocab {
		size = max(size, int(id)+1)
	}
	for i, at := range f.addedTokens {
		if at.ID == nil || *at.ID < 0 || *at.ID >= limit {
			return nil, fmt.Errorf("added_tokens[%d] %q: missing, negative or too large id", i, at.Content)
		}
		if at.Content == "" {
			return nil, fmt.Errorf("added_tokens[%d]: empty content", i)
		}
		size = max(size, *at.ID+1)
	}
	t.tokens = make([]string, size)
	t.pieces = make([][]byte, size)
	t.special = make([]bool, size)
	t.added = make([]bool, size)
	t.known = make([]bool, size)
	t.ids = maps.Clone(m.vocab)
	var arena []byte // the pieces of the vocabulary, one after another
	starts := make([]int, size+1)
	for tok, id := range m.vocab {
		t.tokens[id] = tok
		t.known[id] = true
	}
	for id, tok := range t.tokens {
		starts[id] = len(arena)
		if t.known[id] {
			arena = dec.appendPiece(arena, tok)
		}
	}
	starts[size] = len(arena)
	for id := range t.tokens {
		if t.known[id] {
			t.pieces[id] = arena[starts[id]:starts[id+1]:starts[id+1]]
		}
	}
	for _, at := range f.addedTokens {
		id := *at.ID
		t.tokens[id] = at.Content
		t.known[id] = true
		t.pieces[id] = []byte(at.Content)
		t.special[id] = at.Special
		t.added[id] = true
		t.ids[at.Content] = int32(id)
		first := at.Content[0]
		t.matcher[first] = append(t.matcher[first], addedMatch{
			content: at.Content, id: int32(id),
			lstrip: at.LStrip, rstrip: at.RStrip, singleWord: at.SingleWord,
		})
		t.hasAdded = true
	}
	for _, ms := range t.matcher {
		sort.SliceStable(ms, func(i, j int) bool { return len(ms[i].content) > len(ms[j].content) })
	}

	if t.prefix, t.suffix, err = parsePostProcessor(f.postProcessor, t.ids); err != nil {
		return nil, err
	}
	for _, id := range append(append([]int32(nil), t.prefix...), t.suffix...) {
		if id < 0 || int(id) >= size || !t.known[id] {
			return nil, fmt.Errorf("post_processor: token id %d is not in the vocabulary", id)
		}
	}
	if len(t.prefix) > 0 {
		t.bos = t.prefix[0]
	}
	return t, nil
}

// applyConfig reads tokenizer_config.json.
func (t *Tokenizer) applyConfig(data []byte) error {
	var c configJSON
	if err := json.Unmarshal(data, &c); err != nil {
		return err
	}
	if c.BOSToken.Set {
		id, ok := t.ids[c.BOSToken.Content]
		if !ok {
			return fmt.Errorf("bos_token %q is not a token", c.BOSToken.Content)
		}
		t.bos = id
	}
	if c.EOSToken.Set {
		id, ok := t.ids[c.EOSToken.Content]
		if !ok {
			return fmt.Errorf("eos_token %q is not a token", c.EOSToken.Content)
		}
		t.eos = []int32{id}
	}
	if c.AddBOSToken != nil {
		t.prefix = removeID(t.prefix, t.bos)
		if *c.AddBOSToken {
			if t.bos < 0 {
				return fmt.Errorf("add_bos_token is true but there is no bos_token")
			}
			t.prefix = append([]int32{t.bos}, t.prefix...)
		}
	}
	if c.AddEOSToken != nil && len(t.eos) > 0 {
		t.suffix = removeID(t.suffix, t.eos[0])
		if *c.AddEOSToken {
			t.suffix = append(t.suffix, t.eos[0])
		}
	}
	t.unkText, t.padText = c.UnkToken.Content, c.PadToken.Content
	tmpl, err := parseChatTemplate(c.ChatTemplate)
	if err != nil {
		return err
	}
	if tmpl != "" {
		t.chat = compileChatTemplate(tmpl)
	}
	return nil
}

func removeID(ids []int32, id int32) []int32 {
	var out []int32
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}

// parseChatTemplate accepts a string or a list of {"name", "template"} objects (the one
// named "default" is used, else the first).
func parseChatTemplate(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", fmt.Errorf("chat_template: want a string or a list of {name, template}")
	}
	for _, e := range list {
		if e.Name == "default" {
			return e.Template, nil
		}
	}
	if len(list) > 0 {
		return list[0].Template, nil
	}
	return "", nil
}

// decodeRule says how a model token's string becomes bytes.
type decodeRule struct {
	byteLevel    bool   // tokens are written in the byte-level alphabet
	metaspace    string // this string stands for a space ("" when none)
	byteFallback bool   // <0xNN> tokens stand for one byte
	strip        int    // spaces stripped from the start of the decoded text
}

// appendPiece appends the bytes token tok decodes to.
func (d decodeRule) appendPiece(dst []byte, tok string) []byte {
	if d.byteLevel {
		return appendByteLevelDecode(dst, tok)
	}
	if d.byteFallback && len(tok) == 6 && strings.HasPrefix(tok, "<0x") && tok[5] == '>' {
		if b, err := strconv.ParseUint(tok[3:5], 16, 8); err == nil {
			return append(dst, byte(b))
		}
	}
	if d.metaspace != "" {
		for {
			before, after, found := strings.Cut(tok, d.metaspace)
			dst = append(dst, before...)
			if !found {
				return dst
			}
			dst = append(dst, ' ')
			tok = after
		}
	}
	return append(dst, tok...)
}

// parseDecoder reads the "decoder" object. Supported: ByteLevel, Metaspace, ByteFallback,
// Replace (of a string by a space), Fuse, Strip and Sequence of these.
func parseDecoder(raw json.RawMessage) (decodeRule, error) {
	var d decodeRule
	err := walkDecoder(raw, &d)
	return d, err
}

func walkDecoder(raw json.RawMessage, d *decodeRule) error {
	if isNull(raw) {
		return nil
	}
	var p struct {
		Type           string            `json:"type"`
		Decoders       []json.RawMessage `json:"decoders"`
		Replacement    string            `json:"replacement"`
		AddPrefixSpace *bool             `json:"add_prefix_space"`
		PrependScheme  *string           `json:"prepend_scheme"`
		Pattern        pattern           `json:"pattern"`
		Content        string            `json:"content"`
		Start          int               `json:"start"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("decoder: %v", err)
	}
	switch p.Type {
	case "ByteLevel":
		d.byteLevel = true
	case "ByteFallback":
		d.byteFallback = true
	case "Fuse":
	case "Metaspace":
		d.metaspace = p.Replacement
		if d.metaspace == "" {
			d.metaspace = "▁"
		}
		strip := p.AddPrefixSpace == nil || *p.AddPrefixSpace
		if p.PrependScheme != nil {
			strip = strings.ToLower(*p.PrependScheme) != "never"
		}
		if strip {
			d.strip = 1
		}
	case "Replace":
		if p.Pattern.String == nil || p.Content != " " {
			return fmt.Errorf("decoder Replace: only a string replaced by a space is supported")
		}
		d.metaspace = *p.Pattern.String
	case "Strip":
		if p.Content != " " {
			return fmt.Errorf("decoder Strip: only stripping spaces is supported")
		}
		d.strip = p.Start
	case "Sequence":
		for _, r := range p.Decoders {
			if err := walkDecoder(r, d); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("decoder: unsupported type %q", p.Type)
	}
	return nil
}

// parsePostProcessor returns the ids the post-processor puts before and after a single
// sequence. Supported: TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel
// (adds nothing) and Sequence of these.
func parsePostProcessor(raw json.RawMessage, ids map[string]int32) (prefix, suffix []int32, err error) {
	if isNull(raw) {
		return nil, nil, nil
	}
	var p struct {
		Type       string            `json:"type"`
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int32 `json:"ids"`
		} `json:"special_tokens"`
		Cls []json.RawMessage `json:"cls"`
		Sep []json.RawMessage `json:"sep"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, nil, fmt.Errorf("post_processor: %v", err)
	}
	switch p.Type {
	case "ByteLevel":
		return nil, nil, nil
	case "TemplateProcessing":
		seenSeq := false
		for _, piece := range p.Single {
			switch {
			case piece.Sequence != nil:
				seenSeq = true
			case piece.SpecialToken != nil:
				var tokIDs []int32
				if st, ok := p.SpecialTokens[piece.SpecialToken.ID]; ok && len(st.IDs) > 0 {
					tokIDs = st.IDs
				} else if id, ok := ids[piece.SpecialToken.ID]; ok {
					tokIDs = []int32{id}
				} else {
					return nil, nil, fmt.Errorf("post_processor: special token %q is unknown", piece.SpecialToken.ID)
				}
				if seenSeq {
					suffix = append(suffix, tokIDs...)
				} else {
					prefix = append(prefix, tokIDs...)
				}
			}
		}
		return prefix, suffix, nil
	case "RobertaProcessing", "BertProcessing":
		cls, err := postToken(p.Cls)
		if err != nil {
			return nil, nil, fmt.Errorf("post_processor %s cls: %v", p.Type, err)
		}
		sep, err := postToken(p.Sep)
		if err != nil {
			return nil, nil, fmt.Errorf("post_processor %s sep: %v", p.Type, err)
		}
		return []int32{cls}, []int32{sep}, nil
	case "Sequence":
		for _, r := range p.Processors {
			pre, suf, err := parsePostProcessor(r, ids)
			if err != nil {
				return nil, nil, err
			}
			prefix = append(prefix, pre...)
			suffix = append(suffix, suf...)
		}
		return prefix, suffix, nil
	}
	return nil, nil, fmt.Errorf("post_processor: unsupported type %q", p.Type)
}

// postToken reads a ["text", id] pair.
func postToken(raw []json.RawMessage) (int32, error) {
	if len(raw) != 2 {
		return 0, fmt.Errorf("want [\"token\", id]")
	}
	var id int32
	if err := json.Unmarshal(raw[1], &id); err != nil {
		return 0, fmt.Errorf("want [\"token\", id]: %v", err)
	}
	return id, nil
}

// byteOfRune returns the inverse of byteToRune as a table: t[r] is the byte of rune r of the
// byte-level alphabet (all below 0x144), -1 for other runes. (byteToRune is filled by an
// init function, after package variables are initialised, hence the sync.OnceValue.)
var byteOfRune = sync.OnceValue(func() *[0x144]int16 {
	var t [0x144]int16
	for i := range t {
		t[i] = -1
	}
	for b, r := range byteToRune {
		t[r] = int16(b)
	}
	return &t
})

// appendByteLevelDecode appends tok, mapped from byte-level runes back to bytes, to dst.
// Runes outside the alphabet (which a well-formed byte-level vocabulary does not contain)
// are kept as their UTF-8 encoding.
func appendByteLevelDecode(dst []byte, tok string) []byte {
	table := byteOfRune()
	for _, r := range tok {
		if r < rune(len(table)) && table[r] >= 0 {
			dst = append(dst, byte(table[r]))
		} else {
			dst = utf8.AppendRune(dst, r)
		}
	}
	return dst
}
