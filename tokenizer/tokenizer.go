package tokenizer

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrInvalid is wrapped by every error about a malformed or unsupported tokenizer.json or
// tokenizer_config.json.
var ErrInvalid = errors.New("tokenizer: invalid tokenizer files")

// ErrTemplate is wrapped by every error raised while parsing or rendering a chat template,
// including errors raised by the template itself through raise_exception.
var ErrTemplate = errors.New("tokenizer: chat template error")

// Tokenizer turns text into token ids and back. It is immutable once loaded and safe for
// concurrent use.
type Tokenizer struct {
	model       *bpeModel
	normalize   normalizeFunc // nil: none
	preTokenize preTokenizer  // nil: the whole stretch is one word

	// Per token id (the slices have VocabSize entries).
	tokens  []string // the token as written in tokenizer.json
	pieces  [][]byte // the bytes the token decodes to
	known   []bool   // the id has a token
	special []bool   // special added token (left out by skipSpecial)
	added   []bool   // added token (decoded as its content, never stripped)

	ids     map[string]int32  // token string -> id (model vocabulary and added tokens)
	matcher [256][]addedMatch // added tokens by first byte, longest first

	hasAdded           bool    // there are added tokens to look for in input text
	stripLeadingSpaces int     // spaces the decoder strips from the start of the text
	prefix, suffix     []int32 // ids added around a sequence when addSpecial is set
	bos                int32   // -1 when none
	eos                []int32

	chat             *chatTemplate // nil: no template (the fallback format is used)
	unkText, padText string        // unk_token and pad_token of tokenizer_config.json, for templates
}

// addedMatch is an added token as it is searched for in input text.
type addedMatch struct {
	content        string
	id             int32
	lstrip, rstrip bool
	singleWord     bool
}

// Message is one chat message handed to a chat template. The template sees it as a dict
// with the keys role and content (Content, or the list of Parts as {"type", "text"} dicts
// when Parts is set), and tool_calls, tool_call_id and name only when they are set.
type Message struct {
	Role    string
	Content string
	// Parts, when non-nil, is the content as content parts; the template then sees
	// content as the list of part dicts, as transformers passes OpenAI-style content.
	Parts      []ContentPart
	Name       string
	ToolCallID string
	ToolCalls  []ToolCall
}

// ContentPart is one content part of a message: {"type": "text", "text": ...}.
type ContentPart struct {
	Type string // "text" when empty
	Text string
}

// ToolCall is one tool call of an assistant message. The template sees it as
// {"id", "type": "function", "function": {"name", "arguments"}}, with arguments the dict
// of Function.Arguments when that is the JSON text of an object (as vLLM parses it before
// rendering), the string itself otherwise.
type ToolCall struct {
	ID       string
	Type     string // "function" when empty
	Function ToolCallFunction
}

// ToolCallFunction is the function a tool call calls: its name and the raw JSON text of
// its arguments.
type ToolCallFunction struct {
	Name      string
	Arguments string
}

// Encode turns text into token ids. Added tokens (such as "<|im_start|>") are matched as
// whole tokens wherever they occur in text. With addSpecial, the special tokens the model
// wants around a single sequence are added (usually a leading BOS: from the post-processor,
// overridden by add_bos_token / add_eos_token in tokenizer_config.json).
func (t *Tokenizer) Encode(text string, addSpecial bool) ([]int32, error) {
	var ids []int32
	if addSpecial {
		ids = append(ids, t.prefix...)
	}
	for _, seg := range t.splitAdded(text) {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			continue
		}
		s := seg.text
		if t.normalize != nil {
			var err error
			if s, err = t.normalize(s); err != nil {
				return nil, fmt.Errorf("tokenizer: encode: %w", err)
			}
		}
		words := []string{s}
		if t.preTokenize != nil {
			var err error
			if words, err = t.preTokenize(words, seg.start == 0); err != nil {
				return nil, fmt.Errorf("tokenizer: encode: %w", err)
			}
		}
		for _, w := range words {
			var err error
			if ids, err = t.model.tokenize(w, ids); err != nil {
				return nil, fmt.Errorf("tokenizer: encode: %w", err)
			}
		}
	}
	if addSpecial {
		ids = append(ids, t.suffix...)
	}
	return ids, nil
}

