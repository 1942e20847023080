package openai

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/conveyor-llm/conveyor/engine"
)

// jsonFloat is a logprob on the wire: NaN (no value, e.g. the first prompt token) is null,
// and -Inf (a token masked out) is -9999 because JSON has no infinities.
type jsonFloat float64

// MarshalJSON implements json.Marshaler.
func (f jsonFloat) MarshalJSON() ([]byte, error) {
	x := float64(f)
	switch {
	case math.IsNaN(x):
		return []byte("null"), nil
	case math.IsInf(x, -1) || x < -9999:
		return []byte("-9999.0"), nil
	case math.IsInf(x, 1):
		return []byte("0"), nil
	}
	return strconv.AppendFloat(nil, x, 'g', -1, 32), nil
}

// CompletionLogprobs is the logprobs object of a completion choice.
type CompletionLogprobs struct {
	Tokens        []string               `json:"tokens"`
	TokenLogprobs []jsonFloat            `json:"token_logprobs"`
	TopLogprobs   []map[string]jsonFloat `json:"top_logprobs"`
	TextOffset    []int                  `json:"text_offset"`
}

// add appends token logprobs; offset is the running text offset (in characters).
func (l *CompletionLogprobs) add(tls []engine.TokenLogprob, offset *int) {
	for _, t := range tls {
		l.Tokens = append(l.Tokens, t.Text)
		l.TokenLogprobs = append(l.TokenLogprobs, jsonFloat(t.Logprob))
		var top map[string]jsonFloat
		if !isNaN32(t.Logprob) {
			top = make(map[string]jsonFloat, len(t.Top)+1)
			for _, a := range t.Top {
				top[a.Text] = jsonFloat(a.Logprob)
			}
			top[t.Text] = jsonFloat(t.Logprob)
		}
		l.TopLogprobs = append(l.TopLogprobs, top)
		l.TextOffset = append(l.TextOffset, *offset)
		*offset += utf8.RuneCountInString(t.Text)
	}
}

// addGenerated appends generated tokens' logprobs, advancing acc's text offset. A
// token's offset is the index (in characters) of the character its first byte belongs
// to, so the tokens holding the bytes of one multi-byte character share that
// character's offset, the text after it is counted in characters, and special tokens
// (left out of the text) take the offset without advancing it.
func (l *CompletionLogprobs) addGenerated(tls []engine.TokenLogprob, acc *seqAcc, tok Tokenizer) {
	for _, t := range tls {
		off := -1
		if !tok.IsSpecial(t.ID) {
			buf := append(acc.partial, tok.TokenBytes(t.ID)...)
			first := len(acc.partial) // where this token's bytes start in buf
			i := 0
			for i < len(buf) {
				r, size := utf8.DecodeRune(buf[i:])
				if r == utf8.RuneError && size <= 1 && !utf8.FullRune(buf[i:]) {
					break // the rest of this character is still to come
				}
				if off < 0 && i+size > first {
					off = acc.offset
				}
				acc.offset++ // a character, or a byte that is none (shown as U+FFFD)
				i += size
			}
			acc.partial = append(acc.partial[:0], buf[i:]...)
		}
		if off < 0 {
			off = acc.offset
		}
		l.add([]engine.TokenLogprob{t}, &off)
	}
}

// addPrompt appends the prompt's token logprobs with offsets into the echoed prompt
// text. A token's offset is the index (in characters) of the character its first byte
// belongs to, so the tokens holding the bytes of one multi-byte character (shown as
// U+FFFD, one per byte) share that character's offset. A token whose text is not at the
// current position (BOS, which the prompt string does not contain) takes the offset
// without advancing it.
func (l *CompletionLogprobs) addPrompt(tls []engine.TokenLogprob, text string) {
	pos := 0   // bytes into text
	start := 0 // byte index of the character holding pos
	runes := 0 // characters in text[:start]
	for _, t := range tls {
		for start < pos && start < len(text) {
			_, size := utf8.DecodeRuneInString(text[start:])
			if start+size > pos {
				break
			}
			start += size
			runes++
		}
		off := runes
		if n := matchTokenText(text[pos:], t.Text); n > 0 {
			pos += n
		}
		l.add([]engine.TokenLogprob{t}, &off)
	}
}

// matchTokenText returns how many bytes at the start of text a token's display text
// stands for, or 0 when it is not there. Each U+FFFD of the display text stands for
// itself or for one byte of a multi-byte character that the token holds only part of.
func matchTokenText(text, tok string) int {
	if tok == "" {
		return 0
	}
	if strings.HasPrefix(text, tok) {
		return len(tok)
	}
	i := 0
	for j, r := range tok {
		if r == utf8.RuneError && i < len(text) && text[i] >= utf8.RuneSelf {
			i++
			continue
		}
		size := utf8.RuneLen(r)
		if size < 0 || !strings.HasPrefix(text[i:], tok[j:j+size]) {
			return 0
		}
		i += size
	}
	return i
}

func isNaN32(f float32) bool { return f != f }

func newCompletionLogprobs() *CompletionLogprobs {
	return &CompletionLogprobs{Tokens: []string{}, TokenLogprobs: []jsonFloat{}, TopLogprobs: []map[string]jsonFloat{}, TextOffset: []int{}}
}

// appendAll appends another logprobs object's entries.
func (l *CompletionLogprobs) appendAll(o *CompletionLogprobs) {
	l.Tokens = append(l.Tokens, o.Tokens...)
	l.TokenLogprobs = append(l.TokenLogprobs, o.TokenLogprobs...)
	l.TopLogprobs = append(l.TopLogprobs, o.TopLogprobs...)
	l.TextOffset = append(l.TextOffset, o.TextOffset...)
}

// chatLogprob is one entry of a chat choice's logprobs.content.
type chatLogprob struct {
	Token       string         `json:"token"`
	Logprob     jsonFloat      `json:"logprob"`
	Bytes       []int          `json:"bytes"`
	TopLogprobs []chatTopEntry `json:"top_logprobs"`
}

type chatTopEntry struct {
	Token   string    `json:"token"`
	Logprob jsonFloat `json:"logprob"`
	Bytes   []int     `json:"bytes"`
}

type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

func textBytes(s string) []int {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out
}

// tokenBytes is the "bytes" of a logprobs entry: the token's own bytes, or the bytes of
// its display text when tok has none for it.
func tokenBytes(tok Tokenizer, id int32, text string) []int {
	if b := tok.TokenBytes(id); b != nil {
		return textBytes(string(b))
	}
	return textBytes(text)
}

// toChatLogprobs converts engine logprobs to the chat wire format.
func toChatLogprobs(tls []engine.TokenLogprob, tok Tokenizer) []chatLogprob {
	out := make([]chatLogprob, 0, len(tls))
	for _, t := range tls {
		e := chatLogprob{Token: t.Text, Logprob: jsonFloat(t.Logprob), Bytes: tokenBytes(tok, t.ID, t.Text), TopLogprobs: make([]chatTopEntry, 0, len(t.Top))}
		for _, a := range t.Top {
			e.TopLogprobs = append(e.TopLogprobs, chatTopEntry{Token: a.Text, Logprob: jsonFloat(a.Logprob), Bytes: tokenBytes(tok, a.ID, a.Text)})
		}
		out = append(out, e)
	}
	return out
}
