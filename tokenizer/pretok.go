package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dlclark/regexp2"
)

// gpt2Pattern is the word-splitting expression of GPT-2's byte-level pre-tokenizer (run by
// the scanGPT2 scanner).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// preTokenizer splits a stretch of normalized text into words; the model then tokenizes each
// word on its own. first reports whether the stretch starts the input (Metaspace's
// prepend_scheme "first" depends on it).
type preTokenizer func(words []string, first bool) ([]string, error)

// splitBehavior says what happens to the pieces a Split pattern matches.
type splitBehavior int

const (
	splitRemoved splitBehavior = iota
	splitIsolated
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch strings.ToLower(s) {
	case "removed":
		return splitRemoved, nil
	case "isolated":
		return splitIsolated, nil
	case "mergedwithprevious":
		return splitMergedWithPrevious, nil
	case "mergedwithnext":
		return splitMergedWithNext, nil
	case "contiguous":
		return splitContiguous, nil
	}
	return 0, fmt.Errorf("unknown split behavior %q", s)
}

// buildPreTokenizer turns a tokenizer.json "pre_tokenizer" object into a function, and
// reports whether it maps text to the byte-level alphabet.
func buildPreTokenizer(raw json.RawMessage) (pt preTokenizer, byteLevel bool, err error) {
	if isNull(raw) {
		return nil, false, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, false, fmt.Errorf("pre_tokenizer: %v", err)
	}
	switch c.Type {
	case "ByteLevel":
		p := struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}{}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, false, fmt.Errorf("pre_tokenizer ByteLevel: %v", err)
		}
		useRegex := p.UseRegex == nil || *p.UseRegex
		return func(words []string, _ bool) ([]string, error) {
			var out []string
			for _, w := range words {
				if p.AddPrefixSpace && !strings.HasPrefix(w, " ") {
					w = " " + w
				}
				pieces := []string{w}
				if useRegex {
					pieces = scanSplit(scanGPT2, w)
				}
				for _, piece := range pieces {
					out = append(out, byteLevelEncode(piece))
				}
			}
			return out, nil
		}, true, nil
	case "Split":
		var p struct {
			Pattern  pattern `json:"pattern"`
			Behavior string  `json:"behavior"`
			Invert   bool    `json:"invert"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, false, fmt.Errorf("pre_tokenizer Split: %v", err)
		}
		re, err := p.Pattern.compile()
		if err != nil {
			return nil, false, fmt.Errorf("pre_tokenizer Split: %v", err)
		}
		b, err := parseBehavior(p.Behavior)
		if err != nil {
			return nil, false, fmt.Errorf("pre_tokenizer Split: %v", err)
		}
		if p.Pattern.Regex != nil && b == splitIsolated && !p.Invert {
			if sc := scannerFor(*p.Pattern.Regex); sc != nil {
				return eachWord(func(w string) ([]string, error) { return scanSplit(sc, w), nil }), false, nil
			}
		}
		return eachWord(func(w string) ([]string, error) { return regexSplit(re, w, b, p.Invert) }), false, nil
	case "Metaspace":
		var p struct {
			Replacement    string  `json:"replacement"`
			AddPrefixSpace *bool   `json:"add_prefix_space"`
			PrependScheme  *string `json:"prepend_scheme"`
			Split          *bool   `json:"split"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, false, fmt.Errorf("pre_tokenizer Metaspace: %v", err)
		}
		if p.Replacement == "" {
			p.Replacement = "▁"
		}
		scheme := "always"
		if p.PrependScheme != nil {
			scheme = strings.ToLower(*p.PrependScheme)
		} else if p.AddPrefixSpace != nil && !*p.AddPrefixSpace {
			scheme = "never"
		}
		if scheme != "always" && scheme != "first" && scheme != "never" {
			return nil, false, fmt.Errorf("pre_tokenizer Metaspace: unknown prepend_scheme %q", scheme)
		}
		split := p.Split == nil || *p.Split
		rep := p.Replacement
		return func(words []string, first bool) ([]string, error) {
			var out []string
			atStart := first // the word starts the input ("first" prepends only there)
			for _, w := range words {
				if w == "" {
					continue // Hugging Face prepends nothing to an empty piece, and drops it
				}
				w = strings.ReplaceAll(w, " ", rep)
				if !strings.HasPrefix(w, rep) && (scheme == "always" || (scheme == "first" && atStart)) {
					w = rep + w
				}
				atStart = false
				if !split {
					out = append(out, w)
					continue
				}
				out = append(out, splitBefore(w, rep)...)
			}
			return out, nil
		}, false, nil
	case "WhitespaceSplit":
		return eachWord(func(w string) ([]string, error) { return strings.Fields(w), nil }), false, nil
	case "Whitespace":
		re := regexp2.MustCompile(`\w+|[^\w\s]+`, regexp2.None)
		return eachWord(func(w string) ([]string, error) { return regexSplit(re, w, splitRemoved, true) }), false, nil
	case "Digits":
		var p struct {
			Individual bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, false, fmt.Errorf("pre_tokenizer Digits: %v", err)
		}
		expr, b := `\p{Nd}`, splitIsolated
		if !p.Individual {
			b = splitContiguous
		}
		re := regexp2.MustCompile(expr, regexp2.None)
		return eachWord(func(w string) ([]string, error) { return regexSplit(re, w, b, false) }), false, nil
	case "Punctuation":
		var p struct {
			Behavior string `json:"behavior"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, false, fmt.Errorf("pre_tokenizer Punctuation: %v", err)
		}
		if p.Behavior == "" {
			p.Behavior = "Isolated"
		}
		b, err := parseBehavior(p.Behavior)
		if err != nil {
			return nil, false, fmt.Errorf("pre_tokenizer Punctuation: %v", err)
		}
		re := regexp2.MustCompile(`\p{P}|[$+<=>^`+"`"+`|~]`, regexp2.None)
		return eachWord(func(w string) ([]string, error) { return regexSplit(re, w, b, false) }), false, nil
	case "Sequence":
		var p struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, false, fmt.Errorf("pre_tokenizer Sequence: %v", err)
		}
		var steps []preTokenizer
		for _, r := range p.PreTokenizers {
			step, bl, err := buildPreTokenizer(r)
			if err != nil {
				return nil, false, err
			}
			byteLevel = byteLevel || bl
			if step != nil {
				steps = append(steps, step)
			}
		}
		return func(words []string, first bool) ([]string, error) {
			var err error
			for _, step := range steps {
				if words, err = step(words, first); err != nil {
					return nil, err
				}
			}
			return words, nil
		}, byteLevel, nil
	}
	return nil, false, fmt.Errorf("pre_tokenizer: unsupported type %q", c.Type)
}

