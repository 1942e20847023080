package tokenizer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// Python semantics for the string methods and filters chat templates use, where gonja's
// differ from Python's (jinja2 calls the Python str methods themselves).

// strMethodNames are the Python string methods gonja implements.
var strMethodNames = strings.Fields(`capitalize capwords casefold center count encode endswith
	expandtabs find format format_map isalnum isalpha isascii isdecimal isdigit islower isnumeric
	isprintable isspace istitle isupper join ljust lower lstrip partition removeprefix
	removesuffix replace rfind rjust rpartition rsplit rstrip split splitlines startswith strip
	swapcase title upper zfill`)

// strMethods is gonja's set of string methods with these replaced by Python's behaviour:
//   - strip, lstrip, rstrip: chars optional (None or omitted: Python's whitespace, which is
//     Unicode's plus U+001C..U+001F); gonja stripped ASCII whitespace only and failed
//     without an argument to lstrip and rstrip.
//   - split, rsplit: sep optional (None or omitted: split at runs of whitespace), maxsplit
//     counted as Python counts it; gonja failed without sep and split one time too few.
//   - isspace: Python's whitespace.
//   - splitlines: Python's line boundaries (with \v, \f, U+001C..U+001E, U+0085, U+2028
//     and U+2029).
//   - startswith, endswith: a tuple of strings, and start and end in characters.
//   - replace: count optional (gonja required it).
func strMethods(base *exec.MethodSet[string]) *exec.MethodSet[string] {
	m := map[string]exec.Method[string]{}
	for _, name := range strMethodNames {
		if fn, ok := base.Get(name); ok {
			m[name] = fn
		}
	}
	m["replace"] = func(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args) < 2 || len(args.Args) > 3 || !args.Args[0].IsString() || !args.Args[1].IsString() {
			return nil, exec.ErrInvalidCall(errors.New("replace(old, new[, count]) takes strings and an optional integer"))
		}
		count := -1
		if len(args.Args) == 3 {
			if !args.Args[2].IsInteger() {
				return nil, exec.ErrInvalidCall(errors.New("replace: count must be an integer"))
			}
			count = args.Args[2].Integer()
		}
		return strings.Replace(self, args.Args[0].String(), args.Args[1].String(), count), nil
	}
	strip := func(name string, left, right bool) exec.Method[string] {
		return func(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
			a, err := pyArgs(name, args, "chars")
			if err != nil {
				return nil, err
			}
			cut, err := cutFunc(name, a[0])
			if err != nil {
				return nil, err
			}
			if left {
				self = strings.TrimLeftFunc(self, cut)
			}
			if right {
				self = strings.TrimRightFunc(self, cut)
			}
			return self, nil
		}
	}
	m["strip"] = strip("strip", true, true)
	m["lstrip"] = strip("lstrip", true, false)
	m["rstrip"] = strip("rstrip", false, true)
	split := func(name string, fromRight bool) exec.Method[string] {
		return func(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
			a, err := pyArgs(name, args, "sep", "maxsplit")
			if err != nil {
				return nil, err
			}
			maxsplit := -1
			if a[1] != nil {
				if !a[1].IsInteger() {
					return nil, exec.ErrInvalidCall(fmt.Errorf("%s: maxsplit must be an integer", name))
				}
				maxsplit = a[1].Integer()
			}
			if a[0] == nil || a[0].IsNil() {
				return pySplitSpace(self, maxsplit, fromRight), nil
			}
			if !a[0].IsString() {
				return nil, exec.ErrInvalidCall(fmt.Errorf("%s: sep must be a string or None", name))
			}
			sep := a[0].String()
			if sep == "" {
				return nil, exec.ErrInvalidCall(fmt.Errorf("%s: empty separator", name))
			}
			return pySplit(self, sep, maxsplit, fromRight), nil
		}
	}
	m["split"] = split("split", false)
	m["rsplit"] = split("rsplit", true)
	m["isspace"] = func(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
		if _, err := pyArgs("isspace", args); err != nil {
			return nil, err
		}
		return self != "" && strings.IndexFunc(self, func(r rune) bool { return !pyIsSpace(r) }) < 0, nil
	}
	affix := func(name string, match func(s, affix string) bool) exec.Method[string] {
		return func(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
			a, err := pyArgs(name, args, "affix", "start", "end")
			if err != nil {
				return nil, err
			}
			var affixes []string
			switch {
			case a[0] != nil && a[0].IsString():
				affixes = []string{a[0].String()}
			case a[0] != nil && a[0].IsList():
				for i := range a[0].Len() {
					e := a[0].Index(i)
					if !e.IsString() {
						return nil, exec.ErrInvalidCall(fmt.Errorf("%s: a tuple of strings is needed", name))
					}
					affixes = append(affixes, e.String())
				}
			default:
				return nil, exec.ErrInvalidCall(fmt.Errorf("%s: a string or a tuple of strings is needed", name))
			}
			if a[1] != nil && !a[1].IsNil() || a[2] != nil && !a[2].IsNil() {
				runes := []rune(self)
				start, end, ok := pyBounds(len(runes), a[1], a[2])
				if !ok {
					return nil, exec.ErrInvalidCall(fmt.Errorf("%s: start and end must be integers or None", name))
				}
				if end = min(end, len(runes)); start > end {
					return false, nil
				}
				self = string(runes[start:end])
			}
			return slices.ContainsFunc(affixes, func(x string) bool { return match(self, x) }), nil
		}
	}
	m["splitlines"] = func(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
		a, err := pyArgs("splitlines", args, "keepends")
		if err != nil {
			return nil, err
		}
		return pySplitLines(self, a[0] != nil && a[0].IsTrue()), nil
	}
	m["startswith"] = affix("startswith", strings.HasPrefix)
	m["endswith"] = affix("endswith", strings.HasSuffix)
	return exec.NewMethodSet(m)
}

