package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// fromGGUF builds a tokenizer from the tokenizer metadata of a GGUF file: FromBytes over
// the files TokenizerFilesFromGGUF writes.
func fromGGUF(v *GGUFVocab) (*Tokenizer, error) {
	tokenizerJSON, configJSON, err := TokenizerFilesFromGGUF(v)
	if err != nil {
		return nil, err
	}
	return FromBytes(tokenizerJSON, configJSON)
}

// The real-file tests build, from each family's Hugging Face files, the GGUF metadata that
// llama.cpp's convert_hf_to_gguf.py writes from them (ggufFromHF), convert it back with
// TokenizerFilesFromGGUF, and compare the result with the original files as this package
// loads them: the same tokens, merges and special tokens, and the same ids for every text of
// a multilingual corpus. The reference is the original files, not this conversion.

// ggufFamilies are the real families and how convert_hf_to_gguf.py writes them:
// tokenizer.ggml.pre is the name its hash of the encoded check text selects (Llama 3.1:
// "llama-bpe", Qwen3: "qwen2"); Gemma 3 is written with add_space_prefix false.
var ggufFamilies = []struct {
	family, model, pre string
	addSpacePrefix     *bool
}{
	{"llama3_1", "gpt2", "llama-bpe", nil},
	{"qwen3", "gpt2", "qwen2", nil},
	{"gemma3", "llama", "", new(false)},
	{"llama2", "llama", "", nil},
}

