package api

import (
	"strings"
	"unicode/utf8"

	"github.com/conveyor-llm/conveyor/engine"
)

// completionLogprobs is the logprobs object of a completion choice.
type completionLogprobs struct {
	Tokens        []string               `json:"tokens"`
	TokenLogprobs []jsonFloat            `json:"token_logprobs"`
	TopLogprobs   []map[string]jsonFloat `json:"top_logprobs"`
	TextOffset    []int                  `json:"text_offset"`
}

// add appends token logprobs; offset is the running text offset (in characters).
func (l *completionLogprobs) add(tls []engine.TokenLogprob, offset *int) {
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

// addGenerated appends generated tokens' logprobs, advancing acc's text offset. When tok
// can tell a token's bytes, a token's offset is the index (in characters) of the
// character its first byte belongs to, so the tokens holding the bytes of one multi-byte
// character share that character's offset, the text after it is counted in characters,
// and special tokens (left out of the text) take the offset without advancing it;
// otherwise each token counts the characters of its display text.
func (l *completionLogprobs) addGenerated(tls []engine.TokenLogprob, acc *seqAcc, tok Tokenizer) {
	tb, ok := tok.(TokenByter)
	if !ok {
		l.add(tls, &acc.offset)
		return
	}
	for _, t := range tls {
		off := -1
		if !tb.IsSpecial(t.ID) {
			buf := append(acc.partial, tb.TokenBytes(t.ID)...)
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
func (l *completionLogprobs) addPrompt(tls []engine.TokenLogprob, text string) {
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

func newCompletionLogprobs() *completionLogprobs {
	return &completionLogprobs{Tokens: []string{}, TokenLogprobs: []jsonFloat{}, TopLogprobs: []map[string]jsonFloat{}, TextOffset: []int{}}
}

// appendAll appends another logprobs object's entries.
func (l *completionLogprobs) appendAll(o *completionLogprobs) {
	l.Tokens = append(l.Tokens, o.Tokens...)
	l.TokenLogprobs = append(l.TokenLogprobs, o.TokenLogprobs...)
	l.TopLogprobs = append(l.TopLogprobs, o.TopLogprobs...)
	l.TextOffset = append(l.TextOffset, o.TextOffset...)
}
