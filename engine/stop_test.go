package engine

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// byteStream is a test detokenizer: token id i stands for the bytes vocab[i], and text
// is released only in whole UTF-8 characters, like tokenizer.Stream.
type byteStream struct {
	vocab   []string
	pending []byte
}

func (s *byteStream) Add(id int32) string {
	s.pending = append(s.pending, s.vocab[id]...)
	n := 0
	for n < len(s.pending) {
		r, size := utf8.DecodeRune(s.pending[n:])
		if r == utf8.RuneError && size <= 1 {
			if !utf8.FullRune(s.pending[n:]) {
				break
			}
		}
		n += size
	}
	out := string(s.pending[:n])
	s.pending = s.pending[n:]
	return out
}

func (s *byteStream) Flush() string {
	out := strings.ToValidUTF8(string(s.pending), "\uFFFD")
	s.pending = nil
	return out
}

func TestStopChecker(t *testing.T) {
	// Token ids index this vocabulary; "\xe4\xb8" + "\xad" is 中 split over two tokens.
	vocab := []string{
		0: "<eos>", 1: "Hello", 2: " wor", 3: "ld", 4: "!", 5: " ST", 6: "O", 7: "P", 8: " STOP",
		9: "\xe4\xb8", 10: "\xad", 11: "文", 12: "x", 13: "EN", 14: "D", 15: "S",
	}
	tests := []struct {
		name   string
		mod    func(p *SamplingParams)
		tokens []int32
		// deltas[i] is the text released after tokens[i]; the run ends after the last
		// token with finish.
		deltas []string
		finish FinishReason
	}{
		{"max tokens", func(p *SamplingParams) { p.MaxTokens = 3 },
			[]int32{1, 2, 3}, []string{"Hello", " wor", "ld"}, FinishLength},
		{"eos ends without its text", nil,
			[]int32{1, 0}, []string{"Hello", ""}, FinishStop},
		{"ignore_eos keeps going", func(p *SamplingParams) { p.IgnoreEOS = true; p.MaxTokens = 3 },
			[]int32{1, 0, 4}, []string{"Hello", "<eos>", "!"}, FinishLength},
		{"min_tokens ignores eos before", func(p *SamplingParams) { p.MinTokens = 2 },
			[]int32{0, 1, 0}, []string{"<eos>", "Hello", ""}, FinishStop},
		{"stop token id", func(p *SamplingParams) { p.StopTokenIDs = []int32{4} },
			[]int32{1, 4}, []string{"Hello", ""}, FinishStop},
		{"stop string split over 3 tokens", func(p *SamplingParams) { p.Stop = []string{" STOP"} },
			[]int32{1, 5, 6, 7, 4}, []string{"Hello", "", "", ""}, FinishStop},
		{"stop string inside one token", func(p *SamplingParams) { p.Stop = []string{"or"} },
			[]int32{1, 2, 3}, []string{"Hell", "o w"}, FinishStop},
		{"partial match that fails is released", func(p *SamplingParams) { p.Stop = []string{" STOP"}; p.MaxTokens = 4 },
			[]int32{1, 5, 6, 4}, []string{"Hello", "", "", " STO!"}, FinishLength},
		{"held text released at max tokens", func(p *SamplingParams) { p.Stop = []string{" STOP"}; p.MaxTokens = 3 },
			[]int32{1, 5, 6}, []string{"Hello", "", " STO"}, FinishLength},
		{"held text released at eos", func(p *SamplingParams) { p.Stop = []string{" STOP"} },
			[]int32{1, 5, 0}, []string{"Hello", "", " ST"}, FinishStop},
		{"multiple stop strings, earliest wins", func(p *SamplingParams) { p.Stop = []string{"ld", " w"} },
			[]int32{1, 2, 3}, []string{"Hello", ""}, FinishStop},
		{"multiple stop strings, overlapping prefixes", func(p *SamplingParams) { p.Stop = []string{"END", "ENS"} },
			[]int32{12, 13, 15}, []string{"x", "", ""}, FinishStop},
		{"multiple stop strings, one held one not", func(p *SamplingParams) { p.Stop = []string{"END", " STOP"}; p.MaxTokens = 4 },
			[]int32{12, 13, 14, 4}, []string{"x", "", ""}, FinishStop},
		{"text after the stop string in the same token is dropped", func(p *SamplingParams) { p.Stop = []string{"Hel"} },
			[]int32{1}, []string{""}, FinishStop},
		{"multibyte stop string split inside a character", func(p *SamplingParams) { p.Stop = []string{"中文"} },
			[]int32{12, 9, 10, 11}, []string{"x", "", "", ""}, FinishStop},
		{"multibyte text is never split", func(p *SamplingParams) { p.Stop = []string{"中x"}; p.MaxTokens = 4 },
			[]int32{12, 9, 10, 11}, []string{"x", "", "", "中文"}, FinishLength},
		{"stop strings wait for min_tokens", func(p *SamplingParams) { p.Stop = []string{"Hello", "wor"}; p.MinTokens = 1 },
			[]int32{1, 2, 3}, []string{"Hello", " "}, FinishStop},
		{"stop string in the first characters", func(p *SamplingParams) { p.Stop = []string{"Hello"} },
			[]int32{1, 4}, []string{""}, FinishStop},
		{"include_stop_str_in_output keeps the stop string split over 3 tokens", func(p *SamplingParams) { p.Stop = []string{" STOP"}; p.IncludeStopStr = true },
			[]int32{1, 5, 6, 7, 4}, []string{"Hello", "", "", " STOP"}, FinishStop},
		{"include_stop_str_in_output drops what follows in the same token", func(p *SamplingParams) { p.Stop = []string{"or"}; p.IncludeStopStr = true },
			[]int32{1, 2, 3}, []string{"Hell", "o wor"}, FinishStop},
		{"include_stop_str_in_output keeps a stop token's text", func(p *SamplingParams) { p.StopTokenIDs = []int32{4}; p.IncludeStopStr = true },
			[]int32{1, 4}, []string{"Hello", "!"}, FinishStop},
		{"include_stop_str_in_output keeps eos's text and the held text before it", func(p *SamplingParams) { p.Stop = []string{" STOP"}; p.IncludeStopStr = true },
			[]int32{1, 5, 0}, []string{"Hello", "", " ST<eos>"}, FinishStop},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultSamplingParams()
			if tc.mod != nil {
				tc.mod(&p)
			}
			c := newStopChecker(&p, []int32{0}, &byteStream{vocab: vocab})
			var got []string
			var finish FinishReason
			for _, id := range tc.tokens {
				if finish != "" {
					break
				}
				var text string
				text, finish = c.add(id)
				got = append(got, text)
			}
			if strings.Join(got, "|") != strings.Join(tc.deltas, "|") || len(got) != len(tc.deltas) || finish != tc.finish {
				t.Fatalf("deltas %q finish %q, want %q finish %q", got, finish, tc.deltas, tc.finish)
			}
			for _, d := range got {
				if !utf8.ValidString(d) {
					t.Fatalf("delta %q is not valid UTF-8", d)
				}
			}
		})
	}
}