// ggufHFFile is what ggufFromHF reads of tokenizer.json.
type ggufHFFile struct {
	AddedTokens []struct {
		ID      int    `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         struct {
		Vocab  map[string]int    `json:"vocab"`
		Merges []json.RawMessage `json:"merges"`
	} `json:"model"`
}

// ggufLooksSpecial is convert_hf_to_gguf.py's does_token_look_special: added tokens it marks
// control though the files do not call them special.
func ggufLooksSpecial(s string) bool {
	switch s {
	case "<pad>", "<mask>", "<2mass>", "[@BOS@]":
		return true
	}
	return strings.HasPrefix(s, "<|") && strings.HasSuffix(s, "|>") ||
		strings.HasPrefix(s, "<｜") && strings.HasSuffix(s, "｜>") ||
		strings.HasPrefix(s, "<unused") && strings.HasSuffix(s, ">")
}

var ggufByteToken = regexp.MustCompile(`^<0x[0-9A-Fa-f]{2}>$`)

// hfMerges returns the merges of tokenizer.json as pairs.
func hfMerges(t testing.TB, raw []json.RawMessage) [][2]string {
	t.Helper()
	merges, err := parseMerges(raw)
	if err != nil {
		t.Fatal(err)
	}
	return merges
}

// ggufFromHF writes the tokenizer metadata convert_hf_to_gguf.py writes for the files in
// dir: for a "gpt2" model as _set_vocab_gpt2 (get_vocab_base and SpecialVocab with merges),
// for a "llama" model as _set_vocab_sentencepiece (_create_vocab_sentencepiece and
// SpecialVocab). Token types: control for special added tokens and for added tokens that
// look special, user-defined for the other added tokens (SentencePiece ones with "▁" written
// as spaces), byte for <0xNN> (SentencePiece), normal otherwise, unused "[PADn]" for missing
// ids.
//
// SentencePiece scores come from tokenizer.model, which is not among these files (and the
// llama_hf path without it writes -1000 for every token). transformers' converter sorted the
// merges of tokenizer.json by those scores, so their order gives the scores back up to a
// monotone map, which is all the merge order depends on: a normal piece scores minus the rank
// of the first merge that makes it, counted from the first merge that makes a normal piece
// (SentencePiece's first normal piece scores 0, as its control and user-defined pieces do);
// added tokens score -1000, as the converter writes; other pieces 0.
func ggufFromHF(t testing.TB, dir, model, pre string, addSpacePrefix *bool) *GGUFVocab {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f ggufHFFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	rawCfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg configJSON
	if err := json.Unmarshal(rawCfg, &cfg); err != nil {
		t.Fatal(err)
	}
	spm := model == "llama"

	n := 0
	for _, id := range f.Model.Vocab {
		n = max(n, id+1)
	}
	for _, at := range f.AddedTokens {
		n = max(n, at.ID+1)
	}
	v := &GGUFVocab{Model: model, Pre: pre, Tokens: make([]string, n), Types: make([]int32, n),
		BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1, EOM: -1, AddSpacePrefix: addSpacePrefix}
	if spm {
		v.Scores = make([]float32, n)
	}
	for i := range v.Tokens {
		v.Tokens[i], v.Types[i] = fmt.Sprintf("[PAD%d]", i), ggufUnused
	}
	for tok, id := range f.Model.Vocab {
		v.Tokens[id], v.Types[id] = tok, ggufNormal
		if spm && ggufByteToken.MatchString(tok) {
			v.Types[id] = ggufByte
		}
	}
	for _, at := range f.AddedTokens {
		tok, typ := at.Content, int32(ggufControl)
		if !at.Special && !ggufLooksSpecial(tok) {
			typ = ggufUserDefined
			if spm {
				tok = strings.ReplaceAll(tok, "▁", " ")
			}
		}
		v.Tokens[at.ID], v.Types[at.ID] = tok, typ
		if spm {
			v.Scores[at.ID] = -1000
		}
	}

	merges := hfMerges(t, f.Model.Merges)
	if spm {
		first := map[string]int{}
		for rank, m := range merges {
			if _, ok := first[m[0]+m[1]]; !ok {
				first[m[0]+m[1]] = rank
			}
		}
		base := len(merges)
		for id, tok := range v.Tokens {
			if r, ok := first[tok]; ok && v.Types[id] == ggufNormal {
				base = min(base, r)
			}
		}
		for id, tok := range v.Tokens {
			if r, ok := first[tok]; ok && v.Types[id] == ggufNormal {
				v.Scores[id] = -float32(r - base)
			}
		}
	} else {
		v.Merges = make([]string, len(merges))
		for i, m := range merges {
			// gguf-py writes a space inside a token as U+0120.
			v.Merges[i] = strings.ReplaceAll(m[0], " ", "Ġ") + " " + strings.ReplaceAll(m[1], " ", "Ġ")
		}
	}

	// SpecialVocab: the special tokens of tokenizer_config.json, looked up among the added
	// tokens; add_bos_token and add_eos_token from it, else from a TemplateProcessing.
	lookup := func(r tokenRef) int32 {
		if !r.Set {
			return -1
		}
		for _, at := range f.AddedTokens {
			if at.Content == r.Content {
				return int32(at.ID)
			}
		}
		return -1
	}
	v.BOS, v.EOS, v.UNK, v.PAD = lookup(cfg.BOSToken), lookup(cfg.EOSToken), lookup(cfg.UnkToken), lookup(cfg.PadToken)
	v.AddBOS, v.AddEOS = cfg.AddBOSToken, cfg.AddEOSToken
	if first, last, ok := templateEnds(t, f.PostProcessor); ok {
		if v.AddBOS == nil && first != "" {
			v.AddBOS = new(first == cfg.BOSToken.Content)
		}
		if v.AddEOS == nil && last != "" {
			v.AddEOS = new(last == cfg.EOSToken.Content)
		}
	}
	if v.ChatTemplate, err = parseChatTemplate(cfg.ChatTemplate); err != nil {
		t.Fatal(err)
	}
	return v
}

// templateEnds returns the special tokens that start and end the single-sequence template
// of a TemplateProcessing post-processor (alone or in a Sequence), "" where a sequence
// starts or ends it.
func templateEnds(t testing.TB, raw json.RawMessage) (first, last string, ok bool) {
	t.Helper()
	if isNull(raw) {
		return "", "", false
	}
	var p struct {
		Type       string            `json:"type"`
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
		} `json:"single"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	switch p.Type {
	case "Sequence":
		for _, r := range p.Processors {
			if first, last, ok = templateEnds(t, r); ok {
				return first, last, ok
			}
		}
	case "TemplateProcessing":
		if len(p.Single) > 1 {
			if s := p.Single[0].SpecialToken; s != nil {
				first = s.ID
			}
			if s := p.Single[len(p.Single)-1].SpecialToken; s != nil {
				last = s.ID
			}
		}
		return first, last, true
	}
	return "", "", false
}

// ggufCorpus is the multilingual corpus of testdata/hf_refs.json (English, code, numbers,
// CJK, Arabic, Hebrew, Indic and other scripts, emoji, whitespace runs, control characters,
// the special tokens of every family in text) and a few texts for what the conversion adds:
// decomposed characters (Qwen's NFC), runs of spaces next to words (Gemma's "▁▁" tokens), the
// added tokens the converter marks control.
func ggufCorpus(t testing.TB) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "hf_refs.json"))
	if err != nil {
		t.Fatal(err)
	}
	var refs hfRefs
	if err := json.Unmarshal(raw, &refs); err != nil {
		t.Fatal(err)
	}
	return append(refs.Texts,
		"Ame\u0301lie na\u0308ive an\u0303o Cafe\u0301 \u1100\u1161\u11a8",
		"  the  cat   sat    on\t the  mat  ",
		"x  =  1;\n    if  (y)  {\n        return  z;\n    }",
		"<unused0> <mask> [multimodal] <table><tr><td>1</td></tr></table>",
		"<think>\nok\n</think><|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>c<|file_sep|>",
		"▁▁ two metaspaces ▁▁▁ and \u2581 one",
	)
}