// pyArgs matches a call's arguments to the parameters names (positional, then by keyword);
// a parameter not given is nil.
func pyArgs(method string, args *exec.VarArgs, names ...string) ([]*exec.Value, error) {
	if len(args.Args) > len(names) {
		return nil, exec.ErrInvalidCall(fmt.Errorf("%s takes at most %d arguments (%d given)", method, len(names), len(args.Args)))
	}
	out := make([]*exec.Value, len(names))
	copy(out, args.Args)
	for k, v := range args.KwArgs {
		i := slices.Index(names, k)
		if i < 0 || out[i] != nil {
			return nil, exec.ErrInvalidCall(fmt.Errorf("%s: unexpected or repeated argument %q", method, k))
		}
		out[i] = v
	}
	return out, nil
}

// cutFunc is the set of characters strip removes: chars, or whitespace for None.
func cutFunc(method string, chars *exec.Value) (func(rune) bool, error) {
	if chars == nil || chars.IsNil() {
		return pyIsSpace, nil
	}
	if !chars.IsString() {
		return nil, exec.ErrInvalidCall(fmt.Errorf("%s: chars must be a string or None", method))
	}
	set := chars.String()
	return func(r rune) bool { return strings.ContainsRune(set, r) }, nil
}

// pyIsSpace is Python's str.isspace for one character: Unicode White_Space (which is Go's
// unicode.IsSpace) plus the separators U+001C..U+001F.
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }

// pySplit is Python's s.split(sep, maxsplit) (fromRight: rsplit) for a non-empty sep.
func pySplit(s, sep string, maxsplit int, fromRight bool) []string {
	if maxsplit < 0 {
		return strings.Split(s, sep)
	}
	if !fromRight {
		return strings.SplitN(s, sep, maxsplit+1)
	}
	var rev []string
	for len(rev) < maxsplit {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		rev = append(rev, s[i+len(sep):])
		s = s[:i]
	}
	rev = append(rev, s)
	slices.Reverse(rev)
	return rev
}

// pySplitSpace is Python's s.split(None, maxsplit) (fromRight: rsplit): the words between
// runs of whitespace; once maxsplit words are split off, the rest is the last item with its
// outer whitespace on the side split from removed.
func pySplitSpace(s string, maxsplit int, fromRight bool) []string {
	words := []string{}
	if !fromRight {
		for {
			s = strings.TrimLeftFunc(s, pyIsSpace)
			if s == "" {
				return words
			}
			if maxsplit >= 0 && len(words) == maxsplit {
				return append(words, s)
			}
			end := strings.IndexFunc(s, pyIsSpace)
			if end < 0 {
				return append(words, s)
			}
			words = append(words, s[:end])
			s = s[end:]
		}
	}
	for {
		s = strings.TrimRightFunc(s, pyIsSpace)
		if s == "" {
			break
		}
		if maxsplit >= 0 && len(words) == maxsplit {
			words = append(words, s)
			break
		}
		start := strings.LastIndexFunc(s, pyIsSpace)
		if start < 0 {
			words = append(words, s)
			break
		}
		_, size := utf8.DecodeRuneInString(s[start:])
		words = append(words, s[start+size:])
		s = s[:start]
	}
	slices.Reverse(words)
	return words
}

// pySplitLines is Python's s.splitlines(keepends).
func pySplitLines(s string, keepends bool) []string {
	lines := []string{}
	for start, i := 0, 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch r {
		case '\n', '\r', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
		default:
			i += size
			if i == len(s) {
				lines = append(lines, s[start:])
			}
			continue
		}
		end := i
		if i += size; r == '\r' && i < len(s) && s[i] == '\n' {
			i++
		}
		if keepends {
			end = i
		}
		lines = append(lines, s[start:end])
		start = i
	}
	return lines
}

// pyBounds resolves the bounds start and end of str.startswith (integers, None or absent;
// negative counts from the end) over a string of n characters; either may exceed n.
func pyBounds(n int, start, end *exec.Value) (int, int, bool) {
	resolve := func(v *exec.Value, def int) (int, bool) {
		if v == nil || v.IsNil() {
			return def, true
		}
		if !v.IsInteger() {
			return 0, false
		}
		i := v.Integer()
		if i < 0 {
			i = max(i+n, 0)
		}
		return i, true
	}
	s, ok1 := resolve(start, 0)
	e, ok2 := resolve(end, n)
	return s, e, ok1 && ok2
}

// filterTrim is Jinja's trim: str(value).strip(chars), chars None or omitted for Python's
// whitespace (gonja trimmed Unicode whitespace without U+001C..U+001F and refused
// non-strings).
func filterTrim(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	a, err := pyArgs("trim", params, "chars")
	if err != nil {
		return exec.AsValue(err)
	}
	cut, err := cutFunc("trim", a[0])
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsValue(strings.TrimFunc(in.String(), cut))
}