// segment is a stretch of input text, or one added token (id >= 0).
type segment struct {
	text  string
	start int // byte offset in the input
	id    int32
}

// splitAdded cuts text at the added tokens it contains (leftmost match first, the longest
// one at a position), honouring their lstrip, rstrip and single_word flags.
func (t *Tokenizer) splitAdded(text string) []segment {
	if !t.hasAdded {
		return []segment{{text: text, id: -1}}
	}
	var out []segment
	last := 0 // start of the pending text stretch
	for i := 0; i < len(text); {
		m, ok := t.matchAt(text, i)
		if !ok {
			i++
			continue
		}
		start, end := i, i+len(m.content)
		if m.lstrip {
			for start > last {
				r, size := utf8.DecodeLastRuneInString(text[last:start])
				if !unicode.IsSpace(r) {
					break
				}
				start -= size
			}
		}
		if m.rstrip {
			for end < len(text) {
				r, size := utf8.DecodeRuneInString(text[end:])
				if !unicode.IsSpace(r) {
					break
				}
				end += size
			}
		}
		if start > last {
			out = append(out, segment{text: text[last:start], start: last, id: -1})
		}
		out = append(out, segment{start: start, id: m.id})
		last, i = end, end
	}
	if last < len(text) {
		out = append(out, segment{text: text[last:], start: last, id: -1})
	}
	return out
}

// matchAt returns the longest added token that occurs at text[i:].
func (t *Tokenizer) matchAt(text string, i int) (addedMatch, bool) {
	for _, m := range t.matcher[text[i]] {
		if !strings.HasPrefix(text[i:], m.content) {
			continue
		}
		if m.singleWord {
			before, _ := utf8.DecodeLastRuneInString(text[:i])
			after, _ := utf8.DecodeRuneInString(text[i+len(m.content):])
			if (i > 0 && isWordRune(before)) || (i+len(m.content) < len(text) && isWordRune(after)) {
				continue
			}
		}
		return m, true
	}
	return addedMatch{}, false
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

// Decode turns token ids back into text. With skipSpecial, special tokens are left out. Ids
// without a token are ignored. Byte sequences that are not valid UTF-8 become U+FFFD, one
// per byte.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) string {
	var buf []byte
	for _, id := range ids {
		buf = t.appendPiece(buf, id, skipSpecial, len(buf) == 0)
	}
	return string(appendLossy(nil, buf))
}

// appendPiece appends the bytes of token id to buf. atStart says that no byte has been
// produced yet, where the decoder strips leading spaces.
func (t *Tokenizer) appendPiece(buf []byte, id int32, skipSpecial, atStart bool) []byte {
	if id < 0 || int(id) >= len(t.pieces) || !t.known[id] || (skipSpecial && t.special[id]) {
		return buf
	}
	p := t.pieces[id]
	if atStart && !t.added[id] {
		for n := 0; n < t.stripLeadingSpaces && len(p) > 0 && p[0] == ' '; n++ {
			p = p[1:]
		}
	}
	return append(buf, p...)
}

// VocabSize is one more than the largest token id the tokenizer knows (model vocabulary and
// added tokens).
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }

// TokenText is the display text of one token, as used for log probabilities: the bytes it
// decodes to, with U+FFFD for bytes that do not form complete UTF-8 on their own (a token
// holding part of a multi-byte character). No leading space is stripped. It is "" for an id
// without a token.
func (t *Tokenizer) TokenText(id int32) string {
	if id < 0 || int(id) >= len(t.pieces) {
		return ""
	}
	return string(appendLossy(nil, t.pieces[id]))
}