// TestGGUFRealFamilies converts each real family's GGUF metadata back and compares with the
// original files.
func TestGGUFRealFamilies(t *testing.T) {
	for _, fam := range ggufFamilies {
		t.Run(fam.family, func(t *testing.T) {
			dir := realDir(t, fam.family)
			want, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			v := ggufFromHF(t, dir, fam.model, fam.pre, fam.addSpacePrefix)
			tj, cj, err := TokenizerFilesFromGGUF(v)
			if err != nil {
				t.Fatal(err)
			}
			got, err := FromBytes(tj, cj)
			if err != nil {
				t.Fatal(err)
			}
			// Added tokens the files do not call special but the converter marks control:
			// special here (they differ only for Decode with skipSpecial).
			madeSpecial := map[int32]bool{}
			for id := range int32(want.VocabSize()) {
				if tok, ok := want.Token(id); ok && want.added[id] && !want.IsSpecial(id) && ggufLooksSpecial(tok) {
					madeSpecial[id] = true
				}
			}
			t.Run("vocabulary", func(t *testing.T) { ggufCompareVocab(t, want, got, madeSpecial) })
			t.Run("merges", func(t *testing.T) { ggufCompareMerges(t, dir, tj, fam.family) })
			t.Run("encode", func(t *testing.T) { ggufCompareEncode(t, want, got, ggufCorpus(t), madeSpecial) })
		})
	}
}

func ggufCompareVocab(t *testing.T, want, got *Tokenizer, madeSpecial map[int32]bool) {
	if want.VocabSize() != got.VocabSize() {
		t.Fatalf("VocabSize = %d, want %d", got.VocabSize(), want.VocabSize())
	}
	bad := 0
	for id := range int32(want.VocabSize()) {
		w, _ := want.Token(id)
		g, _ := got.Token(id)
		switch {
		case w != g:
			t.Errorf("token %d = %q, want %q", id, g, w)
		case !slices.Equal(got.TokenBytes(id), want.TokenBytes(id)):
			t.Errorf("token %d %q decodes to %q, want %q", id, w, got.TokenBytes(id), want.TokenBytes(id))
		case got.IsSpecial(id) != (want.IsSpecial(id) || madeSpecial[id]):
			t.Errorf("token %d %q: special %v, want %v", id, w, got.IsSpecial(id), want.IsSpecial(id))
		default:
			continue
		}
		if bad++; bad > 10 {
			t.Fatal("too many differences")
		}
	}
	wb, wok := want.BOS()
	gb, gok := got.BOS()
	if wb != gb || wok != gok {
		t.Errorf("BOS = %d %v, want %d %v", gb, gok, wb, wok)
	}
	if !slices.Equal(got.EOS(), want.EOS()) {
		t.Errorf("EOS = %v, want %v", got.EOS(), want.EOS())
	}
	if got.ChatTemplateSource() != want.ChatTemplateSource() {
		t.Errorf("chat template differs")
	}
	t.Logf("%d tokens, %d added tokens made special", want.VocabSize(), len(madeSpecial))
}

