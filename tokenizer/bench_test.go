package tokenizer

import (
	"os"
	"path/filepath"
	"testing"
)

func benchCorpus(b *testing.B) string {
	b.Helper()
	text, err := os.ReadFile(filepath.Join("testdata", "corpus.txt"))
	if err != nil {
		b.Fatal(err)
	}
	return string(text)
}

// BenchmarkEncode encodes testdata/corpus.txt (about 3 KB of English); SetBytes makes the
// result read as input MB/s.
func BenchmarkEncode(b *testing.B) {
	tk := loadTest(b)
	text := benchCorpus(b)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if _, err := tk.Encode(text, true); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	tk := loadTest(b)
	ids, _ := tk.Encode(benchCorpus(b), true)
	b.ReportMetric(float64(len(ids)), "tokens/op")
	for b.Loop() {
		_ = tk.Decode(ids, true)
	}
}

// BenchmarkStreamAdd is the per-token cost of incremental detokenization.
func BenchmarkStreamAdd(b *testing.B) {
	tk := loadTest(b)
	ids, _ := tk.Encode(benchCorpus(b)+" 你好 😀", false)
	s := tk.NewStream(true)
	i := 0
	for b.Loop() {
		_ = s.Add(ids[i])
		if i++; i == len(ids) {
			i = 0
		}
	}
}

func BenchmarkApplyChatTemplate(b *testing.B) {
	tk := loadTest(b)
	msgs := []Message{{Role: "system", Content: "Be kind."}, {Role: "user", Content: "Hello there"}, {Role: "assistant", Content: "Hi!"}, {Role: "user", Content: "How are you?"}}
	for b.Loop() {
		if _, err := tk.ApplyChatTemplate(msgs, true); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLoad(b *testing.B) {
	for b.Loop() {
		if _, err := Load("testdata"); err != nil {
			b.Fatal(err)
		}
	}
}
