package tokenizer

import (
	"errors"
)

// ErrInvalid is wrapped by every error about a malformed or unsupported tokenizer.json or
// tokenizer_config.json.
var ErrInvalid = errors.New("tokenizer: invalid tokenizer files")

// ErrTemplate is wrapped by every error raised while parsing or rendering a chat template,
// including errors raised by the template itself through raise_exception.
var ErrTemplate = errors.New("tokenizer: chat template error")

// Tokenizer turns text into token ids and back. It is safe for concurrent use once loaded.
type Tokenizer struct {
	// pieces[id] is the decoded byte string of token id (nil for ids without a token).
	pieces [][]byte
}

// Message is one chat message handed to a chat template.
type Message struct {
	Role    string
	Content string
}

// Load reads dir/tokenizer.json and, when present, dir/tokenizer_config.json.
func Load(dir string) (*Tokenizer, error) {
	return nil, errors.New("tokenizer: not implemented")
}

// Encode turns text into token ids. With addSpecial it adds the special tokens the model wants
// around a single sequence (usually a leading BOS).
func (t *Tokenizer) Encode(text string, addSpecial bool) ([]int32, error) {
	return nil, errors.New("tokenizer: not implemented")
}

// Decode turns token ids back into text. With skipSpecial, special tokens are left out.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) string { return "" }

// VocabSize is one more than the largest token id the tokenizer knows.
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }

// TokenText is the display text of one token.
func (t *Tokenizer) TokenText(id int32) string { return "" }

// BOS returns the beginning-of-sequence token id, if the tokenizer has one.
func (t *Tokenizer) BOS() (int32, bool) { return 0, false }

// EOS returns the end-of-sequence token ids.
func (t *Tokenizer) EOS() []int32 { return nil }

// Stream is an incremental detokenizer for one sequence.
type Stream struct {
	t *Tokenizer
}

// NewStream starts incremental detokenization of one sequence.
func (t *Tokenizer) NewStream(skipSpecial bool) *Stream { return &Stream{t: t} }

// Add appends one token and returns the newly completed text.
func (s *Stream) Add(id int32) string { return "" }

// Flush returns whatever text is still held back.
func (s *Stream) Flush() string { return "" }

// ApplyChatTemplate renders msgs with the model's chat template.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) (string, error) {
	return "", errors.New("tokenizer: not implemented")
}
