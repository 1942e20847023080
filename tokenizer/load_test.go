package tokenizer

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const okModel = `"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}`

func TestMalformedTokenizerJSON(t *testing.T) {
	cases := map[string]struct {
		json string
		want string // part of the error message
	}{
		"empty":             {``, "unexpected end"},
		"truncated":         {`{"model": {"type": "BPE", "vocab": {`, "unexpected end"},
		"not an object":     {`[1, 2]`, "cannot unmarshal"},
		"null":              {`null`, "no \"model\""},
		"no model":          {`{"added_tokens": []}`, "no \"model\""},
		"unigram":           {`{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}`, "unsupported type \"Unigram\""},
		"vocab not ints":    {`{"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}}`, "cannot unmarshal"},
		"empty vocab":       {`{"model": {"type": "BPE", "vocab": {}, "merges": []}}`, "empty or missing vocab"},
		"negative id":       {`{"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}}`, "negative id"},
		"merge one token":   {`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}}`, "merge 0"},
		"merge three":       {`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a a a"]}}`, "merge 0"},
		"merge short pair":  {`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a"]]}}`, "merge 0"},
		"merge number":      {`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}}`, "merge 0"},
		"merge unknown":     {`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}}`, "missing from the vocab"},
		"unk not in vocab":  {`{"model": {"type": "BPE", "unk_token": "<unk>", "vocab": {"a": 0}, "merges": []}}`, "unk_token"},
		"huge id":           {`{"model": {"type": "BPE", "vocab": {"a": 99999999999}, "merges": []}}`, "too large"},
		"max int id":        {`{"model": {"type": "BPE", "vocab": {"a": 9223372036854775807}, "merges": []}}`, "too large"},
		"huge added id":     {`{"added_tokens": [{"id": 9223372036854775807, "content": "<x>"}], ` + okModel + `}`, "too large id"},
		"post id":           {`{"post_processor": {"type": "BertProcessing", "cls": ["<s>", 77], "sep": ["</s>", 1]}, ` + okModel + `}`, "id 77 is not in the vocabulary"},
		"template ids":      {`{"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}], "special_tokens": {"<s>": {"ids": [-3]}}}, ` + okModel + `}`, "id -3"},
		"added without id":  {`{"added_tokens": [{"content": "<x>"}], ` + okModel + `}`, "missing, negative or too large id"},
		"added empty":       {`{"added_tokens": [{"id": 5, "content": ""}], ` + okModel + `}`, "empty content"},
		"normalizer type":   {`{"normalizer": {"type": "Nmt"}, ` + okModel + `}`, "unsupported type \"Nmt\""},
		"normalizer shape":  {`{"normalizer": {"type": "Replace", "pattern": 5}, ` + okModel + `}`, "normalizer Replace"},
		"precompiled":       {`{"normalizer": {"type": "Precompiled", "precompiled_charsmap": "!!"}, ` + okModel + `}`, "normalizer"},
		"bad regex":         {`{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated"}, ` + okModel + `}`, "regex"},
		"bad behavior":      {`{"pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways"}, ` + okModel + `}`, "Sideways"},
		"no pattern":        {`{"pre_tokenizer": {"type": "Split", "behavior": "Isolated"}, ` + okModel + `}`, "neither String nor Regex"},
		"pretok type":       {`{"pre_tokenizer": {"type": "Nope"}, ` + okModel + `}`, "unsupported type \"Nope\""},
		"pretok not object": {`{"pre_tokenizer": "ByteLevel", ` + okModel + `}`, "pre_tokenizer"},
		"prepend scheme":    {`{"pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "sometimes"}, ` + okModel + `}`, "prepend_scheme"},
		"decoder type":      {`{"decoder": {"type": "CTC"}, ` + okModel + `}`, "unsupported type \"CTC\""},
		"decoder strip":     {`{"decoder": {"type": "Strip", "content": "x", "start": 1}, ` + okModel + `}`, "Strip"},
		"template special":  {`{"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}]}, ` + okModel + `}`, "\"<s>\" is unknown"},
		"roberta shape":     {`{"post_processor": {"type": "RobertaProcessing", "cls": ["<s>"]}, ` + okModel + `}`, "cls"},
		"post type":         {`{"post_processor": {"type": "Nope"}, ` + okModel + `}`, "unsupported type \"Nope\""},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := FromBytes([]byte(c.json), nil)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "tokenizer.json") {
				t.Errorf("err = %q, want it to name tokenizer.json and contain %q", err, c.want)
			}
		})
	}
}

func TestMalformedTokenizerConfig(t *testing.T) {
	tok := `{"added_tokens": [{"id": 3, "content": "<s>", "special": true}], "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}`
	for name, cfg := range map[string]string{
		"truncated":       `{"bos_token": `,
		"bos number":      `{"bos_token": 5}`,
		"bos object":      `{"bos_token": {"text": "<s>"}}`,
		"eos unknown":     `{"eos_token": "</s>"}`,
		"add bos no bos":  `{"add_bos_token": true}`,
		"template number": `{"chat_template": 5}`,
		"add_bos string":  `{"add_bos_token": "yes"}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := FromBytes([]byte(tok), []byte(cfg))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "tokenizer_config.json") {
				t.Errorf("err = %v, want ErrInvalid naming tokenizer_config.json", err)
			}
		})
	}
	if _, err := FromBytes([]byte(tok), []byte(`{"bos_token": "<s>", "add_bos_token": true}`)); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

func TestLoadMissingFiles(t *testing.T) {
	if _, err := Load(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(empty dir) = %v, want fs.ErrNotExist", err)
	}
	// tokenizer_config.json is optional.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{`+okModel+`}`), 0o644); err != nil {
		t.Fatal(err)
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ids, _ := tk.Encode("ab", true); len(ids) != 1 || ids[0] != 2 {
		t.Errorf("Encode(ab) = %v, want [2]", ids)
	}
	if _, ok := tk.BOS(); ok || len(tk.EOS()) != 0 {
		t.Errorf("BOS/EOS set without a config")
	}
}

// FuzzLoad feeds arbitrary tokenizer.json bytes: loading fails cleanly or gives a tokenizer
// that encodes and decodes without panicking.
func FuzzLoad(f *testing.F) {
	seeds := []string{`{` + okModel + `}`, llama2Legacy(), llama2Metaspace(), qwenStyle(f)}
	if b, err := os.ReadFile(filepath.Join("testdata", "tokenizer.json")); err == nil {
		seeds = append(seeds, string(b))
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := FromBytes(data, nil)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		ids, err := tk.Encode("Hello  wörld 你好 😀 <s>\n", true)
		if err != nil {
			return
		}
		_ = tk.Decode(ids, false)
		s := tk.NewStream(true)
		for _, id := range ids {
			s.Add(id)
		}
		s.Flush()
	})
}
