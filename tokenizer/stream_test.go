package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// streamAll feeds ids through a Stream and returns the pieces (Flush last).
func streamAll(tk *Tokenizer, ids []int32, skipSpecial bool) []string {
	s := tk.NewStream(skipSpecial)
	pieces := make([]string, 0, len(ids)+1)
	for _, id := range ids {
		pieces = append(pieces, s.Add(id))
	}
	return append(pieces, s.Flush())
}

// checkStream asserts the Stream contract: every piece is valid UTF-8 and the pieces add up
// to Decode of all ids.
func checkStream(t *testing.T, tk *Tokenizer, ids []int32, skipSpecial bool) {
	t.Helper()
	pieces := streamAll(tk, ids, skipSpecial)
	for i, p := range pieces {
		if !utf8.ValidString(p) {
			t.Fatalf("ids %v: piece %d %q is not valid UTF-8", ids, i, p)
		}
	}
	// Only Flush may produce U+FFFD for bytes still incomplete at the end; Add never returns
	// the start of a character whose remaining bytes could still arrive.
	if got, want := strings.Join(pieces, ""), tk.Decode(ids, skipSpecial); got != want {
		t.Fatalf("ids %v: stream gave %q, Decode gives %q", ids, got, want)
	}
}

func TestStreamRandomText(t *testing.T) {
	tk := loadTest(t)
	rng := rand.New(rand.NewPCG(5, 6))
	for range 300 {
		text := randomText(rng, rng.IntN(30))
		ids, err := tk.Encode(text, true)
		if err != nil {
			t.Fatal(err)
		}
		checkStream(t, tk, ids, true)
		checkStream(t, tk, ids, false)
		// Valid text never yields a replacement character on the way.
		if got := strings.Join(streamAll(tk, ids, true), ""); got != text {
			t.Fatalf("stream of %q gave %q", text, got)
		}
	}
}

// TestStreamRandomIDs feeds arbitrary id sequences, which split and break multi-byte
// characters in every way (stray continuation bytes, truncated sequences, specials).
func TestStreamRandomIDs(t *testing.T) {
	tk := loadTest(t)
	rng := rand.New(rand.NewPCG(7, 8))
	for range 500 {
		ids := make([]int32, rng.IntN(20))
		for i := range ids {
			ids[i] = int32(rng.IntN(tk.VocabSize()+4)) - 2 // includes unknown ids
		}
		checkStream(t, tk, ids, rng.IntN(2) == 0)
	}
}

// TestStreamHoldsIncomplete checks that the bytes of one character split over tokens come
// out together, at the token that completes them.
func TestStreamHoldsIncomplete(t *testing.T) {
	tk := loadTest(t)
	emoji := "😀" // F0 9F 98 80
	var ids []int32
	for i := 0; i < len(emoji); i++ {
		id, ok := tk.TokenID(string(byteToRune[emoji[i]]))
		if !ok {
			t.Fatalf("byte %#x has no token", emoji[i])
		}
		ids = append(ids, id)
	}
	a, _ := tk.TokenID("a")
	pieces := streamAll(tk, append(append([]int32{a}, ids...), a), true)
	want := []string{"a", "", "", "", emoji, "a", ""}
	if strings.Join(pieces, "|") != strings.Join(want, "|") {
		t.Errorf("pieces = %q, want %q", pieces, want)
	}
	// Truncated at the end: Flush gives one U+FFFD per held byte, as Decode does.
	pieces = streamAll(tk, ids[:2], true)
	if pieces[0] != "" || pieces[1] != "" || pieces[2] != "\uFFFD\uFFFD" {
		t.Errorf("truncated pieces = %q", pieces)
	}
	// A byte that can never start a character is not held back.
	if got := tk.NewStream(true).Add(ids[1]); got != "\uFFFD" {
		t.Errorf("stray continuation byte gave %q, want U+FFFD", got)
	}
}

func TestStreamSentencePieceRandom(t *testing.T) {
	for _, src := range []string{llama2Legacy(), llama2Metaspace()} {
		tk := writeFixture(t, src, "")
		rng := rand.New(rand.NewPCG(9, 10))
		for range 200 {
			text := randomText(rng, rng.IntN(20))
			ids, err := tk.Encode(text, true)
			if err != nil {
				t.Fatal(err)
			}
			checkStream(t, tk, ids, true)
			checkStream(t, tk, ids, false)
			raw := make([]int32, rng.IntN(12))
			for i := range raw {
				raw[i] = int32(rng.IntN(tk.VocabSize()))
			}
			checkStream(t, tk, raw, rng.IntN(2) == 0)
		}
	}
}

func FuzzStream(f *testing.F) {
	tk, err := Load("testdata")
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte{0, 1, 0, 0xF0, 0, 0x9F, 0, 0x98, 0, 0x80, 0, 2})
	f.Add([]byte("hello world!"))
	f.Add([]byte{0, 0x80, 0, 0xC3, 1, 0xA9, 1, 0xFF, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		// Two bytes per id, so every id of the vocabulary can occur.
		var ids []int32
		for i := 0; i+1 < len(data); i += 2 {
			ids = append(ids, (int32(data[i])<<8|int32(data[i+1]))%int32(tk.VocabSize()))
		}
		checkStream(t, tk, ids, len(data)%2 == 0)
	})
}
