// Command tokenizer trains the default model's byte-level BPE tokenizer (tokenizer.TrainByteLevelBPE, which runs
// github.com/sugarme/tokenizer's BPE trainer), writes it as a Hugging Face tokenizer.json (+ tokenizer_config.json),
// reloads it with Conveyor's tokenizer package to check that every validation line round-trips, and pre-tokenizes
// the corpus into little-endian uint16 token-id files
// (train.bin, val.bin) so that the PyTorch training script needs no tokenizer library.
//
// Every document (one line of train.txt / val.txt) is stored as <s> tokens... </s>.
//
// Usage (from the repository root, after models/train/corpus.sh):
//
//	go run ./cmd/train-tokenizer -corpus models/train/.corpus -out models/default             # train + encode
//	go run ./cmd/train-tokenizer -corpus models/train/.corpus -out models/default -train=false # encode only
//
// Retraining gives a slightly different vocabulary each run (the trainer breaks count ties in map order), so the
// shipped model is reproduced from its committed tokenizer.json with -train=false.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/conveyor-llm/conveyor/tokenizer"
)

// specials are the special tokens, in id order. Id 0 doubles as padding.
var specials = []string{"<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"}

const (
	bosID = 1
	eosID = 2
)

// chatTemplate renders messages as "<|role|>\ncontent</s>\n" turns after the bos token, ending with
// "<|assistant|>\n" when a generation prompt is requested. The text already holds the bos token, so it is
// tokenized without adding special tokens (as transformers' apply_chat_template does).
const chatTemplate = "{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"

func main() {
	corpusDir := flag.String("corpus", "models/train/.corpus", "directory holding train.txt and val.txt; train.bin and val.bin are written here")
	outDir := flag.String("out", "models/default", "directory to write tokenizer.json and tokenizer_config.json to")
	vocabSize := flag.Int("vocab", 4096, "total vocabulary size including special tokens")
	minFreq := flag.Int("min-frequency", 2, "minimum pair frequency for a merge")
	train := flag.Bool("train", true, "train a new tokenizer; with -train=false, encode the corpus with the existing "+
		"tokenizer.json in -out (sugarme's trainer breaks ties between equally frequent pairs in map order, so "+
		"retraining gives a slightly different vocabulary each time: reproduce a model from its committed tokenizer)")
	flag.Parse()
	if err := run(*corpusDir, *outDir, *vocabSize, *minFreq, *train); err != nil {
		log.Fatal(err)
	}
}

func run(corpusDir, outDir string, vocabSize, minFreq int, train bool) error {
	if vocabSize <= len(specials)+256 || vocabSize > 65535 {
		return fmt.Errorf("vocab %d: must be in (%d, 65535]", vocabSize, len(specials)+256)
	}
	if train {
		if err := trainTokenizer(corpusDir, outDir, vocabSize, minFreq); err != nil {
			return err
		}
	}
	if err := writeJSON(filepath.Join(outDir, "tokenizer_config.json"), tokenizerConfig()); err != nil {
		return err
	}
	return encodeCorpus(outDir, corpusDir, vocabSize)
}

// trainTokenizer trains the BPE model on corpusDir/train.txt and writes tokenizer.json.
func trainTokenizer(corpusDir, outDir string, vocabSize, minFreq int) error {
	f, err := os.Open(filepath.Join(corpusDir, "train.txt"))
	if err != nil {
		return err
	}
	defer f.Close()
	wc := tokenizer.NewWordCounter()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if err := wc.Add(sc.Text()); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	log.Printf("%d distinct pre-tokenized words", len(wc.Counts))
	data, coverage, err := tokenizer.TrainByteLevelBPE(wc.Counts, tokenizer.TrainConfig{
		VocabSize: vocabSize, MinFrequency: minFreq, Specials: specials, BOS: specials[bosID],
	})
	if err != nil {
		return err
	}
	log.Printf("the trainer saw the most frequent words, %.1f%% of word occurrences", 100*coverage)
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(outDir, "tokenizer.json"), data, 0o644)
}

// encodeCorpus loads the tokenizer in outDir and writes train.bin and val.bin next to
// train.txt and val.txt.
func encodeCorpus(outDir, corpusDir string, vocabSize int) error {
	tk, err := tokenizer.Load(outDir)
	if err != nil {
		return err
	}
	if got := tk.VocabSize(); got != vocabSize {
		return fmt.Errorf("the tokenizer has %d tokens, want %d", got, vocabSize)
	}
	for _, name := range []string{"val", "train"} {
		n, err := encodeFile(tk, filepath.Join(corpusDir, name+".txt"), filepath.Join(corpusDir, name+".bin"), vocabSize, name == "val")
		if err != nil {
			return err
		}
		log.Printf("%s: %d tokens", name, n)
	}
	return nil
}

// tokenizerConfig is tokenizer_config.json: special tokens, bos handling and the chat template.
func tokenizerConfig() map[string]any {
	// transformers builds AddedToken(**entry) from these entries: no id field.
	decoder := make(map[string]tokenizer.AddedToken, len(specials))
	for i, s := range specials {
		decoder[fmt.Sprint(i)] = tokenizer.AddedToken{Content: s, Special: true}
	}
	return map[string]any{
		"tokenizer_class":              "PreTrainedTokenizerFast",
		"bos_token":                    specials[bosID],
		"eos_token":                    specials[eosID],
		"unk_token":                    specials[0],
		"pad_token":                    specials[0],
		"add_bos_token":                true,
		"add_eos_token":                false,
		"clean_up_tokenization_spaces": false,
		"model_max_length":             512,
		"additional_special_tokens":    specials[3:],
		"added_tokens_decoder":         decoder,
		"chat_template":                chatTemplate,
	}
}

func writeJSON(path string, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // "<s>", not "\u003cs\u003e"
	enc.SetIndent("", " ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// encodeFile tokenizes each line of src as <s> ... </s> and appends the ids to dst as uint16 little-endian.
// With check set it also verifies that decoding gives the line back.
func encodeFile(tk *tokenizer.Tokenizer, src, dst string, vocabSize int, check bool) (int, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	w := bufio.NewWriterSize(out, 1<<20)
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	total, mismatches, lines := 0, 0, 0
	buf := make([]byte, 0, 4096)
	for sc.Scan() {
		line := sc.Text()
		enc, err := tk.Encode(line, false)
		if err != nil {
			return 0, fmt.Errorf("%s line %d: %w", src, lines+1, err)
		}
		ids := append(append([]int32{bosID}, enc...), eosID)
		buf = buf[:0]
		for _, id := range ids {
			if id < 0 || int(id) >= vocabSize {
				return 0, fmt.Errorf("%s line %d: token id %d out of range", src, lines+1, id)
			}
			if id <= eosID && id != ids[0] && id != ids[len(ids)-1] {
				return 0, fmt.Errorf("%s line %d: special id %d inside text", src, lines+1, id)
			}
			buf = binary.LittleEndian.AppendUint16(buf, uint16(id))
		}
		if _, err := w.Write(buf); err != nil {
			return 0, err
		}
		if check && strings.TrimSpace(tk.Decode(enc, true)) != line {
			mismatches++
			if mismatches <= 3 {
				log.Printf("round trip differs:\n  in:  %q\n  out: %q", line, tk.Decode(enc, true))
			}
		}
		total += len(ids)
		lines++
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if err := w.Flush(); err != nil {
		return 0, err
	}
	if err := out.Close(); err != nil {
		return 0, err
	}
	if mismatches > 0 {
		return 0, fmt.Errorf("%d of %d lines of %s do not decode to themselves", mismatches, lines, src)
	}
	return total, nil
}