// ggufCompareMerges compares the converted merges with the original ones: equal, except
// Llama 2's. Its tokenizer.json was written by an older transformers, whose extractor
// ordered the merges of one piece by the ids of their parts; the current one (which the
// conversion follows) by the parts' lengths. The pieces come in the same order, so merge i
// makes the same piece in both lists, and the lists hold the same merges.
func ggufCompareMerges(t *testing.T, dir string, tj []byte, family string) {
	var wantF, gotF ggufHFFile
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &wantF); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(tj, &gotF); err != nil {
		t.Fatal(err)
	}
	want, got := hfMerges(t, wantF.Model.Merges), hfMerges(t, gotF.Model.Merges)
	if len(got) != len(want) {
		t.Fatalf("%d merges, want %d", len(got), len(want))
	}
	samePiece := family == "llama2"
	moved := 0
	for i := range want {
		if got[i] == want[i] {
			continue
		}
		if !samePiece || got[i][0]+got[i][1] != want[i][0]+want[i][1] {
			t.Fatalf("merge %d = %q, want %q", i, got[i], want[i])
		}
		moved++
	}
	if samePiece {
		key := func(m [2]string) string { return m[0] + "\x00" + m[1] }
		ws, gs := make([]string, len(want)), make([]string, len(got))
		for i := range want {
			ws[i], gs[i] = key(want[i]), key(got[i])
		}
		slices.Sort(ws)
		slices.Sort(gs)
		if !slices.Equal(ws, gs) {
			t.Fatal("the merges differ")
		}
	}
	t.Logf("%d merges, %d in another order among the merges of their piece", len(want), moved)
}

func ggufCompareEncode(t *testing.T, want, got *Tokenizer, corpus []string, madeSpecial map[int32]bool) {
	bad, roundTrips := 0, 0
	for _, text := range corpus {
		for _, addSpecial := range []bool{false, true} {
			w, err := want.Encode(text, addSpecial)
			if err != nil {
				t.Fatal(err)
			}
			g, err := got.Encode(text, addSpecial)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(g, w) {
				t.Errorf("Encode(%q, %v):\n got %v %s\nwant %v %s", text, addSpecial, g, tokStrings(got, g), w, tokStrings(want, w))
				if bad++; bad > 10 {
					t.Fatal("too many differences")
				}
				continue
			}
			if !addSpecial {
				if s := got.Decode(g, false); s != want.Decode(w, false) {
					t.Errorf("Decode(Encode(%q)) = %q, want %q", text, s, want.Decode(w, false))
				} else if s == text {
					roundTrips++
				}
			}
			if !slices.ContainsFunc(g, func(id int32) bool { return madeSpecial[id] }) {
				if s := got.Decode(g, true); s != want.Decode(w, true) {
					t.Errorf("Decode(Encode(%q, %v), skipSpecial) = %q, want %q", text, addSpecial, s, want.Decode(w, true))
				}
			}
		}
	}
	t.Logf("%d texts encode alike with and without special tokens; %d decode back to themselves", len(corpus), roundTrips)
}

// ggufTestVocab is a small SentencePiece vocabulary: control and byte tokens, characters,
// three merged pieces and Gemma's user-defined "▁▁" written with spaces.
func ggufTestVocab() *GGUFVocab {
	return &GGUFVocab{
		Model:  "llama",
		Tokens: []string{"<unk>", "<s>", "</s>", "<0x21>", "▁", "a", "b", "ab", "▁a", "▁ab", "  "},
		Types:  []int32{2, 3, 3, 6, 1, 1, 1, 1, 1, 1, 4},
		Scores: []float32{0, 0, 0, 0, -10, -11, -12, -1, -2, -3, -1000},
		BOS:    -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1, EOM: -1,
	}
}

