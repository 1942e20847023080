package modeldir

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrBadFile marks a model-directory file that exists but cannot be parsed.
var ErrBadFile = errors.New("modeldir: malformed model file")

// TokenIDs is a list of token ids that JSON may spell as a single integer, a list of
// integers or null (as Hugging Face does for eos_token_id).
type TokenIDs []int32

// UnmarshalJSON accepts an integer, a list of integers or null.
func (t *TokenIDs) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*t = nil
		return nil
	}
	if len(b) > 0 && b[0] == '[' {
		var ids []int32
		if err := json.Unmarshal(b, &ids); err != nil {
			return fmt.Errorf("token id list: %w", err)
		}
		*t = ids
		return nil
	}
	var id int32
	if err := json.Unmarshal(b, &id); err != nil {
		return fmt.Errorf("token id must be an integer or a list of integers, got %s", truncate(b))
	}
	*t = TokenIDs{id}
	return nil
}

// GenerationConfig is a model's optional generation_config.json: special tokens and
// the sampling defaults its authors recommend. Zero values mean "not given".
type GenerationConfig struct {
	BOSTokenID        *int32   `json:"bos_token_id"`
	EOSTokenID        TokenIDs `json:"eos_token_id"`
	PadTokenID        *int32   `json:"pad_token_id"`
	DoSample          *bool    `json:"do_sample"`
	Temperature       *float64 `json:"temperature"`
	TopP              *float64 `json:"top_p"`
	TopK              *int     `json:"top_k"`
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	MaxNewTokens      *int     `json:"max_new_tokens"`
	MaxLength         *int     `json:"max_length"`
}

// LoadGenerationConfig reads dir/generation_config.json. A missing file is not an
// error: it returns a zero GenerationConfig.
func LoadGenerationConfig(dir string) (*GenerationConfig, error) {
	path := filepath.Join(dir, "generation_config.json")
	var g GenerationConfig
	if err := readJSONFile(path, &g); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return &GenerationConfig{}, nil
		}
		return nil, err
	}
	return &g, nil
}

// MergeEOS merges the end-of-sequence ids of config.json (configIDs) and
// generation_config.json (g may be nil), in order, without duplicates.
func MergeEOS(configIDs []int32, g *GenerationConfig) []int32 {
	var out []int32
	seen := map[int32]bool{}
	add := func(ids []int32) {
		for _, id := range ids {
			if !seen[id] {
				seen[id] = true
				out = append(out, id)
			}
		}
	}
	add(configIDs)
	if g != nil {
		add(g.EOSTokenID)
	}
	return out
}

// readJSONFile decodes path into v. A missing file's error wraps fs.ErrNotExist;
// malformed JSON wraps ErrBadFile.
func readJSONFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("modeldir: read %s: %w", path, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadFile, path, err)
	}
	return nil
}

// writeJSONFile writes v, indented, as dir/sub/name, creating dir/sub.
func writeJSONFile(dir, sub, name string, v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("modeldir: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
		return fmt.Errorf("modeldir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, sub, name), append(raw, '\n'), 0o644); err != nil {
		return fmt.Errorf("modeldir: %w", err)
	}
	return nil
}

// truncate shortens b for inclusion in an error message.
func truncate(b []byte) string {
	const max = 40
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}
