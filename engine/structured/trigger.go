package structured

import "bytes"

// Trigger is the text that opens a lazily constrained value in a reply that may also be
// prose (a tool call under tool_choice auto): the engine starts the constraint where it
// appears, and a streaming front end holds back text that may be its beginning. Both
// read it through these methods, so the rule is written once.
type Trigger struct {
	// Text opens the value ("<tool_call>", "[TOOL_CALLS]", "{"); "" never fires.
	Text string
	// AtStart: the value may open only the reply (after whitespace), as a bare JSON
	// call does; any other first byte makes the reply prose for good.
	AtStart bool
}

// Locate reports where the trigger opens in out, the reply so far: at >= 0 is the
// offset of its first byte. With at < 0, final tells that it can no longer appear
// (AtStart and the reply began as prose); otherwise it may still come.
func (t Trigger) Locate(out []byte) (at int, final bool) {
	if t.Text == "" {
		return -1, true
	}
	if t.AtStart {
		rest := bytes.TrimLeft(out, " \t\r\n")
		switch {
		case len(rest) == 0:
			return -1, false // only whitespace so far
		case bytes.HasPrefix(rest, []byte(t.Text)):
			return len(out) - len(rest), true
		case bytes.HasPrefix([]byte(t.Text), rest):
			return -1, false // a prefix of the trigger so far
		}
		return -1, true
	}
	if i := bytes.Index(out, []byte(t.Text)); i >= 0 {
		return i, true
	}
	return -1, false
}

// Scan is Locate plus safe: how many bytes of out are prose whatever follows —
// everything before the trigger, and before a tail that may be the trigger's beginning.
func (t Trigger) Scan(out []byte) (at int, final bool, safe int) {
	at, final = t.Locate(out)
	switch {
	case at >= 0 && t.AtStart:
		return at, final, 0 // the whitespace before a call that opens the reply is the call's
	case at >= 0:
		return at, final, at
	case final:
		return at, final, len(out)
	case t.AtStart:
		return at, final, 0 // whitespace, or the trigger's beginning, so far
	}
	for k := min(len(t.Text)-1, len(out)); k > 0; k-- {
		if bytes.HasSuffix(out, []byte(t.Text[:k])) {
			return at, final, len(out) - k
		}
	}
	return at, final, len(out)
}
