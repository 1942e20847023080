package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dlclark/regexp2"
	sgnorm "github.com/sugarme/tokenizer/normalizer"
	"github.com/sugarme/tokenizer/pretrained"
	"golang.org/x/text/unicode/norm"
)

// normalizeFunc rewrites one stretch of input text (the text between added tokens).
type normalizeFunc func(string) (string, error)

// component is the common head of the JSON objects of normalizers, pre-tokenizers,
// post-processors and decoders.
type component struct {
	Type string `json:"type"`
}

// pattern is the {"String": ...} or {"Regex": ...} object used by Replace and Split.
type pattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// compile returns a regular expression for p: a literal for String, the expression for
// Regex. Regex uses .NET/Oniguruma-style syntax (look-ahead is allowed), as the Hugging
// Face files are written for Oniguruma.
func (p pattern) compile() (*regexp2.Regexp, error) {
	switch {
	case p.String != nil:
		return regexp2.MustCompile(regexp2.Escape(*p.String), regexp2.None), nil
	case p.Regex != nil:
		re, err := regexp2.Compile(*p.Regex, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("regex %q: %v", *p.Regex, err)
		}
		return re, nil
	}
	return nil, fmt.Errorf("pattern has neither String nor Regex")
}

// buildNormalizer turns a tokenizer.json "normalizer" object into a function. The common
// normalizers of LLM tokenizers are implemented here; the others known to
// github.com/sugarme/tokenizer (BertNormalizer, StripAccents, Precompiled) are delegated to it.
func buildNormalizer(raw json.RawMessage) (normalizeFunc, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("normalizer: %v", err)
	}
	switch c.Type {
	case "NFC":
		return func(s string) (string, error) { return norm.NFC.String(s), nil }, nil
	case "NFD":
		return func(s string) (string, error) { return norm.NFD.String(s), nil }, nil
	case "NFKC":
		return func(s string) (string, error) { return norm.NFKC.String(s), nil }, nil
	case "NFKD":
		return func(s string) (string, error) { return norm.NFKD.String(s), nil }, nil
	case "Lowercase":
		return func(s string) (string, error) { return strings.ToLower(s), nil }, nil
	case "Prepend":
		var p struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("normalizer Prepend: %v", err)
		}
		return func(s string) (string, error) {
			if s == "" {
				return s, nil
			}
			return p.Prepend + s, nil
		}, nil
	case "Replace":
		var p struct {
			Pattern pattern `json:"pattern"`
			Content string  `json:"content"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("normalizer Replace: %v", err)
		}
		if p.Pattern.String != nil && *p.Pattern.String != "" {
			old := *p.Pattern.String
			return func(s string) (string, error) { return strings.ReplaceAll(s, old, p.Content), nil }, nil
		}
		re, err := p.Pattern.compile()
		if err != nil {
			return nil, fmt.Errorf("normalizer Replace: %v", err)
		}
		return func(s string) (string, error) {
			return re.ReplaceFunc(s, func(regexp2.Match) string { return p.Content }, -1, -1)
		}, nil
	case "Strip":
		var p struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("normalizer Strip: %v", err)
		}
		return func(s string) (string, error) {
			if p.Left {
				s = strings.TrimLeft(s, " \t\n\r\v\f")
			}
			if p.Right {
				s = strings.TrimRight(s, " \t\n\r\v\f")
			}
			return s, nil
		}, nil
	case "Sequence":
		var p struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("normalizer Sequence: %v", err)
		}
		var fns []normalizeFunc
		for _, r := range p.Normalizers {
			fn, err := buildNormalizer(r)
			if err != nil {
				return nil, err
			}
			if fn != nil {
				fns = append(fns, fn)
			}
		}
		return func(s string) (string, error) {
			var err error
			for _, fn := range fns {
				if s, err = fn(s); err != nil {
					return "", err
				}
			}
			return s, nil
		}, nil
	case "BertNormalizer", "StripAccents", "Precompiled":
		return sugarmeNormalizer(raw)
	}
	return nil, fmt.Errorf("normalizer: unsupported type %q", c.Type)
}

// sugarmeNormalizer builds a normalizer with github.com/sugarme/tokenizer, turning its panics
// on unexpected JSON into errors.
func sugarmeNormalizer(raw json.RawMessage) (fn normalizeFunc, err error) {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("normalizer: %v", err)
	}
	defer func() {
		if r := recover(); r != nil {
			fn, err = nil, fmt.Errorf("normalizer %v: %v", m["type"], r)
		}
	}()
	n, err := pretrained.CreateNormalizer(m)
	if err != nil {
		return nil, fmt.Errorf("normalizer: %v", err)
	}
	return func(s string) (out string, err error) {
		defer func() {
			if r := recover(); r != nil {
				out, err = "", fmt.Errorf("normalizer: %v", r)
			}
		}()
		ns, err := n.Normalize(sgnorm.NewNormalizedFrom(s))
		if err != nil {
			return "", err
		}
		return ns.GetNormalized(), nil
	}, nil
}

// isNull reports whether raw is absent or the JSON null.
func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