// TokenBytes returns the bytes token id decodes to, as TokenText but without replacing
// anything: a token holding part of a multi-byte character gives just those bytes (the
// OpenAI chat logprobs "bytes" field, from which a client rebuilds such characters). It
// is nil for an id without a token. The caller may modify the result.
func (t *Tokenizer) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= len(t.pieces) {
		return nil
	}
	return append([]byte{}, t.pieces[id]...)
}

// Token returns the token string of id as written in tokenizer.json (for example "Ġthe" or
// "▁the"), and whether the id has one.
func (t *Tokenizer) Token(id int32) (string, bool) {
	if id < 0 || int(id) >= len(t.tokens) || !t.known[id] {
		return "", false
	}
	return t.tokens[id], true
}

// TokenID returns the id of a token string as written in tokenizer.json (for example
// "<|im_end|>"), and whether it exists.
func (t *Tokenizer) TokenID(token string) (int32, bool) {
	id, ok := t.ids[token]
	return id, ok
}

// IsSpecial reports whether id is a special token (left out when decoding with skipSpecial).
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}

// BOS returns the beginning-of-sequence token id, if the tokenizer has one: bos_token of
// tokenizer_config.json, else the first token the post-processor puts before a sequence.
func (t *Tokenizer) BOS() (int32, bool) { return t.bos, t.bos >= 0 }

// EOS returns the end-of-sequence token ids named by tokenizer_config.json (eos_token); it
// is empty when there is none. The engine adds the model's own eos ids from config.json.
func (t *Tokenizer) EOS() []int32 { return append([]int32(nil), t.eos...) }

// Stream is an incremental detokenizer for one sequence: it turns token ids into text as
// they arrive and never returns part of a multi-byte UTF-8 character. The concatenation of
// everything Add and Flush return equals Decode of all the ids. A Stream is not safe for
// concurrent use.
type Stream struct {
	t           *Tokenizer
	skipSpecial bool
	produced    bool   // some byte has been produced (leading-space stripping is over)
	pending     []byte // bytes not yet returned: an incomplete UTF-8 sequence
}

// NewStream starts incremental detokenization of one sequence; skipSpecial is as in Decode.
func (t *Tokenizer) NewStream(skipSpecial bool) *Stream {
	return &Stream{t: t, skipSpecial: skipSpecial}
}

// NewStreamAfter starts incremental detokenization of a continuation of prompt (a
// completion): everything Add and Flush return is what Decode(prompt + continuation)
// adds to Decode(prompt). It differs from NewStream for decoders that strip the leading
// space of a text (SentencePiece "▁" models such as Llama 2): the continuation's first
// token keeps its space ("Once upon a" + "▁time" continues with " time"), unless prompt
// decodes to nothing.
func (t *Tokenizer) NewStreamAfter(prompt []int32, skipSpecial bool) *Stream {
	s := t.NewStream(skipSpecial)
	var buf []byte
	for _, id := range prompt {
		if buf = t.appendPiece(buf[:0], id, skipSpecial, true); len(buf) > 0 {
			s.produced = true
			break
		}
	}
	return s
}

// Add appends one token and returns the text it completes: all bytes up to the last complete
// UTF-8 character. The bytes of a character split across tokens (byte-level BPE bytes or
// <0xNN> byte-fallback tokens) are held back until its last byte arrives; bytes that can
// never form a character become U+FFFD.
func (s *Stream) Add(id int32) string {
	n := len(s.pending)
	s.pending = s.t.appendPiece(s.pending, id, s.skipSpecial, !s.produced)
	if len(s.pending) > n {
		s.produced = true
	}
	k := completePrefix(s.pending)
	if k == 0 {
		return ""
	}
	out := string(appendLossy(nil, s.pending[:k]))
	s.pending = append(s.pending[:0], s.pending[k:]...)
	return out
}

// Flush returns whatever is held back (an incomplete character, as U+FFFD per byte) and
// empties the stream.
func (s *Stream) Flush() string {
	out := string(appendLossy(nil, s.pending))
	s.pending = s.pending[:0]
	return out
}
