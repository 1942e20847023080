package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The test tokenizer in testdata/ is trained here with sugarme's BPE trainer:
//
//	go test -tags conveyorgen ./tokenizer/ -run TestGenerateTestTokenizer
//
// (gen_update_test.go) regenerates testdata/tokenizer.json and testdata/tokenizer_config.json from
// testdata/corpus.txt. (The trainer breaks ties between equally frequent pairs in map order,
// so a regenerated file may differ slightly from the committed one.)
const (
	testVocabSize = 512 // ids 0..511: 3 special tokens, 256 byte tokens, 253 merges
	testTemplate  = "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n" +
		"{{ message['content'] }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

var testSpecials = []string{"<unk>", "<s>", "</s>"}

// trainTestTokenizer trains a byte-level BPE on corpus and returns tokenizer.json and
// tokenizer_config.json.
func trainTestTokenizer(corpus string) (tokJSON, cfgJSON []byte, err error) {
	wc := NewWordCounter()
	if err := wc.Add(corpus); err != nil {
		return nil, nil, err
	}
	tokJSON, _, err = TrainByteLevelBPE(wc.Counts, TrainConfig{
		VocabSize: testVocabSize, MinFrequency: 2, Specials: testSpecials, BOS: "<s>",
	})
	if err != nil {
		return nil, nil, err
	}
	var doc struct {
		Model struct {
			Vocab map[string]int `json:"vocab"`
		} `json:"model"`
	}
	if err := json.Unmarshal(tokJSON, &doc); err != nil {
		return nil, nil, err
	}
	if len(doc.Model.Vocab) != testVocabSize {
		return nil, nil, fmt.Errorf("trained vocabulary has %d tokens, want %d", len(doc.Model.Vocab), testVocabSize)
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