func TestStopCheckerWithoutText(t *testing.T) {
	p := DefaultSamplingParams()
	p.MaxTokens = 2
	c := newStopChecker(&p, []int32{7}, nil)
	if text, f := c.add(3); text != "" || f != "" {
		t.Fatalf("first token: %q %q", text, f)
	}
	if _, f := c.add(4); f != FinishLength {
		t.Fatalf("finish %q, want length", f)
	}
	c = newStopChecker(&p, []int32{7}, nil)
	if _, f := c.add(7); f != FinishStop {
		t.Fatalf("eos: finish %q, want stop", f)
	}
}

// FuzzStopChecker checks that the released text is always a prefix of the full text,
// never contains a stop string, and is the full text cut at the first stop string.
func FuzzStopChecker(f *testing.F) {
	f.Add("Hello world STOP here", "STOP", 3)
	f.Add("aaab", "aab", 1)
	f.Add("中文中文", "文中", 2)
	f.Fuzz(func(t *testing.T, text, stop string, chunk int) {
		if !utf8.ValidString(text) || !utf8.ValidString(stop) || chunk <= 0 || chunk > 8 || len(text) > 200 {
			t.Skip()
		}
		// One token per chunk of bytes.
		var vocab []string
		var ids []int32
		for i := 0; i < len(text); i += chunk {
			vocab = append(vocab, text[i:min(i+chunk, len(text))])
			ids = append(ids, int32(len(vocab)-1))
		}
		if len(ids) == 0 {
			t.Skip()
		}
		p := DefaultSamplingParams()
		p.MaxTokens = len(ids)
		p.Stop = []string{stop}
		c := newStopChecker(&p, nil, &byteStream{vocab: vocab})
		var out strings.Builder
		var finish FinishReason
		for _, id := range ids {
			var d string
			d, finish = c.add(id)
			out.WriteString(d)
			if finish != "" {
				break
			}
		}
		want := text
		wantFinish := FinishLength
		if stop != "" {
			if i := strings.Index(text, stop); i >= 0 {
				want = text[:i]
				wantFinish = FinishStop
			}
		}
		if out.String() != want || finish != wantFinish {
			t.Fatalf("released %q (%s), want %q (%s)", out.String(), finish, want, wantFinish)
		}
	})
}
