package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"

	sugar "github.com/sugarme/tokenizer"
	"github.com/sugarme/tokenizer/model/bpe"
)

// TrainConfig configures TrainByteLevelBPE.
type TrainConfig struct {
	// VocabSize is the whole vocabulary, special tokens included.
	VocabSize int
	// MinFrequency is the least count of a pair for a merge.
	MinFrequency int
	// Specials are the special tokens; they get ids 0, 1, ... in this order.
	Specials []string
	// BOS, when not empty, is the special token the post-processor puts before every
	// single sequence (and before each of a pair).
	BOS string
}

// WordCounter counts the words of a training text as a byte-level BPE tokenizer
// splits them: GPT-2's split expression, no prefix space, each byte mapped to its
// byte-level character (Encode splits text the same way).
type WordCounter struct {
	pre    preTokenizer
	Counts map[string]int
}

// byteLevelSplit is the pre-tokenizer TrainByteLevelBPE's tokenizer.json declares.
const byteLevelSplit = `{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}`

// NewWordCounter returns an empty counter.
func NewWordCounter() *WordCounter {
	return &WordCounter{Counts: make(map[string]int)}
}

// Add counts the words of a piece of text (a line, or a whole corpus).
func (c *WordCounter) Add(text string) error {
	if c.pre == nil {
		pre, _, err := buildPreTokenizer(json.RawMessage(byteLevelSplit))
		if err != nil {
			return err
		}
		c.pre = pre
	}
	words, err := c.pre([]string{text}, true)
	if err != nil {
		return err
	}
	for _, w := range words {
		c.Counts[w]++
	}
	return nil
}

// maxTrainerWords bounds the distinct words handed to sugarme's BPE trainer. From 10,000
// words on, the trainer (v0.3.0) counts pairs in 4 goroutines and keeps only one
// goroutine's word positions per pair, so most merges are then never applied (for
// instance " t"+"he" is learnt but not "Ġ"+"the"). Below that it uses one goroutine and
// is correct. The most frequent words cover nearly all of a corpus; rarer words are
// still encoded by the merges learnt from the others.
const maxTrainerWords = 9999

// TrainByteLevelBPE trains a byte-level BPE model on word counts (from WordCounter) with
// github.com/sugarme/tokenizer's trainer and returns it as a Hugging Face tokenizer.json
// document: ByteLevel pre-tokenizer and decoder, the special tokens as added tokens at
// ids 0.., and a post-processor that prepends cfg.BOS. It also returns the share of word
// occurrences the trainer saw (see maxTrainerWords).
//
// The trainer breaks ties between equally frequent pairs in map order, so two runs may
// differ slightly; keep the file a model was trained with.
func TrainByteLevelBPE(counts map[string]int, cfg TrainConfig) (tokenizerJSON []byte, coverage float64, err error) {
	if cfg.VocabSize <= len(cfg.Specials)+256 {
		return nil, 0, fmt.Errorf("tokenizer: vocabulary %d must exceed the %d special tokens plus 256 bytes", cfg.VocabSize, len(cfg.Specials))
	}
	kept, coverage := mostFrequent(counts, maxTrainerWords)
	alphabet := bpe.CharSet{}
	for _, r := range byteToRune {
		alphabet[string(r)] = struct{}{}
	}
	builder := bpe.NewBPETrainerBuilder()
	builder.VocabSize(cfg.VocabSize - len(cfg.Specials))
	builder.MinFrequency(cfg.MinFrequency)
	builder.ShowProgress(false)
	builder.InitialAlphabet(alphabet)
	builder.SpecialTokens([]sugar.AddedToken{})
	var model bpe.BPE
	switch m, _ := builder.Build().Train(kept); m := m.(type) {
	case bpe.BPE:
		model = m
	case *bpe.BPE:
		model = *m
	default:
		return nil, 0, fmt.Errorf("tokenizer: trainer returned %T, want a BPE model", m)
	}
	vocab, merges, err := remapTrained(model, cfg.Specials)
	if err != nil {
		return nil, 0, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // "<s>" as the tokenizers library writes it, not "\u003cs\u003e"
	enc.SetIndent("", " ")
	if err := enc.Encode(byteLevelDocument(vocab, merges, cfg)); err != nil {
		return nil, 0, err
	}
	return buf.Bytes(), coverage, nil
}

// mostFrequent keeps the n most frequent words (ties broken by the word, so the choice is
// deterministic) and returns the share of occurrences they cover.
func mostFrequent(counts map[string]int, n int) (map[string]int, float64) {
	if len(counts) <= n {
		return counts, 1
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
	return kept, float64(covered) / float64(total)
}

// remapTrained puts the special tokens at ids 0.. and the trained tokens after them
// (keeping their order), and lists the merges in rank order.
func remapTrained(model bpe.BPE, specials []string) (map[string]int, [][2]string, error) {
	old := *model.Vocab
	byID := make([]string, 0, len(old))
	oldWord := make(map[int]string, len(old))
	for w, id := range old {
		byID = append(byID, w)
		oldWord[id] = w
	}
	sort.Slice(byID, func(i, j int) bool { return old[byID[i]] < old[byID[j]] })
	vocab := make(map[string]int, len(old)+len(specials))
	for i, s := range specials {
		vocab[s] = i
	}
	for _, w := range byID {
		if _, dup := vocab[w]; dup {
			return nil, nil, fmt.Errorf("tokenizer: trained token %q collides with a special token", w)
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
			return nil, nil, fmt.Errorf("tokenizer: merge %v refers to unknown ids", p)
		}
		if _, ok := vocab[a+b]; !ok {
			return nil, nil, fmt.Errorf("tokenizer: merge %q+%q: result not in the vocabulary", a, b)
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

// AddedToken is an added (special) token as Hugging Face files write it: an entry of
// tokenizer_config.json's added_tokens_decoder, or with its id an entry of
// tokenizer.json's added_tokens.
type AddedToken struct {
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type trainedAddedToken struct {
	ID int `json:"id"`
	AddedToken
}

type byteLevelJSON struct {
	Type           string `json:"type"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	TrimOffsets    bool   `json:"trim_offsets"`
	UseRegex       bool   `json:"use_regex"`
}

type templatePiece map[string]map[string]any

// byteLevelDocument is the tokenizer.json document of a byte-level BPE (GPT-2 style
// pre-tokenizer and decoder). Merges are written in the "a b" form every tokenizers
// version reads (byte-level tokens hold no spaces).
func byteLevelDocument(vocab map[string]int, merges [][2]string, cfg TrainConfig) map[string]any {
	added := make([]trainedAddedToken, len(cfg.Specials))
	for i, s := range cfg.Specials {
		added[i] = trainedAddedToken{ID: i, AddedToken: AddedToken{Content: s, Special: true}}
	}
	mergeStrings := make([]string, len(merges))
	for i, m := range merges {
		mergeStrings[i] = m[0] + " " + m[1]
	}
	var post any
	if cfg.BOS != "" {
		post = bosProcessor(cfg.BOS, vocab[cfg.BOS])
	}
	return map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   added,
		"normalizer":     nil,
		"pre_tokenizer":  json.RawMessage(byteLevelSplit),
		"post_processor": post,
		"decoder":        byteLevelJSON{Type: "ByteLevel", AddPrefixSpace: true, TrimOffsets: true, UseRegex: true},
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
			"merges":                    mergeStrings,
		},
	}
}

// bosProcessor is a TemplateProcessing post-processor that prepends bos.
func bosProcessor(bos string, bosID int) map[string]any {
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
