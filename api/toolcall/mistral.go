package toolcall

import (
	"encoding/json"
	"errors"
	"io"
	"strings"

	"github.com/conveyor-llm/conveyor/engine/structured"
)

// Mistral is vLLM's mistral format: [TOOL_CALLS][{"name": ..., "arguments": ...}, ...],
// chosen when the chat template writes [TOOL_CALLS]. [TOOL_CALLS] is a control token in
// Mistral's tokenizers: the reply's text keeps it (ControlPrefix) and constrained
// decoding may emit it (ControlLiterals).
var Mistral = register(Format{Name: "mistral", Prefix: mistralTag + "[", Suffix: "]", Sep: ", ", ArgsKey: "arguments",
	Trigger: structured.Trigger{Text: mistralTag}, control: mistralTag,
	marks: []string{mistralTag}, rank: 1, parse: parseMistral, cut: cutMistral})

// mistralTag opens the list of calls.
const mistralTag = "[TOOL_CALLS]"

func parseMistral(text string) (string, []Call) {
	i := strings.Index(text, mistralTag)
	if i < 0 {
		return text, nil
	}
	var raw []json.RawMessage
	dec := json.NewDecoder(strings.NewReader(text[i+len(mistralTag):]))
	if err := dec.Decode(&raw); err != nil || len(raw) == 0 {
		return text, nil
	}
	var calls []Call
	for _, r := range raw {
		c, ok := callFrom(string(r), "arguments")
		if !ok {
			return text, nil
		}
		calls = append(calls, c)
	}
	return strings.TrimSpace(text[:i]), calls
}

// cutMistral is ParseCut of mistral: the calls are one JSON array after [TOOL_CALLS]; an
// element the reply's end cuts short is the open call, and so is the list itself when
// no element of it is complete.
func cutMistral(text string) (string, []Call, int) {
	i := strings.Index(text, mistralTag)
	if i < 0 {
		return text, nil, -1
	}
	base := i + len(mistralTag)
	dec := json.NewDecoder(strings.NewReader(text[base:]))
	if tok, err := dec.Token(); err == io.EOF {
		return strings.TrimSpace(text[:i]), nil, i // the reply ends right after the tag
	} else if err != nil || tok != json.Delim('[') {
		content, calls := parseMistral(text)
		return content, calls, -1
	}
	var calls []Call
	for dec.More() {
		start := base + int(dec.InputOffset())
		start += len(text[start:]) - len(strings.TrimLeft(text[start:], " \t\r\n,"))
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if err == io.EOF {
			break // the reply ends after a comma
		}
		if err != nil {
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				return text, nil, -1 // malformed: Parse's answer
			}
			if len(calls) == 0 {
				start = i
			}
			return strings.TrimSpace(text[:i]), calls, start
		}
		c, ok := callFrom(string(raw), "arguments")
		if !ok {
			return text, nil, -1
		}
		calls = append(calls, c)
	}
	if _, err := dec.Token(); err == nil {
		content, calls := parseMistral(text) // the list closed: nothing was cut
		return content, calls, -1
	}
	if len(calls) == 0 {
		return strings.TrimSpace(text[:i]), nil, i
	}
	return strings.TrimSpace(text[:i]), calls, -1 // cut between two calls
}
