package engine

import "github.com/conveyor-llm/conveyor/tokenizer"

// textSource is what the engine needs from a tokenizer: an incremental detokenizer per
// sequence that continues the text of its prompt, the display text of single tokens
// (logprobs) and the end-of-sequence ids. A nil textSource produces token ids only.
type textSource interface {
	newStream(prompt []int32, keepSpecial bool) textStream
	tokenText(id int32) string
	eos() []int32
}

// tokenizerText adapts *tokenizer.Tokenizer.
type tokenizerText struct{ t *tokenizer.Tokenizer }

func (s tokenizerText) newStream(prompt []int32, keepSpecial bool) textStream {
	return s.t.NewStreamAfter(prompt, !keepSpecial)
}
func (s tokenizerText) tokenText(id int32) string { return s.t.TokenText(id) }
func (s tokenizerText) eos() []int32              { return s.t.EOS() }