// eachWord lifts a one-word splitter to a pre-tokenizer.
func eachWord(split func(string) ([]string, error)) preTokenizer {
	return func(words []string, _ bool) ([]string, error) {
		var out []string
		for _, w := range words {
			pieces, err := split(w)
			if err != nil {
				return nil, err
			}
			out = append(out, pieces...)
		}
		return out, nil
	}
}

// splitBefore cuts w before every occurrence of sep, which stays at the start of the piece
// after it: Hugging Face's split on Metaspace's replacement with MergedWithNext. Text before
// the first sep (when w does not start with it) is a piece of its own; no piece is empty.
// For example "a▁▁b" gives "a", "▁", "▁b".
func splitBefore(w, sep string) []string {
	if sep == "" {
		return []string{w}
	}
	var out []string
	for w != "" {
		skip := 0 // a piece that starts with sep runs to the next one after it
		if strings.HasPrefix(w, sep) {
			skip = len(sep)
		}
		i := strings.Index(w[skip:], sep)
		if i < 0 {
			out = append(out, w)
			break
		}
		out = append(out, w[:skip+i])
		w = w[skip+i:]
	}
	return out
}

// regexSplit splits w around the matches of re according to behavior; with invert, the
// pieces between matches are treated as the matches.
func regexSplit(re *regexp2.Regexp, w string, behavior splitBehavior, invert bool) ([]string, error) {
	if w == "" {
		return nil, nil
	}
	runes := []rune(w)
	type span struct {
		start, end int // rune indices
		match      bool
	}
	var spans []span
	pos := 0
	m, err := re.FindRunesMatch(runes)
	for ; err == nil && m != nil; m, err = re.FindNextMatch(m) {
		if m.Length == 0 {
			continue
		}
		if m.Index > pos {
			spans = append(spans, span{pos, m.Index, false})
		}
		spans = append(spans, span{m.Index, m.Index + m.Length, true})
		pos = m.Index + m.Length
	}
	if err != nil {
		return nil, fmt.Errorf("split: %v", err)
	}
	if pos < len(runes) {
		spans = append(spans, span{pos, len(runes), false})
	}
	if invert {
		for i := range spans {
			spans[i].match = !spans[i].match
		}
	}
	var out []string
	text := func(sp span) string { return string(runes[sp.start:sp.end]) }
	switch behavior {
	case splitRemoved:
		for _, sp := range spans {
			if !sp.match {
				out = append(out, text(sp))
			}
		}
	case splitIsolated:
		for _, sp := range spans {
			out = append(out, text(sp))
		}
	case splitContiguous:
		for i := 0; i < len(spans); i++ {
			sp := spans[i]
			for sp.match && i+1 < len(spans) && spans[i+1].match {
				i++
				sp.end = spans[i].end
			}
			out = append(out, text(sp))
		}
	case splitMergedWithPrevious:
		// A match joins the piece before it when that piece is text not yet merged.
		canMerge := false
		for _, sp := range spans {
			if sp.match && canMerge {
				out[len(out)-1] += text(sp)
				canMerge = false
				continue
			}
			out = append(out, text(sp))
			canMerge = !sp.match
		}
	case splitMergedWithNext:
		// A match joins the piece after it when that piece is text.
		for i := 0; i < len(spans); i++ {
			sp := spans[i]
			if sp.match && i+1 < len(spans) && !spans[i+1].match {
				out = append(out, text(sp)+text(spans[i+1]))
				i++
				continue
			}
			out = append(out, text(sp))
		}
	}
	return out, nil
}
