package tokenizer

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	sugar "github.com/sugarme/tokenizer"
	"github.com/sugarme/tokenizer/model/bpe"
)

// The test tokenizer in testdata/ is trained here with sugarme's BPE trainer:
//
//	go test ./tokenizer/ -run TestGenerateTestTokenizer -update
//
// regenerates testdata/tokenizer.json and testdata/tokenizer_config.json from
// testdata/corpus.txt. (The trainer breaks ties between equally frequent pairs in map order,
// so a regenerated file may differ slightly from the committed one.)
var update = flag.Bool("update", false, "regenerate testdata/tokenizer.json from testdata/corpus.txt")

const (
	testVocabSize = 512 // ids 0..511: 3 special tokens, 256 byte tokens, 253 merges
	testTemplate  = "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n" +
		"{{ message['content'] }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

var testSpecials = []string{"<unk>", "<s>", "</s>"}

func TestGenerateTestTokenizer(t *testing.T) {
	if !*update {
		t.Skip("run with -update to regenerate testdata/tokenizer.json")
	}
	corpus, err := os.ReadFile(filepath.Join("testdata", "corpus.txt"))
	if err != nil {
		t.Fatal(err)
	}
	tokJSON, cfgJSON, err := trainTestTokenizer(string(corpus))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("testdata", "tokenizer.json"), tokJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("testdata", "tokenizer_config.json"), cfgJSON, 0o644); err != nil {
		t.Fatal(err)
	}
}

// trainTestTokenizer trains a byte-level BPE on corpus and returns tokenizer.json and
// tokenizer_config.json.
func trainTestTokenizer(corpus string) (tokJSON, cfgJSON []byte, err error) {
	// Count words exactly as Encode will split them: GPT-2 regex, then the byte-level alphabet.
	pre, _, err := buildPreTokenizer(json.RawMessage(`{"type":"ByteLevel","add_prefix_space":false,"use_regex":true}`))
	if err != nil {
		return nil, nil, err
	}
	words, err := pre([]string{corpus}, true)
	if err != nil {
		return nil, nil, err
	}
	counts := map[string]int{}
	for _, w := range words {
		counts[w]++
	}
	alphabet := bpe.CharSet{}
	for b := 0; b < 256; b++ {
		alphabet[string(byteToRune[b])] = struct{}{}
	}
	builder := bpe.NewBPETrainerBuilder()
	builder.VocabSize(testVocabSize - len(testSpecials))
	builder.MinFrequency(2)
	builder.InitialAlphabet(alphabet)
	builder.ShowProgress(false)
	builder.SpecialTokens([]sugar.AddedToken{})
	model, _ := builder.Build().Train(counts)
	var trained *bpe.BPE
	switch m := model.(type) {
	case *bpe.BPE:
		trained = m
	case bpe.BPE:
		trained = &m
	default:
		return nil, nil, fmt.Errorf("trainer returned %T", model)
	}

	// Re-number: special tokens first, then the trained vocabulary in its own id order.
	trainedVocab := trained.GetVocab()
	byID := make([]string, 0, len(trainedVocab))
	for tok := range trainedVocab {
		byID = append(byID, tok)
	}
	sort.Slice(byID, func(i, j int) bool { return trainedVocab[byID[i]] < trainedVocab[byID[j]] })
	vocab := map[string]int{}
	for i, s := range testSpecials {
		vocab[s] = i
	}
	for _, tok := range byID {
		vocab[tok] = len(vocab)
	}
	if len(vocab) != testVocabSize {
		return nil, nil, fmt.Errorf("trained vocabulary has %d tokens, want %d", len(vocab), testVocabSize)
	}
	type rankedMerge struct {
		rank int
		a, b string
	}
	var ranked []rankedMerge
	for pair, val := range *trained.Merges {
		a, _ := trained.IdToToken(pair.C1)
		b, _ := trained.IdToToken(pair.C2)
		ranked = append(ranked, rankedMerge{val.Rank, a, b})
	}
	sort.Slice(ranked, func(i, j int) bool { return ranked[i].rank < ranked[j].rank })
	merges := make([]string, len(ranked))
	for i, m := range ranked {
		merges[i] = m.a + " " + m.b
	}

	var added []map[string]any
	for i, s := range testSpecials {
		added = append(added, map[string]any{
			"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
			"normalized": false, "special": true,
		})
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	file := map[string]any{
		"version":       "1.0",
		"truncation":    nil,
		"padding":       nil,
		"added_tokens":  added,
		"normalizer":    nil,
		"pre_tokenizer": byteLevel,
		"post_processor": map[string]any{
			"type": "TemplateProcessing",
			"single": []any{
				map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
			},
			"pair": []any{
				map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "B", "type_id": 1}},
			},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}}},
		},
		"decoder": byteLevel,
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": merges,
		},
	}
	if tokJSON, err = marshalIndent(file); err != nil {
		return nil, nil, err
	}
	cfg := map[string]any{
		"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
		"add_bos_token": true, "add_eos_token": false,
		"model_max_length": 2048, "tokenizer_class": "PreTrainedTokenizerFast",
		"chat_template": testTemplate,
	}
	if cfgJSON, err = marshalIndent(cfg); err != nil {
		return nil, nil, err
	}
	return tokJSON, cfgJSON, nil
}

// marshalIndent writes v as indented JSON without escaping <, > and &.
func marshalIndent(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	err := enc.Encode(v)
	return buf.Bytes(), err
}
