package openai

import (
	"encoding/json"
	"regexp"
)

// callStream turns the text of constrained tool calls, as it grows, into OpenAI's
// streamed deltas: a call's index, id, type and name once its name is complete, then its
// arguments in pieces as they are generated — compacted as they go, so the pieces join
// to the same arguments string the unstreamed response carries. It reads every format
// alike: the decoding constraint fixes the layout of each call object ({"name": ...,
// then the arguments member}), so only the name and the arguments object are looked for.
type callStream struct {
	pos   int // bytes of the call text consumed
	state int // seekName, seekArgs or inArgs
	calls []toolCallOut
	// Inside the arguments object.
	depth       int
	inStr, esc  bool
	pendingArgs []byte
}

const (
	seekName = iota
	seekArgs
	inArgs
)

var (
	callName = regexp.MustCompile(`"name"\s*:\s*("(?:[^"\\]|\\.)*")`)
	callArgs = regexp.MustCompile(`"(?:arguments|parameters)"\s*:\s*`)
)

// advance reads text (the whole call text so far) from where it stopped and returns the
// deltas for what is new.
func (s *callStream) advance(index int, text string) []chatChoice {
	var out []chatChoice
	for s.pos < len(text) {
		switch s.state {
		case seekName:
			m := callName.FindStringSubmatchIndex(text[s.pos:])
			if m == nil {
				return out
			}
			var name string
			if json.Unmarshal([]byte(text[s.pos+m[2]:s.pos+m[3]]), &name) != nil {
				return out
			}
			s.pos += m[1]
			s.state = seekArgs
			i := len(s.calls)
			s.calls = append(s.calls, toolCallOut{ID: NewID("call_"), Type: "function", Function: toolCallFunction{Name: name}})
			out = append(out, chatChoice{Index: index, Delta: &chatDelta{ToolCalls: []toolCallOut{{Index: &i, ID: s.calls[i].ID,
				Type: "function", Function: toolCallFunction{Name: name, Arguments: ""}}}}})
		case seekArgs:
			m := callArgs.FindStringIndex(text[s.pos:])
			if m == nil {
				return out
			}
			s.pos += m[1]
			s.state, s.depth, s.inStr, s.esc = inArgs, 0, false, false
		case inArgs:
			s.pendingArgs = s.pendingArgs[:0]
			for s.pos < len(text) && s.state == inArgs {
				c := text[s.pos]
				s.pos++
				switch {
				case s.esc:
					s.esc = false
				case s.inStr && c == '\\':
					s.esc = true
				case s.inStr:
					s.inStr = c != '"'
				case c == ' ' || c == '\n' || c == '\t' || c == '\r':
					continue // layout between tokens: left out, as json.Compact does
				case c == '"':
					s.inStr = true
				case c == '{' || c == '[':
					s.depth++
				case c == '}' || c == ']':
					s.depth--
				}
				s.pendingArgs = append(s.pendingArgs, c)
				if s.depth == 0 && !s.inStr {
					s.state = seekName // the arguments object closed
				}
			}
			if len(s.pendingArgs) > 0 {
				i := len(s.calls) - 1
				s.calls[i].Function.Arguments += string(s.pendingArgs)
				out = append(out, chatChoice{Index: index, Delta: &chatDelta{ToolCalls: []toolCallOut{{Index: &i,
					Function: toolCallFunction{Arguments: string(s.pendingArgs)}}}}})
			}
		}
	}
	return out
}