// ggufMerges returns the merges of a converted tokenizer.json.
func ggufMerges(t *testing.T, tj []byte) [][2]string {
	t.Helper()
	var f ggufHFFile
	if err := json.Unmarshal(tj, &f); err != nil {
		t.Fatal(err)
	}
	return hfMerges(t, f.Model.Merges)
}

func TestGGUFSentencePiece(t *testing.T) {
	v := ggufTestVocab()
	tj, cj, err := TokenizerFilesFromGGUF(v)
	if err != nil {
		t.Fatal(err)
	}
	// By score (user-defined pieces score 0), then the longer left part first.
	wantMerges := [][2]string{{"▁", "▁"}, {"a", "b"}, {"▁", "a"}, {"▁a", "b"}, {"▁", "ab"}}
	if got := ggufMerges(t, tj); !slices.Equal(got, wantMerges) {
		t.Errorf("merges = %q, want %q", got, wantMerges)
	}
	tk, err := FromBytes(tj, cj)
	if err != nil {
		t.Fatal(err)
	}
	// llama.cpp's defaults: bos 1, eos 2, unk 0, a BOS added.
	if bos, ok := tk.BOS(); !ok || bos != 1 || !slices.Equal(tk.EOS(), []int32{2}) {
		t.Errorf("BOS, EOS = %d %v, %v; want 1, [2]", bos, ok, tk.EOS())
	}
	if tok, _ := tk.Token(10); tok != "▁▁" || tk.IsSpecial(10) || !tk.IsSpecial(1) || !tk.IsSpecial(0) {
		t.Errorf("token 10 = %q (special %v), want ▁▁, not special; <unk> and <s> special", tok, tk.IsSpecial(10))
	}
	for _, c := range []struct {
		text        string
		addSpecial  bool
		want        []int32
		wantDecoded string
	}{
		{"ab ab", true, []int32{1, 9, 9}, "<s> ab ab"},
		{"ab ab", false, []int32{9, 9}, "ab ab"},
		{"ab!", false, []int32{9, 3}, "ab!"}, // byte fallback
		{"  a", false, []int32{10, 8}, ""},   // "▁▁" by merges, not matched in the text
		{"<s>a</s>", false, []int32{1, 8, 2}, "<s> a</s>"},
		{"c", false, []int32{4, 0}, ""}, // no piece, no byte token: <unk>
	} {
		got, err := tk.Encode(c.text, c.addSpecial)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q, %v) = %v, want %v", c.text, c.addSpecial, got, c.want)
		}
		if c.wantDecoded != "" {
			if s := tk.Decode(got, false); s != c.wantDecoded {
				t.Errorf("Decode(%v) = %q, want %q", got, s, c.wantDecoded)
			}
		}
	}

	// Without the space prefix (Gemma): no "▁" in front, no space stripped.
	v.AddSpacePrefix, v.AddBOS = new(false), new(false)
	tk, err = fromGGUF(v)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := tk.Encode("ab ab", true); !slices.Equal(got, []int32{7, 9}) {
		t.Errorf("without prefix: Encode = %v, want [7 9]", got)
	}
	if s := tk.Decode([]int32{9, 7}, false); s != " abab" {
		t.Errorf("without prefix: Decode = %q, want %q", s, " abab")
	}

	// Without scores, or with one score for every piece: merges by id, shorter left part first.
	byID := [][2]string{{"a", "b"}, {"▁", "a"}, {"▁", "ab"}, {"▁a", "b"}, {"▁", "▁"}}
	for _, scores := range [][]float32{nil, slices.Repeat([]float32{-1000}, len(v.Tokens))} {
		v.Scores = scores
		tj, _, err := TokenizerFilesFromGGUF(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := ggufMerges(t, tj); !slices.Equal(got, byID) {
			t.Errorf("scores %v: merges = %q, want %q", scores, got, byID)
		}
	}
}

