package tokenizer

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

func loadTest(t testing.TB) *Tokenizer {
	t.Helper()
	tk, err := Load("testdata")
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestTestTokenizerLayout(t *testing.T) {
	tk := loadTest(t)
	if got := tk.VocabSize(); got != 512 {
		t.Errorf("VocabSize = %d, want 512", got)
	}
	for id, want := range []string{"<unk>", "<s>", "</s>"} {
		if got, _ := tk.Token(int32(id)); got != want {
			t.Errorf("Token(%d) = %q, want %q", id, got, want)
		}
		if !tk.IsSpecial(int32(id)) {
			t.Errorf("IsSpecial(%d) = false", id)
		}
	}
	if bos, ok := tk.BOS(); !ok || bos != 1 {
		t.Errorf("BOS = %d, %v; want 1, true", bos, ok)
	}
	if eos := tk.EOS(); !slices.Equal(eos, []int32{2}) {
		t.Errorf("EOS = %v, want [2]", eos)
	}
	ids, err := tk.Encode("The quick brown fox", true)
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] != 1 || slices.Contains(ids[1:], 1) {
		t.Errorf("Encode(addSpecial) = %v, want one leading BOS 1", ids)
	}
	plain, _ := tk.Encode("The quick brown fox", false)
	if !slices.Equal(plain, ids[1:]) {
		t.Errorf("Encode without special = %v, want %v", plain, ids[1:])
	}
	if got := tk.Decode(ids, true); got != "The quick brown fox" {
		t.Errorf("Decode(skipSpecial) = %q", got)
	}
	if got := tk.Decode(ids, false); got != "<s>The quick brown fox" {
		t.Errorf("Decode = %q", got)
	}
	// A frequent corpus word is one token; the byte-level space is part of it.
	the, _ := tk.Encode(" the", false)
	if len(the) != 1 || tk.TokenText(the[0]) != " the" {
		t.Errorf("Encode(\" the\") = %v, want one token \" the\"", the)
	}
}

var roundTripTexts = []string{
	"Hello, world! This is a test.",
	"  leading and trailing spaces  ",
	"tabs\tand\nnew\r\nlines\n\n\n",
	"Ünïcödé àccents: déjà vu, naïve café, Øresund, Łódź, ß",
	"中文测试：你好，世界。日本語のテキスト、한국어",
	"emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
	"mixed 123 4567 89.01 $%^&*() <tag> {json: [1, 2]}",
	"\x00\x01 control \x7f bytes",
	"",
}

func TestRoundTripByteLevel(t *testing.T) {
	tk := loadTest(t)
	for _, s := range roundTripTexts {
		ids, err := tk.Encode(s, false)
		if err != nil {
			t.Fatalf("Encode(%q): %v", s, err)
		}
		for _, id := range ids {
			if id < 0 || int(id) >= tk.VocabSize() {
				t.Fatalf("Encode(%q) gave id %d outside the vocabulary", s, id)
			}
		}
		if got := tk.Decode(ids, false); got != s {
			t.Errorf("Decode(Encode(%q)) = %q", s, got)
		}
	}
}

// referenceBPE is a direct, slow BPE: repeatedly merge the adjacent pair of lowest rank.
func referenceBPE(word []string, ranks map[[2]string]int) []string {
	for {
		best, bestRank := -1, int(^uint(0)>>1)
		for i := 0; i+1 < len(word); i++ {
			if r, ok := ranks[[2]string{word[i], word[i+1]}]; ok && r < bestRank {
				best, bestRank = i, r
			}
		}
		if best < 0 {
			return word
		}
		merged := append([]string{}, word[:best]...)
		merged = append(merged, word[best]+word[best+1])
		word = append(merged, word[best+2:]...)
	}
}

