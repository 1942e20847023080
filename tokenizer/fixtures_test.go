package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Hand-written tokenizer.json fixtures in the forms real models ship.

// writeFixture writes tokenizer.json (and tokenizer_config.json unless cfg is "") to a
// temporary directory and loads it.
func writeFixture(t testing.TB, tok, cfg string) *Tokenizer {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tok), 0o644); err != nil {
		t.Fatal(err)
	}
	if cfg != "" {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tk, err := Load(dir)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return tk
}

// spVocab is a SentencePiece-style vocabulary: <unk> <s> </s>, the 256 byte-fallback tokens
// <0x00>..<0xFF> (ids 3..258), then pieces.
func spVocab() string {
	v := `"<unk>": 0, "<s>": 1, "</s>": 2`
	for b := 0; b < 256; b++ {
		v += fmt.Sprintf(`, "<0x%02X>": %d`, b, 3+b)
	}
	return v + `, "▁": 259, "H": 260, "e": 261, "l": 262, "o": 263, "w": 264, "r": 265, "d": 266,
		"▁H": 267, "ll": 268, "▁He": 269, "▁Hell": 270, "▁Hello": 271, "▁w": 272, "or": 273,
		"▁wor": 274, "ld": 275, "▁world": 276, "你": 277`
}

const spAdded = `[
	{"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
	{"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
	{"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}]`

const spBOSTemplate = `{"type": "TemplateProcessing",
	"single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
	"pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
	"special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}`

// llama2Legacy is Llama-2's tokenizer.json as transformers first converted it: a Prepend +
// Replace normalizer, no pre-tokenizer, merges as "a b" strings, a Replace/ByteFallback/
// Fuse/Strip decoder.
func llama2Legacy() string {
	return `{"version": "1.0", "truncation": null, "padding": null,
	"added_tokens": ` + spAdded + `,
	"normalizer": {"type": "Sequence", "normalizers": [
		{"type": "Prepend", "prepend": "▁"},
		{"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
	"pre_tokenizer": null,
	"post_processor": ` + spBOSTemplate + `,
	"decoder": {"type": "Sequence", "decoders": [
		{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
		{"type": "ByteFallback"}, {"type": "Fuse"},
		{"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
	"model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
		"end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
		"vocab": {` + spVocab() + `},
		"merges": ["l l", "▁ H", "▁H e", "▁He ll", "▁Hell o", "▁ w", "o r", "▁w or", "l d", "▁wor ld"]}}`
}

// llama2Metaspace is the same vocabulary in the newer form: a Metaspace pre-tokenizer with
// prepend_scheme "first", a Metaspace decoder, merges as pairs, ignore_merges.
func llama2Metaspace() string {
	return `{"version": "1.0",
	"added_tokens": ` + spAdded + `,
	"normalizer": null,
	"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
	"post_processor": ` + spBOSTemplate + `,
	"decoder": {"type": "Sequence", "decoders": [{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false}, {"type": "ByteFallback"}]},
	"model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
		"vocab": {` + spVocab() + `},
		"merges": [["l", "l"], ["▁", "H"], ["▁H", "e"], ["▁He", "ll"], ["▁Hell", "o"], ["▁", "w"], ["o", "r"], ["▁w", "or"], ["l", "d"], ["▁wor", "ld"]]}}`
}

// qwenStyle is a byte-level BPE in the form of Qwen2 / Llama-3: a Split pre-tokenizer with a
// look-ahead regex followed by ByteLevel without its own regex, merges as pairs, ChatML
// special tokens. Byte b has id b (its byte-level character), merges follow.
func qwenStyle(t testing.TB) string {
	t.Helper()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	merges := [][2]string{
		{"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"},
		{"H", "e"}, {"l", "l"}, {"He", "ll"}, {"Hell", "o"},
		{"ä", "½"}, {"ä½", "ł"}, // 你 = E4 BD A0
	}
	for _, m := range merges {
		vocab[m[0]+m[1]] = len(vocab)
	}
	v, _ := json.Marshal(vocab)
	mg, _ := json.Marshal(merges)
	return `{"version": "1.0",
	"added_tokens": [
		{"id": 267, "content": "<|endoftext|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
		{"id": 268, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
		{"id": 269, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
	"normalizer": {"type": "NFC"},
	"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
		{"type": "Split", "pattern": {"Regex": ` + qwenPatternJSON + `}, "behavior": "Isolated", "invert": false},
		{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
	"post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
	"decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
	"model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
		"end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
		"vocab": ` + string(v) + `, "merges": ` + string(mg) + `}}`
}

// qwenPatternJSON is Qwen2's split expression as a JSON string.
const qwenPatternJSON = `"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"`

// llama3PatternJSON is Llama-3's split expression (numbers in groups of up to three digits).
const llama3PatternJSON = `"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"`

// configJSON marshals a tokenizer_config.json.
func configFixture(t testing.TB, cfg map[string]any) string {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
