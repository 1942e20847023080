package tokenizer

import (
	"encoding/json"
	"math/rand"
	"slices"
	"strings"
	"testing"
)

// trainingLines returns n seeded sentences over a small vocabulary, with " the" the most
// frequent word.
func trainingLines(seed int64, n int) []string {
	words := []string{"the", "the", "the", "jury", "said", "city", "election", "was", "conducted", "of", "and",
		"in", "county", "report", "Atlanta's", "recent", "primary", "produced", "no", "evidence", "that", "any",
		"irregularities", "took", "place", "café", "naïve"}
	rng := rand.New(rand.NewSource(seed))
	lines := make([]string, n)
	for i := range lines {
		ws := make([]string, 4+rng.Intn(12))
		for j := range ws {
			ws[j] = words[rng.Intn(len(words))]
		}
		ws[0] = strings.ToUpper(ws[0][:1]) + ws[0][1:]
		lines[i] = strings.Join(ws, " ") + "."
	}
	return lines
}

func TestTrainByteLevelBPE(t *testing.T) {
	wc := NewWordCounter()
	for _, l := range trainingLines(1, 2000) {
		if err := wc.Add(l); err != nil {
			t.Fatal(err)
		}
	}
	if wc.Counts["Ġthe"] == 0 || wc.Counts["the"] != 0 && wc.Counts["Ġthe"] < wc.Counts["the"] {
		t.Fatalf("word counts do not use the byte-level split: Ġthe=%d the=%d", wc.Counts["Ġthe"], wc.Counts["the"])
	}
	specials := []string{"<unk>", "<s>", "</s>"}
	const vocab = 300
	data, coverage, err := TrainByteLevelBPE(wc.Counts, TrainConfig{VocabSize: vocab, MinFrequency: 2, Specials: specials, BOS: "<s>"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"content": "<s>"`) {
		t.Errorf("special tokens are escaped in tokenizer.json")
	}
	if coverage != 1 {
		t.Errorf("coverage %v with fewer words than the trainer's bound, want 1", coverage)
	}
	var doc struct {
		Model struct {
			Vocab  map[string]int `json:"vocab"`
			Merges []string       `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Model.Vocab) > vocab || len(doc.Model.Vocab) < 256+len(specials) {
		t.Errorf("vocabulary of %d tokens, want at most %d and every byte", len(doc.Model.Vocab), vocab)
	}
	for i, s := range specials {
		if doc.Model.Vocab[s] != i {
			t.Errorf("special %q has id %d, want %d", s, doc.Model.Vocab[s], i)
		}
	}
	ids := make([]int, 0, len(doc.Model.Vocab))
	for _, id := range doc.Model.Vocab {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for i, id := range ids {
		if id != i {
			t.Fatalf("ids are not 0..%d: %d at %d", len(ids)-1, id, i)
		}
	}

	tk, err := FromBytes(data, nil)
	if err != nil {
		t.Fatalf("the trained tokenizer.json does not load: %v", err)
	}
	bos, ok := tk.BOS()
	if !ok || bos != 1 {
		t.Errorf("bos = %d, %v; want 1", bos, ok)
	}
	// The most frequent word became one token, and a sentence the trainer never saw
	// (with characters outside its alphabet's merges) round-trips.
	if the, err := tk.Encode(" the", false); err != nil || len(the) != 1 {
		t.Errorf(`" the" encodes to %v (%v), want one token`, the, err)
	}
	for _, text := range []string{"The jury said the city was naïve.", "Zebras über 7 quokkas — 🙂"} {
		enc, err := tk.Encode(text, true)
		if err != nil {
			t.Fatal(err)
		}
		if enc[0] != bos {
			t.Errorf("%q: first token %d, want bos", text, enc[0])
		}
		if got := tk.Decode(enc, true); got != text {
			t.Errorf("round trip: %q -> %q", text, got)
		}
	}
	if words := len(strings.Fields("The jury said the city was naïve.")); len(mustEncode(t, tk, "The jury said the city was naïve.")) > 3*words {
		t.Errorf("seen words are not merged: %d tokens for %d words", len(mustEncode(t, tk, "The jury said the city was naïve.")), words)
	}
}

func mustEncode(t *testing.T, tk *Tokenizer, s string) []int32 {
	t.Helper()
	ids, err := tk.Encode(s, false)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestTrainByteLevelBPERejectsTinyVocabulary(t *testing.T) {
	if _, _, err := TrainByteLevelBPE(map[string]int{"a": 1}, TrainConfig{VocabSize: 200, Specials: []string{"<s>"}}); err == nil {
		t.Fatal("a vocabulary smaller than the byte alphabet was accepted")
	}
}

func TestMostFrequent(t *testing.T) {
	counts := map[string]int{"a": 5, "b": 3, "c": 3, "d": 1}
	kept, cov := mostFrequent(counts, 2)
	if len(kept) != 2 || kept["a"] != 5 || kept["b"] != 3 {
		t.Errorf("kept %v, want a and b (ties broken by the word)", kept)
	}
	if want := 8.0 / 12; cov != want {
		t.Errorf("coverage %v, want %v", cov, want)
	}
}
