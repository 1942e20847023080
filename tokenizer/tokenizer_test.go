package tokenizer

import (
	"testing"
)

func loadTest(t testing.TB) *Tokenizer {
	t.Helper()
	tk, err := Load("testdata")
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestTestTokenizerLayout(t *testing.T) {
	tk := loadTest(t)
	if got := tk.VocabSize(); got != 512 {
		t.Errorf("VocabSize = %d, want 512", got)
	}
	for id, want := range []string{"<unk>", "<s>", "</s>"} {
		if got, _ := tk.Token(int32(id)); got != want {
			t.Errorf("Token(%d) = %q, want %q", id, got, want)
		}
	}
	if bos, ok := tk.BOS(); !ok || bos != 1 {
		t.Errorf("BOS = %d, %v; want 1, true", bos, ok)
	}
	if eos := tk.EOS(); len(eos) != 1 || eos[0] != 2 {
		t.Errorf("EOS = %v, want [2]", eos)
	}
	ids, err := tk.Encode("The quick brown fox", true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ids %v", ids)
	if ids[0] != 1 {
		t.Errorf("Encode with addSpecial starts with %d, want BOS 1", ids[0])
	}
	if got := tk.Decode(ids, true); got != "The quick brown fox" {
		t.Errorf("Decode = %q", got)
	}
	if got := tk.Decode(ids, false); got != "<s>The quick brown fox" {
		t.Errorf("Decode = %q", got)
	}
}