// TestEncodeMatchesReferenceBPE checks the sugarme-backed model against referenceBPE, reading
// testdata/tokenizer.json independently of the loader.
func TestEncodeMatchesReferenceBPE(t *testing.T) {
	tk := loadTest(t)
	raw, err := os.ReadFile(filepath.Join("testdata", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Model struct {
			Vocab  map[string]int32 `json:"vocab"`
			Merges []string         `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	ranks := map[[2]string]int{}
	for i, m := range f.Model.Merges {
		a, b, _ := strings.Cut(m, " ")
		ranks[[2]string{a, b}] = i // a repeated pair keeps its last rank
	}
	corpus, _ := os.ReadFile(filepath.Join("testdata", "corpus.txt"))
	words := strings.Fields(string(corpus))
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		words = append(words, randomText(rng, 1+rng.IntN(12)))
	}
	checked := 0
	for _, w := range words {
		for _, piece := range []string{w, " " + w} {
			// One GPT-2 word at a time: check only inputs that are a single pre-token.
			pre, _ := tk.preTokenize([]string{piece}, true)
			if len(pre) != 1 {
				continue
			}
			var chars []string
			for _, r := range byteLevelEncode(piece) {
				chars = append(chars, string(r))
			}
			var want []int32
			for _, tok := range referenceBPE(chars, ranks) {
				want = append(want, f.Model.Vocab[tok])
			}
			got, err := tk.Encode(piece, false)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("Encode(%q) = %v, reference BPE %v", piece, got, want)
			}
			checked++
		}
	}
	if checked < 500 {
		t.Errorf("only %d words checked", checked)
	}
}

func TestByteLevelAlphabet(t *testing.T) {
	// Values of GPT-2's bytes_to_unicode.
	for b, want := range map[byte]rune{' ': 'Ġ', '\n': 'Ċ', 'a': 'a', 0x00: 'Ā', 0xA0: 'ł', 0xAD: 'Ń', 0xE4: 'ä', 0x7F: 'ġ'} {
		if got := byteToRune[b]; got != want {
			t.Errorf("byteToRune[%#x] = %q, want %q", b, got, want)
		}
	}
	seen := map[rune]bool{}
	for b := range 256 {
		r := byteToRune[b]
		if seen[r] || byteOfRune()[r] != int16(b) {
			t.Fatalf("byte %d: mapping is not a bijection", b)
		}
		seen[r] = true
	}
}

func TestPreTokenizerSplits(t *testing.T) {
	gpt2, _, err := buildPreTokenizer(json.RawMessage(`{"type": "ByteLevel", "add_prefix_space": false}`))
	if err != nil {
		t.Fatal(err)
	}
	llama3, _, err := buildPreTokenizer(json.RawMessage(`{"type": "Split", "pattern": {"Regex": ` + llama3PatternJSON + `}, "behavior": "Isolated", "invert": false}`))
	if err != nil {
		t.Fatal(err)
	}
	prefixed, _, err := buildPreTokenizer(json.RawMessage(`{"type": "ByteLevel", "add_prefix_space": true}`))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		pt   preTokenizer
		in   string
		want []string
	}{
		{"gpt2 words", gpt2, "Hello world", []string{"Hello", " world"}},
		{"gpt2 contraction", gpt2, "I'm here", []string{"I", "'m", " here"}},
		{"gpt2 double space", gpt2, "a  b", []string{"a", " ", " b"}},
		{"gpt2 space newline", gpt2, "a \nb", []string{"a", " ", "\n", "b"}},
		{"gpt2 trailing", gpt2, "x   ", []string{"x", "   "}},
		{"gpt2 classes", gpt2, "123abc!!", []string{"123", "abc", "!!"}},
		{"gpt2 punct", gpt2, " ?!", []string{" ?!"}},
		{"prefix space", prefixed, "Hi", []string{" Hi"}},
		{"llama3 digits", llama3, "1234567", []string{"123", "456", "7"}},
		{"llama3 punct newline", llama3, "Hello, world!\n\n", []string{"Hello", ",", " world", "!\n\n"}},
		{"llama3 case-insensitive", llama3, "I'M", []string{"I", "'M"}},
		{"llama3 lookahead", llama3, "a   b", []string{"a", "  ", " b"}},
	}
	for _, c := range cases {
		got, err := c.pt([]string{c.in}, true)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var decoded []string
		for _, g := range got {
			// Back from the byte-level alphabet (a no-op on the Split outputs here).
			decoded = append(decoded, string(appendByteLevelDecode(nil, g)))
		}
		if !slices.Equal(decoded, c.want) {
			t.Errorf("%s: split(%q) = %q, want %q", c.name, c.in, decoded, c.want)
		}
	}
}

func TestLlama2Legacy(t *testing.T) {
	tk := writeFixture(t, llama2Legacy(), "")
	testSentencePiece(t, tk)
	// The legacy normalizer prepends ▁ to every stretch, also after an added token.
	ids, _ := tk.Encode("<s>Hello", false)
	if want := []int32{1, 271}; !slices.Equal(ids, want) {
		t.Errorf("Encode(<s>Hello) = %v, want %v", ids, want)
	}
}

func TestLlama2Metaspace(t *testing.T) {
	tk := writeFixture(t, llama2Metaspace(), "")
	testSentencePiece(t, tk)
	// prepend_scheme "first": no ▁ after an added token.
	ids, _ := tk.Encode("<s>Hello", false)
	if want := []int32{1, 260, 261, 268, 263}; !slices.Equal(ids, want) {
		t.Errorf("Encode(<s>Hello) = %v, want %v", ids, want)
	}
}

// TestMetaspaceSplitEncode: a Metaspace pre-tokenizer with split and a prepend scheme that
// leaves some stretches without a leading ▁ ("\n" after <s> here, shorter than ▁) used to
// panic in Encode (found by FuzzLoad, testdata/fuzz/FuzzLoad).
func TestMetaspaceSplitEncode(t *testing.T) {
	for _, c := range []struct {
		scheme string
		want   []int32
	}{
		// first: ▁Hello ▁world | <s> | <0x0A>
		{"first", []int32{271, 276, 1, 3 + '\n'}},
		// never: H e ll o (no merge without ▁) ▁world | <s> | <0x0A>
		{"never", []int32{260, 261, 268, 263, 276, 1, 3 + '\n'}},
		{"always", []int32{271, 276, 1, 259, 3 + '\n'}},
	} {
		src := strings.Replace(llama2Metaspace(), `"prepend_scheme": "first", "split": false}`,
			`"prepend_scheme": "`+c.scheme+`", "split": true}`, 1)
		tk, err := FromBytes([]byte(src), nil)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := tk.Encode("Hello world<s>\n", false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids, c.want) {
			t.Errorf("%s: Encode = %v, want %v", c.scheme, ids, c.want)
		}
	}
}

func testSentencePiece(t *testing.T, tk *Tokenizer) {
	t.Helper()
	cases := []struct {
		text string
		want []int32
	}{
		{"Hello world", []int32{1, 271, 276}},
		// 好 (E5 A5 BD) is not in the vocabulary: byte fallback to <0xE5><0xA5><0xBD> = 3+byte.
		{"你好", []int32{1, 259, 277, 3 + 0xE5, 3 + 0xA5, 3 + 0xBD}},
		{"Hello  world", []int32{1, 271, 259, 276}},
	}
	for _, c := range cases {
		ids, err := tk.Encode(c.text, true)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, ids, c.want)
		}
		if got := tk.Decode(ids, true); got != c.text {
			t.Errorf("Decode(%v, skip) = %q, want %q", ids, got, c.text)
		}
	}
	if got := tk.Decode([]int32{1, 271, 276}, false); got != "<s> Hello world" {
		t.Errorf("Decode with <s> = %q, want %q", got, "<s> Hello world")
	}
	if bos, ok := tk.BOS(); !ok || bos != 1 {
		t.Errorf("BOS = %d %v", bos, ok)
	}
	if got := tk.TokenText(271); got != " Hello" {
		t.Errorf("TokenText(▁Hello) = %q, want \" Hello\"", got)
	}
	if got := tk.TokenText(3 + 0xE5); got != "\uFFFD" {
		t.Errorf("TokenText(<0xE5>) = %q, want U+FFFD", got)
	}
	if got := tk.TokenBytes(3 + 0xE5); !bytes.Equal(got, []byte{0xE5}) {
		t.Errorf("TokenBytes(<0xE5>) = %v, want [0xE5]", got)
	}
	if got := tk.TokenBytes(271); string(got) != " Hello" {
		t.Errorf("TokenBytes(▁Hello) = %q, want \" Hello\"", got)
	}
	if got := tk.TokenBytes(-1); got != nil {
		t.Errorf("TokenBytes(-1) = %v, want nil", got)
	}
	if got := tk.TokenText(3 + 'A'); got != "A" {
		t.Errorf("TokenText(<0x41>) = %q, want A", got)
	}
	// Streaming: the first token's leading space is dropped, byte-fallback bytes wait for
	// the end of their character.
	s := tk.NewStream(true)
	var got []string
	for _, id := range []int32{1, 259, 277, 3 + 0xE5, 3 + 0xA5, 3 + 0xBD, 276} {
		got = append(got, s.Add(id))
	}
	got = append(got, s.Flush())
	if want := []string{"", "", "你", "", "", "好", " world", ""}; !slices.Equal(got, want) {
		t.Errorf("stream pieces = %q, want %q", got, want)
	}
}

func TestQwenStyle(t *testing.T) {
	tk := writeFixture(t, qwenStyle(t), configFixture(t, map[string]any{
		"bos_token": nil, "eos_token": "<|im_end|>", "add_bos_token": false,
	}))
	cases := []struct {
		text string
		want []int32
	}{
		{"Hello world", []int32{264, 260}},
		// Added tokens are matched whole; "\n" is byte 10 (Ċ).
		{"<|im_start|>user\nHello<|im_end|>", []int32{268, 'u', 's', 'e', 'r', '\n', 264, 269}},
		{"你好", []int32{266, 0xE5, 0xA5, 0xBD}},
		{"<|im_start|><|im_start|>", []int32{268, 268}},
		{"<|im_start", []int32{'<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't'}},
	}
	for _, c := range cases {
		ids, err := tk.Encode(c.text, true)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, ids, c.want)
		}
		if got := tk.Decode(ids, false); got != c.text {
			t.Errorf("Decode = %q, want %q", got, c.text)
		}
	}
	if got := tk.Decode([]int32{268, 'h', 'i', 269}, true); got != "hi" {
		t.Errorf("Decode(skipSpecial) = %q, want hi", got)
	}
	if _, ok := tk.BOS(); ok {
		t.Errorf("BOS present, want none")
	}
	if eos := tk.EOS(); !slices.Equal(eos, []int32{269}) {
		t.Errorf("EOS = %v, want [269]", eos)
	}
	if got := tk.TokenText(0xE5); got != "\uFFFD" {
		t.Errorf("TokenText(byte E5) = %q", got)
	}
	if got := tk.TokenText(260); got != " world" {
		t.Errorf("TokenText(Ġworld) = %q", got)
	}
	if tk.VocabSize() != 270 {
		t.Errorf("VocabSize = %d, want 270", tk.VocabSize())
	}
}

// TestMergesWithSpaces covers a merge only the pair form can write (a token containing a
// space), the unknown token with fuse_unk, and ignore_merges.
func TestMergesWithSpaces(t *testing.T) {
	const tok = `{"model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "ignore_merges": IGNORE,
		"vocab": {"<unk>": 0, "a": 1, " ": 2, "b": 3, "a ": 4, "a b": 5, "bb": 6, "bbb": 7},
		"merges": [["a", " "], ["a ", "b"], ["b", "b"]]}}`
	tk := writeFixture(t, strings.Replace(tok, "IGNORE", "false", 1), "")
	for text, want := range map[string][]int32{
		"a b":   {5},
		"a ba":  {5, 1},
		"a??b":  {1, 0, 3}, // two unknown characters fuse into one <unk>
		"a?b?":  {1, 0, 3, 0},
		"bbb":   {6, 3}, // merges give bb + b although bbb is in the vocabulary
		"x":     {0},
		"":      nil,
		"a b a": {5, 2, 1},
	} {
		got, err := tk.Encode(text, true)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v", text, got, want)
		}
	}
	ignore := writeFixture(t, strings.Replace(tok, "IGNORE", "true", 1), "")
	if got, _ := ignore.Encode("bbb", false); !slices.Equal(got, []int32{7}) {
		t.Errorf("ignore_merges: Encode(bbb) = %v, want [7]", got)
	}
}

func TestConfigForms(t *testing.T) {
	base := llama2Legacy()
	t.Run("object tokens and add_bos false", func(t *testing.T) {
		tk := writeFixture(t, base, `{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": {"content": "</s>"}, "add_bos_token": false}`)
		ids, _ := tk.Encode("Hello", true)
		if !slices.Equal(ids, []int32{271}) {
			t.Errorf("add_bos_token false: %v", ids)
		}
		if eos := tk.EOS(); !slices.Equal(eos, []int32{2}) {
			t.Errorf("EOS = %v", eos)
		}
	})
	t.Run("add_eos", func(t *testing.T) {
		tk := writeFixture(t, base, `{"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true, "add_eos_token": true}`)
		ids, _ := tk.Encode("Hello", true)
		if !slices.Equal(ids, []int32{1, 271, 2}) {
			t.Errorf("add_eos_token: %v", ids)
		}
	})
	t.Run("template list", func(t *testing.T) {
		tk := writeFixture(t, base, `{"eos_token": "</s>", "chat_template": [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "{{ messages[0].content }}!"}]}`)
		out, err := tk.ApplyChatTemplate([]Message{{Role: "user", Content: "hi"}}, false)
		if err != nil || out != "hi!" {
			t.Errorf("ApplyChatTemplate = %q, %v; want the default template's \"hi!\"", out, err)
		}
	})
	t.Run("unknown bos", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(base), 0o644)
		os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"bos_token": "<nope>"}`), 0o644)
		if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "<nope>") {
			t.Errorf("Load = %v, want an error naming <nope>", err)
		}
	})
}

// randomText draws n runes from a mix of ASCII, accented Latin, CJK, emoji (with ZWJ and
// modifiers) and white space.
func randomText(rng *rand.Rand, n int) string {
	pools := [][]rune{
		[]rune("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 .,!?'\"-"),
		[]rune("àéîõüçñßøåÆŁŞ"),
		[]rune("你好世界中文日本語한국어"),
		[]rune("😀👍🏽👨\u200d👩🇫🇷🎉🦀"),
		[]rune(" \n\t  \r\n"),
	}
	var b strings.Builder
	for range n {
		p := pools[rng.IntN(len(pools))]
		b.WriteRune(p[rng.IntN(len(p))])
	}
	return b.String()
}

func TestRoundTripRandom(t *testing.T) {
	tk := loadTest(t)
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		s := randomText(rng, rng.IntN(40))
		ids, err := tk.Encode(s, true)
		if err != nil {
			t.Fatal(err)
		}
		if got := tk.Decode(ids, true); got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
	}
}

func TestDecodeInvalid(t *testing.T) {
	tk := loadTest(t)
	ids, _ := tk.Encode("ok", false)
	if got := tk.Decode(append([]int32{-5, 100000}, ids...), false); got != "ok" {
		t.Errorf("Decode with unknown ids = %q, want ok", got)
	}
	if tk.TokenText(-1) != "" || tk.TokenText(1<<20) != "" {
		t.Errorf("TokenText of unknown ids is not empty")
	}
	// "é" is C3 A9; the byte tokens alone, out of order, give one U+FFFD per byte.
	c3, _ := tk.TokenID(string(byteToRune[0xC3]))
	a9, _ := tk.TokenID(string(byteToRune[0xA9]))
	for _, c := range []struct {
		ids  []int32
		want string
	}{
		{[]int32{c3, a9}, "é"},
		{[]int32{a9, c3}, "\uFFFD\uFFFD"},
		{[]int32{c3}, "\uFFFD"},
	} {
		got := tk.Decode(c.ids, false)
		if got != c.want || !utf8.ValidString(got) {
			t.Errorf("Decode(%v) = %q, want %q", c.ids, got, c.want)
		}
	}
}

// FuzzEncode encodes arbitrary bytes (also invalid UTF-8) with every fixture: no panic, ids
// inside the vocabulary, valid UTF-8 out, and for the byte-level test tokenizer the text back
// (invalid bytes as U+FFFD).
func FuzzEncode(f *testing.F) {
	var tks []*Tokenizer
	for _, src := range []string{llama2Legacy(), llama2Metaspace(), qwenStyle(f)} {
		tk, err := FromBytes([]byte(src), nil)
		if err != nil {
			f.Fatal(err)
		}
		tks = append(tks, tk)
	}
	test, err := Load("testdata")
	if err != nil {
		f.Fatal(err)
	}
	tks = append(tks, test)
	for _, s := range roundTripTexts {
		f.Add(s)
	}
	f.Add("a\xffb\xe4\xbd")
	f.Add("<s>\xc3<|im_start|>\xa9")
	f.Fuzz(func(t *testing.T, s string) {
		for i, tk := range tks {
			ids, err := tk.Encode(s, true)
			if err != nil {
				t.Fatalf("tokenizer %d: Encode(%q): %v", i, s, err)
			}
			for _, id := range ids {
				if id < 0 || int(id) >= tk.VocabSize() {
					t.Fatalf("tokenizer %d: id %d outside the vocabulary", i, id)
				}
			}
			got := tk.Decode(ids, true)
			if !utf8.ValidString(got) {
				t.Fatalf("tokenizer %d: Decode is not valid UTF-8", i)
			}
			// The test tokenizer has no normalizer: exact round trip (the Qwen-style fixture
			// applies NFC, which rewrites compatibility characters).
			if i == 3 && !strings.Contains(s, "<") && got != string(appendLossy(nil, []byte(s))) {
				t.Fatalf("tokenizer %d: Decode(Encode(%q)) = %q", i, s, got)
			}
		}
	})
}

func TestAddedTokenFlags(t *testing.T) {
	tk := writeFixture(t, `{"added_tokens": [
		{"id": 10, "content": "<m>", "lstrip": true, "special": true},
		{"id": 11, "content": "<r>", "rstrip": true, "special": false},
		{"id": 12, "content": "ab", "single_word": true, "special": false},
		{"id": 13, "content": "<m>x", "special": false}],
		"model": {"type": "BPE", "vocab": {"a": 0, " ": 1, "b": 2, "x": 3}, "merges": []}}`, "")
	for text, want := range map[string][]int32{
		"a <m>b":   {0, 10, 2}, // lstrip takes the space before
		"a<r>  b":  {0, 11, 2}, // rstrip takes the spaces after
		"ab":       {12},       // a single word
		"aab":      {0, 0, 2},  // not a single word: a letter before
		"a ab b":   {0, 1, 12, 1, 2},
		"<m>x <m>": {13, 10}, // the longest added token wins; lstrip eats the space
	} {
		got, err := tk.Encode(text, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v", text, got, want)
		}
	}
	if got := tk.Decode([]int32{0, 10, 11, 12}, true); got != "a<r>ab" {
		t.Errorf("Decode(skipSpecial) = %q, want %q", got, "a<r>ab")
	}
}

// TestEncodeConcurrent shares one tokenizer between goroutines (run with -race); the
// fixture's Digits pre-tokenizer runs on regexp2 and the word cache fills concurrently.
func TestEncodeConcurrent(t *testing.T) {
	src := strings.Replace(qwenStyle(t), `"pre_tokenizer": {"type": "Sequence", "pretokenizers": [`,
		`"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, `, 1)
	tk := writeFixture(t, src, "")
	texts := []string{"Hello world 123", "<|im_start|>你好<|im_end|>", "emoji 😀 and 42"}
	want := make([][]int32, len(texts))
	for i, s := range texts {
		want[i], _ = tk.Encode(s, true)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 50 {
				i := (g + k) % len(texts)
				got, err := tk.Encode(texts[i], true)
				if err != nil || !slices.Equal(got, want[i]) {
					t.Errorf("concurrent Encode(%q) = %v, %v; want %v", texts[i], got, err, want[i])
					return
				}
				if tk.Decode(got, false) != texts[i] {
					t.Errorf("concurrent Decode(%v) = %q", got, tk.Decode(got, false))
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestStreamAfterKeepsTheSpaceAfterAPrompt checks that a completion's text is what
// decoding prompt and completion together adds to the prompt's text, also for decoders
// that strip the leading space of a text: "Hello" + "▁world" continues with " world".
func TestStreamAfterKeepsTheSpaceAfterAPrompt(t *testing.T) {
	for name, src := range map[string]string{"llama2-metaspace": llama2Metaspace(), "llama2-legacy": llama2Legacy()} {
		tk := writeFixture(t, src, "")
		ids, err := tk.Encode("Hello world  你好", true)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k <= len(ids); k++ {
			prompt, rest := ids[:k], ids[k:]
			s := tk.NewStreamAfter(prompt, true)
			var got strings.Builder
			for _, id := range rest {
				got.WriteString(s.Add(id))
			}
			got.WriteString(s.Flush())
			full, head := tk.Decode(ids, true), tk.Decode(prompt, true)
			if !strings.HasPrefix(full, head) {
				continue // the prompt ends inside a character
			}
			if want := strings.TrimPrefix(full, head); got.String() != want {
				t.Errorf("%s: after %v: continuation %q, want %q (full %q)", name, prompt, got.String(), want, full)
			}
		}
	}
}
