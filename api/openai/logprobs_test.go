package openai

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"testing"
	"unicode/utf8"

	"github.com/conveyor-llm/conveyor/engine"
)

// TestEchoOffsetsMultibyte places prompt tokens that hold parts of multi-byte characters
// (shown as U+FFFD per byte, as the real tokenizer's TokenText does) at the offset of
// the character they belong to, and keeps counting after them.
func TestEchoOffsetsMultibyte(t *testing.T) {
	const r = "\uFFFD"
	cases := []struct {
		text   string
		tokens []string
		want   []int
	}{
		{"😀 héllo", []string{"<s>", r, r, r, r, " h", r, r, "ll", "o"}, []int{0, 0, 0, 0, 0, 1, 3, 3, 4, 6}},
		{"😀 héllo", []string{"<s>", r, r, r + r, " h", "é", "llo"}, []int{0, 0, 0, 0, 1, 3, 4}},
		{"a" + r + "b", []string{"a", r, "b"}, []int{0, 1, 2}},
		{"日本", []string{r + r, r + "本"}, []int{0, 0}},
	}
	for _, c := range cases {
		tls := make([]engine.TokenLogprob, len(c.tokens))
		for i, tok := range c.tokens {
			tls[i] = engine.TokenLogprob{ID: int32(i), Text: tok, Logprob: -1}
		}
		l := newCompletionLogprobs()
		l.addPrompt(tls, c.text)
		if !slices.Equal(l.TextOffset, c.want) {
			t.Errorf("%q %q: text_offset %v, want %v", c.text, c.tokens, l.TextOffset, c.want)
		}
	}
}

// byteTokenizer is the tokenizer the logprobs converters see: ids are bytes + 1 and id
// 0 is BOS ("<s>"); a byte that is not a character by itself shows as U+FFFD, as the
// real tokenizer's TokenText does, and TokenBytes tells the bytes. The converters read
// nothing else (the embedded Tokenizer is nil).
type byteTokenizer struct{ Tokenizer }

const fakeBOS = 0

func (byteTokenizer) TokenBytes(id int32) []byte {
	if id == fakeBOS {
		return []byte("<s>")
	}
	return []byte{byte(id - 1)}
}

func (t byteTokenizer) TokenText(id int32) string {
	if s := string(t.TokenBytes(id)); utf8.ValidString(s) {
		return s
	}
	return "\uFFFD"
}

func (byteTokenizer) IsSpecial(id int32) bool { return id == fakeBOS }

// TestChatLogprobBytesOfPartialCharacters checks that the "bytes" of a token holding one
// byte of "😀" are that byte, so that a client can rebuild the character, and not the
// bytes of the U+FFFD shown as its text.
func TestChatLogprobBytesOfPartialCharacters(t *testing.T) {
	tok := byteTokenizer{}
	emoji := []byte("😀")
	var tls []engine.TokenLogprob
	for _, b := range emoji {
		id := int32(b) + 1
		tls = append(tls, engine.TokenLogprob{ID: id, Text: tok.TokenText(id), Logprob: -1,
			Top: []engine.TopLogprob{{ID: id, Text: tok.TokenText(id), Logprob: -1}, {ID: 'a' + 1, Text: "a", Logprob: -2}}})
	}
	var rebuilt []byte
	for i, e := range toChatLogprobs(tls, tok) {
		if e.Token != "\uFFFD" {
			t.Errorf("token %d text %q, want U+FFFD", i, e.Token)
		}
		if !slices.Equal(e.Bytes, []int{int(emoji[i])}) || !slices.Equal(e.TopLogprobs[0].Bytes, e.Bytes) {
			t.Errorf("token %d bytes %v (top %v), want [%d]", i, e.Bytes, e.TopLogprobs[0].Bytes, emoji[i])
		}
		if !slices.Equal(e.TopLogprobs[1].Bytes, []int{'a'}) {
			t.Errorf("token %d alternative bytes %v, want [97]", i, e.TopLogprobs[1].Bytes)
		}
		for _, b := range e.Bytes {
			rebuilt = append(rebuilt, byte(b))
		}
	}
	if string(rebuilt) != "😀" {
		t.Fatalf("bytes rebuild %q, want 😀", rebuilt)
	}
}

// TestGeneratedOffsetsMultibyte places generated tokens that hold parts of one character
// at that character's offset and counts the text after it in characters.
func TestGeneratedOffsetsMultibyte(t *testing.T) {
	tok := byteTokenizer{}
	var tls []engine.TokenLogprob
	ids := []int32{}
	for _, b := range []byte("😀a\xffé\xe6X") {
		ids = append(ids, int32(b)+1)
	}
	ids = slices.Insert(ids, 5, fakeBOS) // a special token, left out of the text
	for _, id := range ids {
		tls = append(tls, engine.TokenLogprob{ID: id, Text: tok.TokenText(id), Logprob: -1})
	}
	acc := &seqAcc{}
	l := newCompletionLogprobs()
	l.addGenerated(tls[:2], acc, tok) // events may split a character
	l.addGenerated(tls[2:], acc, tok)
	// 😀 = 4 bytes at 0, a at 1, <s> at 2 without advancing, the stray byte 0xFF at 2
	// (one U+FFFD), é = 2 bytes at 3, the lead byte 0xE6 that X shows to be alone at 4,
	// X at 5
	if want := []int{0, 0, 0, 0, 1, 2, 2, 3, 3, 4, 5}; !slices.Equal(l.TextOffset, want) {
		t.Fatalf("text_offset %v, want %v", l.TextOffset, want)
	}
	if acc.offset != 6 {
		t.Fatalf("offset after the text %d, want 6", acc.offset)
	}
}

func TestJSONFloat(t *testing.T) {
	b, _ := json.Marshal([]jsonFloat{jsonFloat(math.NaN()), jsonFloat(math.Inf(-1)), -0.5})
	if !bytes.Equal(b, []byte(`[null,-9999.0,-0.5]`)) {
		t.Fatalf("%s", b)
	}
}