// ggufByteLevelVocab is a byte-level vocabulary: the 256 byte tokens, "34", "45" and "Ġt"
// (ids 256 to 258) by merges, and the control token <s>.
func ggufByteLevelVocab(pre string) *GGUFVocab {
	v := &GGUFVocab{Model: "gpt2", Pre: pre, BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1, EOM: -1}
	for b := range 256 {
		v.Tokens = append(v.Tokens, byteLevelEncode(string([]byte{byte(b)})))
		v.Types = append(v.Types, ggufNormal)
	}
	v.Tokens = append(v.Tokens, "34", "45", "Ġt", "<s>")
	v.Types = append(v.Types, ggufNormal, ggufNormal, ggufNormal, ggufControl)
	v.Merges = []string{"3 4", "4 5", "Ġ t"}
	v.BOS = int32(len(v.Tokens) - 1)
	return v
}

// TestGGUFPreTokenizers builds every pre-tokenizer llama.cpp names, checks that text round
// trips through it, and that digits are split as each expression says.
func TestGGUFPreTokenizers(t *testing.T) {
	text := "Hello, World! I'm 12345 años\tof 💡 代码 مرحبا\n\n  x   y\r\n<s>"
	for name := range ggufPreTokenizers {
		tk, err := fromGGUF(ggufByteLevelVocab(name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ids, err := tk.Encode(text, false)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s := tk.Decode(ids, false); s != text {
			t.Errorf("%s: Decode(Encode(%q)) = %q", name, text, s)
		}
	}
	// "12345": GPT-2 keeps the digits in one word ("34" forms first), Llama 3 and llama.cpp's
	// default cut them in threes ("123", "45"), Qwen2 and SmolLM into single digits.
	for _, c := range []struct {
		pre            string
		want34, want45 bool
	}{{"gpt-2", true, false}, {"llama-bpe", false, true}, {"default", false, true}, {"qwen2", false, false}, {"smollm", false, false}} {
		tk, err := fromGGUF(ggufByteLevelVocab(c.pre))
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := tk.Encode("12345", false)
		if has34, has45 := slices.Contains(ids, 256), slices.Contains(ids, 257); has34 != c.want34 || has45 != c.want45 {
			t.Errorf("%s: Encode(12345) = %v, want \"34\" %v, \"45\" %v", c.pre, ids, c.want34, c.want45)
		}
	}
	// llama.cpp's add_bos_token when the file does not say: Llama 3 adds BOS, GPT-2 does not.
	for pre, want := range map[string]int{"llama-bpe": 1, "gpt-2": 0, "qwen2": 0} {
		tk, err := fromGGUF(ggufByteLevelVocab(pre))
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := tk.Encode(" t", true)
		if len(ids) != want+1 || ids[len(ids)-1] != 258 {
			t.Errorf("%s: Encode(\" t\", true) = %v, want %d BOS and Ġt", pre, ids, want)
		}
	}
}

// TestGGUFRefusals checks that bad metadata is refused with one line wrapping ErrInvalid.
func TestGGUFRefusals(t *testing.T) {
	for _, base := range []func() *GGUFVocab{ggufTestVocab, func() *GGUFVocab { return ggufByteLevelVocab("gpt-2") }} {
		if _, err := fromGGUF(base()); err != nil {
			t.Fatalf("base vocabulary refused: %v", err)
		}
	}
	spm := func(edit func(v *GGUFVocab)) *GGUFVocab { v := ggufTestVocab(); edit(v); return v }
	bl := func(edit func(v *GGUFVocab)) *GGUFVocab { v := ggufByteLevelVocab("gpt-2"); edit(v); return v }
	for _, c := range []struct {
		name string
		v    *GGUFVocab
		want string
	}{
		{"nil", nil, "vocabulary is missing"},
		{"model", spm(func(v *GGUFVocab) { v.Model = "bert" }), `tokenizer model "bert" is not supported (supported: gpt2, llama)`},
		{"pre", bl(func(v *GGUFVocab) { v.Pre = "xyz" }), `pre-tokenizer "xyz" is not supported (supported: `},
		{"empty", spm(func(v *GGUFVocab) { v.Tokens, v.Types, v.Scores = nil, nil, nil }), "vocabulary is empty"},
		{"scores", spm(func(v *GGUFVocab) { v.Scores = v.Scores[:3] }), "3 scores for 11 tokens"},
		{"types", spm(func(v *GGUFVocab) { v.Types = append(v.Types, 1) }), "12 token types for 11 tokens"},
		{"type value", spm(func(v *GGUFVocab) { v.Types[5] = 9 }), `token 5 "a" has type 9`},
		{"bos", spm(func(v *GGUFVocab) { v.BOS = 11 }), "bos token id 11 is out of range (11 tokens)"},
		{"eos", bl(func(v *GGUFVocab) { v.EOS = -2 }), "eos token id -2 is out of range"},
		{"unk", spm(func(v *GGUFVocab) { v.UNK = 1 << 30 }), "unknown token id 1073741824 is out of range"},
		{"pad", spm(func(v *GGUFVocab) { v.PAD = 99 }), "padding token id 99 is out of range"},
		{"eot", bl(func(v *GGUFVocab) { v.EOT = 1000 }), "eot token id 1000 is out of range"},
		{"eom", bl(func(v *GGUFVocab) { v.EOM = -7 }), "eom token id -7 is out of range"},
		{"duplicate", spm(func(v *GGUFVocab) { v.Tokens[6] = "a" }), `token "a" has ids 5 and 6`},
		{"utf-8", spm(func(v *GGUFVocab) { v.Tokens[6] = "\xff" }), `token 6 "\xff" is not valid UTF-8`},
		{"merge token", bl(func(v *GGUFVocab) { v.Merges[0] = "3 €" }), `merge 0 "3 €" names a token that is not in the vocabulary`},
		{"merge result", bl(func(v *GGUFVocab) { v.Merges[0] = "5 3" }), `merge 0 "5 3" names a token`},
		{"merge form", bl(func(v *GGUFVocab) { v.Merges[1] = "34" }), `merge 1 "34" is not two tokens separated by a space`},
		{"merge empty", bl(func(v *GGUFVocab) { v.Merges[1] = "" }), `merge 1 "" is not two tokens`},
		{"no merges", bl(func(v *GGUFVocab) { v.Merges = nil }), "without merges"},
		{"add bos", bl(func(v *GGUFVocab) { v.BOS, v.AddBOS = -1, new(true) }), "add_bos_token is true but there is no bos token id"},
		{"add eos", bl(func(v *GGUFVocab) { v.AddEOS = new(true) }), "add_eos_token is true but there is no eos token id"},
		{"default bos", bl(func(v *GGUFVocab) { v.Pre, v.BOS = "llama-bpe", -1 }), "add_bos_token is true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := TokenizerFilesFromGGUF(c.v)
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) ||
				!strings.HasPrefix(err.Error(), "tokenizer: GGUF ") || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line wrapping ErrInvalid with %q", err, c.want)
			}
			if _, err2 := fromGGUF(c.v); err2 == nil || err2.Error() != err.Error() {
				t.Errorf("fromGGUF error %v, want %v", err2, err)
			}
		})
	}
}

