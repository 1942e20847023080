package tokenizer

import (
	"encoding/json"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestMergeOrderTies: among pairs of equal rank (the same pair at several places) the
// leftmost merges first, and a merge of lower rank anywhere in the word goes before.
func TestMergeOrderTies(t *testing.T) {
	const tok = `{"model": {"type": "BPE",
		"vocab": {"?": 0, "??": 1, "a": 3, "a?": 4, "b": 5, "ab": 6, "bb": 7},
		"merges": ["? ?", "a ?", "a b", "b b"]}}`
	tk := writeFixture(t, tok, "")
	for text, want := range map[string][]int32{
		"???":   {1, 0},    // "??" "?": the leftmost "? ?" first
		"????":  {1, 1},    // "??" "??"
		"?????": {1, 1, 0}, // "??" "??" "?"
		"a???":  {3, 1, 0}, // "? ?" (rank 0) before "a ?" (rank 1)
		"a?":    {4},
		"abbb":  {6, 7}, // "a b" (rank 2) before "b b" (rank 3): "ab" "bb"
		"bbb":   {7, 5}, // leftmost "b b"
		"bbbb":  {7, 7},
	} {
		got, err := tk.Encode(text, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v", text, got, want)
		}
	}
}

// TestMergeMatchesScanReference checks the merge loop against a rank scan on random models
// and words.
func TestMergeMatchesScanReference(t *testing.T) {
	// A small random model over a 4-letter alphabet: every merge of two existing tokens
	// whose concatenation is new. Words are checked against referenceBPE (the rank scan:
	// the lowest-ranked pair anywhere, leftmost among equals), which for a vocabulary
	// without duplicate strings gives what Hugging Face's priority queue gives.
	rng := rand.New(rand.NewPCG(3, 4))
	vocab := map[string]int{"a": 0, "b": 1, "c": 2, "d": 3}
	toks := []string{"a", "b", "c", "d"}
	var merges [][2]string
	ranks := map[[2]string]int{}
	for len(merges) < 60 {
		x, y := toks[rng.IntN(len(toks))], toks[rng.IntN(len(toks))]
		if _, ok := vocab[x+y]; ok || len(x+y) > 6 {
			continue
		}
		vocab[x+y] = len(vocab)
		toks = append(toks, x+y)
		ranks[[2]string{x, y}] = len(merges)
		merges = append(merges, [2]string{x, y})
	}
	v, _ := json.Marshal(vocab)
	mg, _ := json.Marshal(merges)
	tk := writeFixture(t, `{"model": {"type": "BPE", "vocab": `+string(v)+`, "merges": `+string(mg)+`}}`, "")
	for range 2000 {
		n := 1 + rng.IntN(16)
		var chars []string
		for range n {
			chars = append(chars, string(rune('a'+rng.IntN(4))))
		}
		var want []int32
		for _, tok := range referenceBPE(slices.Clone(chars), ranks) {
			want = append(want, int32(vocab[tok]))
		}
		word := strings.Join(chars, "")
		got, err := tk.Encode(word, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Encode(%q) = %v, reference %v", word, got, want)
		}
	}
}

// TestSubwordPrefixSuffix: continuing_subword_prefix goes before every character but a
// word's first, end_of_word_suffix after its last, and a merge (a, b) produces a + b
// without b's prefix, as in Hugging Face's BPE.
func TestSubwordPrefixSuffix(t *testing.T) {
	const tok = `{"pre_tokenizer": {"type": "WhitespaceSplit"},
		"model": {"type": "BPE", "unk_token": "<unk>", "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>",
		"vocab": {"a": 0, "##b": 1, "##c</w>": 2, "ab": 3, "abc</w>": 4, "c</w>": 5, "<unk>": 6, "##b</w>": 7},
		"merges": ["a ##b", "ab ##c</w>"]}}`
	tk := writeFixture(t, tok, "")
	got, err := tk.Encode("abc c ac ab abb ax", false)
	if err != nil {
		t.Fatal(err)
	}
	// abc: a ##b ##c</w> -> ab ##c</w> -> abc</w>; c: c</w>; ac: a ##c</w>; ab: a ##b</w>
	// (no merge of that pair); abb: a ##b ##b</w> -> ab ##b</w>; ax: a, then ##x</w> is
	// unknown.
	want := []int32{4, 5, 0, 2, 0, 7, 3, 7, 0, 6}
	if !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
}

// fastSlowDocs are tokenizer.json documents on which parseFast must agree with parseSlow.
func fastSlowDocs(tb testing.TB) map[string]string {
	docs := map[string]string{
		"ok":        `{` + okModel + `}`,
		"llama2":    llama2Legacy(),
		"metaspace": llama2Metaspace(),
		"qwen":      qwenStyle(tb),
		"escapes": `{"model": {"type": "BPE", "byte_fallback": true, "vocab": {"\n": 0, "\t\"\\/": 1, "\n\t\"\\/": 2,
			"\u00e9": 3, "\ud83d\ude00": 4, "é😀": 5, "<0x0A>": 6}, "merges": [["\n", "\t\"\\/"], "\u00e9 \ud83d\ude00"]}}`,
		"pairs with spaces": `{"model": {"type": "BPE", "vocab": {"a": 0, " ": 1, "a ": 2, "b": 3, "a b": 4},
			"merges": [["a", " "], ["a ", "b"]]}}`,
		"repeated merge": `{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", "a b"]}}`,
		"null merges":    `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": null}}`,
		"empty merges":   `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [ ]}}`,
		"no merges":      `{"model": {"vocab": {"a": 0}}}`,
		"white space": " \n{ \"version\" : \"1.0\" , \"model\" :{ \"merges\" :[ \"a b\" ] , \"vocab\" :{ \"a\" : 0 ,\"b\":1, \"ab\" : 2 } ," +
			" \"unk_token\" : null } , \"extra\" : [1, {\"x\": [true, false, null, -1.5e3]}] }\n",
		"model twice": `{"model": {"vocab": {"x": 0}}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`,
		"unk token":   `{"model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "vocab": {"<unk>": 0, "a": 1}, "merges": []}}`,
	}
	if b, err := os.ReadFile(filepath.Join("testdata", "tokenizer.json")); err == nil {
		docs["testdata"] = string(b)
	}
	return docs
}

// TestParseFastMatchesSlow: the fast reader of tokenizer.json reads what encoding/json reads.
func TestParseFastMatchesSlow(t *testing.T) {
	for name, doc := range fastSlowDocs(t) {
		t.Run(name, func(t *testing.T) { checkFastSlow(t, []byte(doc)) })
	}
	for _, family := range realFamilies {
		t.Run(family, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(realDir(t, family), "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			checkFastSlow(t, data)
		})
	}
}

func checkFastSlow(t *testing.T, data []byte) {
	t.Helper()
	slow, err := parseSlow(data)
	if err != nil {
		t.Fatalf("parseSlow: %v", err)
	}
	fast, ok := parseFast(data)
	if !ok {
		t.Fatalf("parseFast gave up")
	}
	if !reflect.DeepEqual(fast.addedTokens, slow.addedTokens) {
		t.Errorf("added tokens differ")
	}
	for i, pair := range [][2]json.RawMessage{{fast.normalizer, slow.normalizer}, {fast.preTokenizer, slow.preTokenizer},
		{fast.postProcessor, slow.postProcessor}, {fast.decoder, slow.decoder}} {
		if string(pair[0]) != string(pair[1]) {
			t.Errorf("component %d: %s, want %s", i, pair[0], pair[1])
		}
	}
	fm, sm := fast.model.modelJSON, slow.model.modelJSON
	sm.Vocab, sm.Merges = nil, nil
	if !reflect.DeepEqual(fm, sm) {
		t.Errorf("model settings %+v, want %+v", fm, sm)
	}
	if !maps.Equal(fast.model.vocab, slow.model.vocab) {
		t.Errorf("vocabularies differ (%d and %d tokens)", len(fast.model.vocab), len(slow.model.vocab))
	}
	fmod, err := newBPEModel(fast.model)
	if err != nil {
		t.Fatal(err)
	}
	smod, err := newBPEModel(slow.model)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(fmod.ranks, smod.ranks) {
		t.Errorf("merge tables differ (%d and %d pairs)", len(fmod.ranks), len(smod.ranks))
	}
}

// TestParseFastGivesUp: on what it does not read exactly as encoding/json, and on what
// newBPEModel refuses (merges of missing tokens, an unk_token missing from the vocabulary),
// parseFast gives up (and the loader falls back on parseSlow, and reports the error).
func TestParseFastGivesUp(t *testing.T) {
	for name, doc := range map[string]string{
		"case-folded key":   `{"model": {"type": "BPE", "Vocab": {"a": 0}, "merges": []}}`,
		"case-folded model": `{"Model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}`,
		"negative id":       `{"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}}`,
		"fraction id":       `{"model": {"type": "BPE", "vocab": {"a": 1.0}, "merges": []}}`,
		"leading zero":      `{"model": {"type": "BPE", "vocab": {"a": 01}, "merges": []}}`,
		"huge id":           `{"model": {"type": "BPE", "vocab": {"a": 4294967296}, "merges": []}}`,
		"sparse id":         `{"model": {"type": "BPE", "vocab": {"a": 100000}, "merges": []}}`,
		"trailing comma":    `{"model": {"type": "BPE", "vocab": {"a": 0,}, "merges": []}}`,
		"trailing member":   `{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b",]}}`,
		"bad escape":        `{"model": {"type": "BPE", "vocab": {"\x": 0}, "merges": []}}`,
		"control char":      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\x01\": 0}, \"merges\": []}}",
		"bad other member":  `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "x": [1,]}`,
		"garbage after":     `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}} x`,
		"merge unknown":     `{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}}`,
		"merge three":       `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a a a"]}}`,
		"unigram":           `{"model": {"type": "Unigram", "vocab": {"a": 0}}}`,
		"duplicate vocab":   `{"model": {"type": "BPE", "vocab": {"a": 0}, "vocab": {"b": 0}}}`,
		"model null":        `{"model": null}`,
		"unk not in vocab":  `{"model": {"type": "BPE", "unk_token": "<unk>", "vocab": {"a": 0}, "merges": []}}`,
		"empty unk":         `{"model": {"unk_token": "", "vocab": {"00": 0}}}`,
	} {
		if _, ok := parseFast([]byte(doc)); ok {
			t.Errorf("%s: parseFast accepted %s", name, doc)
		}
	}
}

// FuzzParseFast: whatever parseFast accepts, parseSlow reads the same way.
func FuzzParseFast(f *testing.F) {
	docs := fastSlowDocs(f)
	for _, name := range slices.Sorted(maps.Keys(docs)) {
		if name != "testdata" {
			f.Add([]byte(docs[name]))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, ok := parseFast(data); !ok {
			return
		}
		if _, err := parseSlow(data); err != nil {
			t.Fatalf("parseFast accepted what parseSlow refuses: %v", err)
		}
		checkFastSlow(t, data)
	})
}

// BenchmarkEncodeReal encodes testdata/corpus.txt with each real tokenizer, a different
// number in front each time: SentencePiece-style tokenizers (Llama 2, Gemma 3) have no
// pre-tokenizer that cuts the text at spaces, so the whole text is one word, merged afresh
// (as the word cache does not hold it); the others merge only the new number.
func BenchmarkEncodeReal(b *testing.B) {
	text, err := os.ReadFile(filepath.Join("testdata", "corpus.txt"))
	if err != nil {
		b.Fatal(err)
	}
	for _, family := range realFamilies {
		b.Run(family, func(b *testing.B) {
			tk := loadReal(b, family)
			b.SetBytes(int64(len(text)))
			i := 0
			for b.Loop() {
				i++
				if _, err := tk.Encode(strconv.Itoa(i)+string(text), true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
