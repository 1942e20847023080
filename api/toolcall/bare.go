package toolcall

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
)

// The bare layout writes each call as one JSON object, several separated by ';' or
// newlines; it is the layout of every format that registers no parser of its own. A
// reply may open with a lead, a text some models write before their calls (Format.lead),
// which reading skips whichever bare format reads the reply: a model served under the
// fallback format may still write its family's lead.

// leads holds the leads of the registered formats (register adds them).
var leads []string

// leadLen returns the length of the lead s opens with, 0 when none.
func leadLen(s string) int {
	for _, l := range leads {
		if strings.HasPrefix(s, l) {
			return len(l)
		}
	}
	return 0
}

// parseBare reads a reply that is one call object, or several separated by ';' or
// newlines, optionally after a lead.
func parseBare(text, argsKey string) (string, []Call) {
	body := strings.TrimSpace(text)
	body = strings.TrimSpace(body[leadLen(body):])
	if !strings.HasPrefix(body, "{") {
		return text, nil
	}
	dec := json.NewDecoder(strings.NewReader(body))
	var calls []Call
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return text, nil
		}
		c, ok := callFrom(string(raw), argsKey)
		if !ok {
			return text, nil
		}
		calls = append(calls, c)
		rest := strings.TrimLeft(body[dec.InputOffset():], " \t\r\n;")
		if rest == "" {
			return "", calls
		}
		if !strings.HasPrefix(rest, "{") {
			return text, nil
		}
		dec = json.NewDecoder(strings.NewReader(rest))
		body = rest
	}
}

// cutBare is ParseCut of the bare layout: a call object that the reply's end cuts
// short (the JSON stops inside it) is the open call.
func cutBare(text, argsKey string) (string, []Call, int) {
	content, calls := parseBare(text, argsKey)
	off := len(text) - len(strings.TrimLeft(text, " \t\r\n"))
	if n := leadLen(text[off:]); n > 0 {
		off += n
		off += len(text[off:]) - len(strings.TrimLeft(text[off:], " \t\r\n"))
	}
	if len(calls) > 0 || !strings.HasPrefix(text[off:], "{") {
		return content, calls, -1 // whole calls, or no call at all
	}
	calls = nil
	for {
		dec := json.NewDecoder(strings.NewReader(text[off:]))
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return "", calls, off // the reply ends inside this object
			}
			return text, nil, -1 // malformed: Parse's answer
		}
		c, ok := callFrom(string(raw), argsKey)
		if !ok {
			return text, nil, -1
		}
		calls = append(calls, c)
		off += int(dec.InputOffset())
		off += len(text[off:]) - len(strings.TrimLeft(text[off:], " \t\r\n;"))
		switch {
		case off == len(text):
			return "", calls, -1
		case text[off] != '{':
			return text, nil, -1 // what follows the calls is not a call: Parse's answer
		}
	}
}
