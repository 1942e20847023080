package engine

import (
	"slices"
	"strings"
)

// textStream is an incremental detokenizer (tokenizer.Stream satisfies it): Add
// returns the text completed by one more token, never a broken UTF-8 sequence, and
// Flush returns whatever is left at the end.
type textStream interface {
	Add(id int32) string
	Flush() string
}

// stopChecker decides when one sequence ends and which text it may release. It sits on
// top of the sequence's text stream:
//
//   - an eos id (unless IgnoreEOS) or a stop token id ends the sequence with "stop" once
//     MinTokens tokens exist; the token id is reported but its text is not (unless
//     IncludeStopStr);
//   - a stop string ends it with "stop"; everything after it is never released, nor is
//     the stop string itself unless IncludeStopStr. Stop strings are matched across
//     token boundaries: text whose end could still grow into a stop string is held back
//     until decided. Only text after the first MinTokens tokens is searched;
//   - MaxTokens generated tokens end it with "length", releasing the held text.
type stopChecker struct {
	stream    textStream // nil: token ids only, no text
	eos       []int32
	stopIDs   []int32
	stops     []string
	keepStop  bool // IncludeStopStr: the matched stop string is released too
	minTokens int
	maxTokens int

	held   string // text withheld because it may be the start of a stop string
	numOut int
	done   FinishReason
}

// newStopChecker returns the stop checker of one sequence. eos are the model's and
// tokenizer's end-of-sequence ids; stream may be nil when no text is produced.
func newStopChecker(p *SamplingParams, eos []int32, stream textStream) *stopChecker {
	c := &stopChecker{
		stream:    stream,
		stopIDs:   p.StopTokenIDs,
		keepStop:  p.IncludeStopStr,
		minTokens: p.MinTokens,
		maxTokens: p.MaxTokens,
	}
	if !p.IgnoreEOS {
		c.eos = eos
	}
	for _, s := range p.Stop {
		if s != "" {
			c.stops = append(c.stops, s)
		}
	}
	return c
}

// add appends one generated token and returns the text released by it and the finish
// reason ("" while the sequence goes on). It must not be called after a finish.
func (c *stopChecker) add(id int32) (text string, finish FinishReason) {
	c.numOut++
	if c.numOut > c.minTokens {
		if slices.Contains(c.eos, id) || slices.Contains(c.stopIDs, id) {
			// The stop token's own text is not released (unless IncludeStopStr, as vLLM
			// keeps it then: its text when special tokens are kept), but text completed
			// before it (and not a stop string) is.
			if c.keepStop && c.stream != nil {
				text = c.held + c.stream.Add(id) + c.stream.Flush()
				c.held = ""
			} else {
				text = c.finish()
			}
			c.done = FinishStop
			return text, FinishStop
		}
	}
	if c.stream != nil && c.numOut <= c.minTokens {
		// Before min_tokens nothing stops the sequence, stop strings included (as in
		// vLLM): the text goes straight out.
		text = c.stream.Add(id)
	} else if c.stream != nil {
		var stopped bool
		text, stopped = c.push(c.stream.Add(id))
		if stopped {
			c.done = FinishStop
			return text, FinishStop
		}
	}
	if c.numOut >= c.maxTokens {
		rest := c.finish()
		if c.done == FinishStop {
			return text + rest, FinishStop
		}
		c.done = FinishLength
		return text + rest, FinishLength
	}
	return text, ""
}

// finish flushes the stream and releases the held text, unless the flushed text
// completes a stop string (then c.done becomes FinishStop).
func (c *stopChecker) finish() string {
	if c.stream == nil {
		return ""
	}
	text, stopped := c.push(c.stream.Flush())
	if stopped {
		c.done = FinishStop
		return text
	}
	text += c.held
	c.held = ""
	return text
}

// push adds delta to the held text and returns the text that can be released: all of
// it up to the first complete stop string (stopped), or all but the longest suffix that
// is a proper prefix of some stop string.
func (c *stopChecker) push(delta string) (out string, stopped bool) {
	if len(c.stops) == 0 {
		return delta, false
	}
	buf := c.held + delta
	first, end := -1, -1
	for _, s := range c.stops {
		if i := strings.Index(buf, s); i >= 0 && (first < 0 || i < first) {
			first, end = i, i+len(s)
		}
	}
	if first >= 0 {
		c.held = ""
		if c.keepStop {
			return buf[:end], true
		}
		return buf[:first], true
	}
	keep := 0
	for _, s := range c.stops {
		// Longest k < len(s) with buf ending in s[:k]. A stop string is valid UTF-8,
		// so the cut always falls on a character boundary.
		for k := min(len(s)-1, len(buf)); k > keep; k-- {
			if strings.HasSuffix(buf, s[:k]) {
				keep = k
				break
			}
		}
	}
	c.held = buf[len(buf)-keep:]
	return buf[:len(buf)-keep], false
}
