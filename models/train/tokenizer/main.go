// Command tokenizer trains the default model's byte-level BPE tokenizer with github.com/sugarme/tokenizer's BPE
// trainer, writes it as a Hugging Face tokenizer.json (+ tokenizer_config.json), reloads it with sugarme to check
// that the saved file round-trips, and pre-tokenizes the corpus into little-endian uint16 token-id files
// (train.bin, val.bin) so that the PyTorch training script needs no tokenizer library.
//
// Every document (one line of train.txt / val.txt) is stored as <s> tokens... </s>.
//
// Usage (from the repository root, after models/train/corpus.sh):
//
//	go run ./models/train/tokenizer -corpus models/train/.corpus -out models/default             # train + encode
//	go run ./models/train/tokenizer -corpus models/train/.corpus -out models/default -train=false # encode only
//
// Retraining gives a slightly different vocabulary each run (the trainer breaks count ties in map order), so the
// shipped model is reproduced from its committed tokenizer.json with -train=false.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/sugarme/tokenizer"
	"github.com/sugarme/tokenizer/model/bpe"
	"github.com/sugarme/tokenizer/normalizer"
	"github.com/sugarme/tokenizer/pretokenizer"
	"github.com/sugarme/tokenizer/pretrained"
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
	tokPath := filepath.Join(outDir, "tokenizer.json")
	if train {
		if err := trainTokenizer(corpusDir, outDir, vocabSize, minFreq); err != nil {
			return err
		}
	}
	if err := writeJSON(filepath.Join(outDir, "tokenizer_config.json"), tokenizerConfig()); err != nil {
		return err
	}
	return encodeCorpus(tokPath, corpusDir, vocabSize)
}

// trainTokenizer trains the BPE model on corpusDir/train.txt and writes tokenizer.json.
func trainTokenizer(corpusDir, outDir string, vocabSize, minFreq int) error {
	trainTxt := filepath.Join(corpusDir, "train.txt")
	counts, err := countWords(trainTxt)
	if err != nil {
		return err
	}
	log.Printf("%d distinct pre-tokenized words", len(counts))
	counts = mostFrequent(counts, maxTrainerWords)

	bl := pretokenizer.NewByteLevel()
	bl.SetAddPrefixSpace(false)
	builder := bpe.NewBPETrainerBuilder()
	builder.VocabSize(vocabSize - len(specials))
	builder.MinFrequency(minFreq)
	builder.ShowProgress(false)
	builder.InitialAlphabet(bl.Alphabet())
	trainer := builder.Build()
	m, _ := trainer.Train(counts)
	model, ok := m.(bpe.BPE)
	if !ok {
		return fmt.Errorf("trainer returned %T, want bpe.BPE", m)
	}

	vocab, merges, err := remap(model)
	if err != nil {
		return err
	}
	log.Printf("vocabulary %d tokens, %d merges", len(vocab), len(merges))
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	return writeJSON(filepath.Join(outDir, "tokenizer.json"), hfTokenizer(vocab, merges))
}

// encodeCorpus reloads tokPath with sugarme (checking that the saved file round-trips) and writes train.bin and
// val.bin next to train.txt and val.txt.
func encodeCorpus(tokPath, corpusDir string, vocabSize int) error {
	tk, err := pretrained.FromFile(tokPath)
	if err != nil {
		return fmt.Errorf("reload %s: %w", tokPath, err)
	}
	if got := tk.GetVocabSize(true); got != vocabSize {
		return fmt.Errorf("reloaded tokenizer has %d tokens, want %d", got, vocabSize)
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

// maxTrainerWords bounds the number of distinct words handed to sugarme's BPE trainer. From 10,000 words on, the
// trainer (v0.3.0) counts pairs in 4 goroutines and keeps only one goroutine's word positions per pair, so most
// merges are then never applied (for instance " t"+"he" is learnt but not "Ġ"+"the"). Below that it uses a single
// goroutine and is correct. The most frequent words cover nearly all of the corpus; rarer words are still encoded
// by the merges learnt from them.
const maxTrainerWords = 9999

// mostFrequent keeps the n most frequent words (ties broken by the word, so the choice is deterministic).
func mostFrequent(counts map[string]int, n int) map[string]int {
	if len(counts) <= n {
		return counts
	}
	words := make([]string, 0, len(counts))
	for w := range counts {
		words = append(words, w)
	}
	sort.Slice(words, func(i, j int) bool {
		if counts[words[i]] != counts[words[j]] {
			return counts[words[i]] > counts[words[j]]
		}
		return words[i] < words[j]
	})
	kept := make(map[string]int, n)
	covered, total := 0, 0
	for i, w := range words {
		total += counts[w]
		if i < n {
			kept[w] = counts[w]
			covered += counts[w]
		}
	}
	log.Printf("training on the %d most frequent words (%.1f%% of word occurrences)", n, 100*float64(covered)/float64(total))
	return kept
}

// preTokenize splits a line the way the tokenizer's ByteLevel pre-tokenizer does.
func preTokenize(bl *pretokenizer.ByteLevel, line string) ([]string, error) {
	pt, err := bl.PreTokenize(tokenizer.NewPreTokenizedString(line))
	if err != nil {
		return nil, err
	}
	splits := pt.GetSplits(normalizer.OriginalTarget, tokenizer.Byte)
	words := make([]string, len(splits))
	for i, s := range splits {
		words[i] = s.Value
	}
	return words, nil
}

// countWords counts the byte-level pre-tokenized words of a text file, one document per line.
func countWords(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	bl := pretokenizer.NewByteLevel()
	bl.SetAddPrefixSpace(false)
	counts := make(map[string]int)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		words, err := preTokenize(bl, sc.Text())
		if err != nil {
			return nil, err
		}
		for _, w := range words {
			counts[w]++
		}
	}
	return counts, sc.Err()
}

// remap puts the special tokens at ids 0.. and shifts the trained tokens after them (keeping their order), and
// lists the merges in rank order.
func remap(model bpe.BPE) (map[string]int, [][2]string, error) {
	old := *model.Vocab
	byID := make([]string, 0, len(old))
	for w := range old {
		byID = append(byID, w)
	}
	sort.Slice(byID, func(i, j int) bool { return old[byID[i]] < old[byID[j]] })
	oldWord := make(map[int]string, len(old))
	for w, id := range old {
		oldWord[id] = w
	}
	vocab := make(map[string]int, len(old)+len(specials))
	for i, s := range specials {
		vocab[s] = i
	}
	for _, w := range byID {
		if _, dup := vocab[w]; dup {
			return nil, nil, fmt.Errorf("trained token %q collides with a special token", w)
		}
		vocab[w] = len(vocab)
	}
	type rankedMerge struct {
		rank int
		a, b string
	}
	var ms []rankedMerge
	for p, v := range *model.Merges {
		a, okA := oldWord[p.C1]
		b, okB := oldWord[p.C2]
		if !okA || !okB {
			return nil, nil, fmt.Errorf("merge %v refers to unknown ids", p)
		}
		if _, ok := vocab[a+b]; !ok {
			return nil, nil, fmt.Errorf("merge %q+%q: result not in the vocabulary", a, b)
		}
		ms = append(ms, rankedMerge{v.Rank, a, b})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].rank < ms[j].rank })
	merges := make([][2]string, len(ms))
	for i, m := range ms {
		merges[i] = [2]string{m.a, m.b}
	}
	return vocab, merges, nil
}

type addedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type byteLevel struct {
	Type           string `json:"type"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	TrimOffsets    bool   `json:"trim_offsets"`
	UseRegex       bool   `json:"use_regex"`
}

type templatePiece map[string]map[string]any

// hfTokenizer is the Hugging Face tokenizer.json document: a byte-level BPE (GPT-2 style pre-tokenizer and
// decoder) whose post-processor prepends <s> to single sequences.
func hfTokenizer(vocab map[string]int, merges [][2]string) map[string]any {
	added := make([]addedToken, len(specials))
	for i, s := range specials {
		added[i] = addedToken{ID: i, Content: s, Special: true}
	}
	bos := specials[bosID]
	return map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   added,
		"normalizer":     nil,
		"pre_tokenizer":  byteLevel{Type: "ByteLevel", AddPrefixSpace: false, TrimOffsets: true, UseRegex: true},
		"post_processor": templateProcessing(bos),
		"decoder":        byteLevel{Type: "ByteLevel", AddPrefixSpace: true, TrimOffsets: true, UseRegex: true},
		"model": map[string]any{
			"type":                      "BPE",
			"dropout":                   nil,
			"unk_token":                 nil,
			"continuing_subword_prefix": nil,
			"end_of_word_suffix":        nil,
			"fuse_unk":                  false,
			"byte_fallback":             false,
			"ignore_merges":             false,
			"vocab":                     vocab,
			"merges":                    mergeStrings(merges),
		},
	}
}

// mergeStrings writes merges in the "a b" form every tokenizers version reads (byte-level tokens hold no spaces).
func mergeStrings(merges [][2]string) []string {
	out := make([]string, len(merges))
	for i, m := range merges {
		out[i] = m[0] + " " + m[1]
	}
	return out
}

func templateProcessing(bos string) map[string]any {
	special := func(id string) templatePiece {
		return templatePiece{"SpecialToken": {"id": id, "type_id": 0}}
	}
	seq := func(id string, typeID int) templatePiece {
		return templatePiece{"Sequence": {"id": id, "type_id": typeID}}
	}
	return map[string]any{
		"type":   "TemplateProcessing",
		"single": []templatePiece{special(bos), seq("A", 0)},
		"pair":   []templatePiece{special(bos), seq("A", 0), special(bos), seq("B", 1)},
		"special_tokens": map[string]any{
			bos: map[string]any{"id": bos, "ids": []int{bosID}, "tokens": []string{bos}},
		},
	}
}

// tokenizerConfig is tokenizer_config.json: special tokens, bos handling and the chat template.
func tokenizerConfig() map[string]any {
	type decoderEntry struct { // transformers builds AddedToken(**entry): no id field
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	}
	decoder := make(map[string]decoderEntry, len(specials))
	for i, s := range specials {
		decoder[fmt.Sprint(i)] = decoderEntry{Content: s, Special: true}
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
	data, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
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
		enc, err := tk.EncodeSingle(line, false)
		if err != nil {
			return 0, fmt.Errorf("%s line %d: %w", src, lines+1, err)
		}
		ids := append(append([]int{bosID}, enc.Ids...), eosID)
		buf = buf[:0]
		for _, id := range ids {
			if id < 0 || id >= vocabSize {
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
		if check && strings.TrimSpace(tk.Decode(enc.Ids, true)) != line {
			mismatches++
			if mismatches <= 3 {
				log.Printf("round trip differs:\n  in:  %q\n  out: %q", line, tk.Decode(enc.Ids, true))
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