// FuzzTokenizerFilesFromGGUF checks that the conversion never panics and that whatever it
// accepts loads.
func FuzzTokenizerFilesFromGGUF(f *testing.F) {
	f.Add("a\nb\nab\n<s>", "a b", uint8(1), false)
	f.Add("<unk>\n<s>\n</s>\n▁\na\n▁a\n  ", "", uint8(0), true)
	f.Add("\n\xff\n<0x41>", "x y\nab", uint8(5), true)
	f.Fuzz(func(t *testing.T, tokens, merges string, typeSeed uint8, spm bool) {
		v := &GGUFVocab{Model: "gpt2", Pre: "gpt-2", Tokens: strings.Split(tokens, "\n"), Merges: []string{},
			BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1, EOM: -1}
		if spm {
			v.Model = "llama"
		}
		for i := range v.Tokens {
			v.Types = append(v.Types, int32((int(typeSeed)+i)%7))
			v.Scores = append(v.Scores, float32(-i))
		}
		if merges != "" {
			v.Merges = strings.Split(merges, "\n")
		}
		tj, cj, err := TokenizerFilesFromGGUF(v)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		tk, err := FromBytes(tj, cj)
		if err != nil {
			t.Fatalf("the converted files do not load: %v", err)
		}
		if _, err := tk.Encode("a ab <s>", true); err != nil {
			t.Fatal(err)
		}
	})
}
