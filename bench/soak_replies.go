package bench

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
)

// soakChoice is one choice's reply, assembled from a JSON body or from stream deltas.
type soakChoice struct {
	finish string
	text   string
	calls  []soakCall
}

type soakCall struct{ name, args string }

// judge checks the finished choices of a reply of kind k that asked for n choices.
func (c *soakClient) judge(k SoakKind, choices []soakChoice, n int) soakResult {
	if len(choices) != n {
		return fail(k, "choices", "%d choices, want %d", len(choices), n)
	}
	outcome := outcomeOK
	for i, ch := range choices {
		switch {
		case ch.finish == "length":
			outcome = outcomeTruncated
			continue
		case ch.finish == "":
			return fail(k, "no_finish", "choice %d has no finish_reason", i)
		}
		switch k {
		case SoakJSONSchema:
			if ch.finish != "stop" {
				return fail(k, "finish", "choice %d: finish_reason %q", i, ch.finish)
			}
			if err := validateJSON(c.schema, ch.text); err != nil {
				return fail(k, "schema", "choice %d: reply %.200q does not validate: %v", i, ch.text, err)
			}
		case SoakToolCall:
			if ch.finish != "tool_calls" || len(ch.calls) == 0 {
				return fail(k, "tool_calls", "choice %d: finish_reason %q with %d calls, content %.200q", i, ch.finish, len(ch.calls), ch.text)
			}
			for _, call := range ch.calls {
				v, ok := c.tools[call.name]
				if !ok {
					return fail(k, "tool_calls", "choice %d: call to unknown tool %q", i, call.name)
				}
				if err := validateJSON(v, call.args); err != nil {
					return fail(k, "tool_args", "choice %d: %s(%.200s) does not validate: %v", i, call.name, call.args, err)
				}
			}
		default:
			if ch.finish != "stop" {
				return fail(k, "finish", "choice %d: finish_reason %q", i, ch.finish)
			}
		}
	}
	return soakResult{kind: k, outcome: outcome}
}

// wireChoice covers a completion choice, a chat choice and a chat chunk's choice.
type wireChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	FinishReason *string `json:"finish_reason"`
	Message      *struct {
		Content   *string        `json:"content"`
		ToolCalls []wireToolCall `json:"tool_calls"`
	} `json:"message"`
	Delta *struct {
		Content   *string        `json:"content"`
		ToolCalls []wireToolCall `json:"tool_calls"`
	} `json:"delta"`
}

type wireToolCall struct {
	Index    int `json:"index"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type wireReply struct {
	Choices []wireChoice    `json:"choices"`
	Error   json.RawMessage `json:"error"`
}

func readSoakJSON(k SoakKind, body io.Reader, completion bool) ([]soakChoice, soakResult) {
	var rep wireReply
	if err := json.NewDecoder(body).Decode(&rep); err != nil {
		return nil, fail(k, "body", "decoding the reply: %v", err)
	}
	if rep.Error != nil {
		return nil, fail(k, "error", "200 with an error: %s", rep.Error)
	}
	out := make([]soakChoice, len(rep.Choices))
	for _, wc := range rep.Choices {
		if wc.Index < 0 || wc.Index >= len(out) {
			return nil, fail(k, "choices", "choice index %d of %d", wc.Index, len(out))
		}
		ch := &out[wc.Index]
		if wc.FinishReason != nil {
			ch.finish = *wc.FinishReason
		}
		if completion {
			ch.text = wc.Text
			continue
		}
		if wc.Message == nil {
			return nil, fail(k, "body", "chat choice %d has no message", wc.Index)
		}
		if wc.Message.Content != nil {
			ch.text = *wc.Message.Content
		}
		for _, tc := range wc.Message.ToolCalls {
			ch.calls = append(ch.calls, soakCall{name: tc.Function.Name, args: tc.Function.Arguments})
		}
	}
	return out, soakResult{}
}

// readSoakStream reads an SSE reply to its end. A stream is whole when every choice got a
// finish_reason and [DONE] came last; an "error" key in any chunk is an in-band error.
// With dropAfter > 0 the client hangs up after that many chunks (dropped reports it did).
func readSoakStream(k SoakKind, body io.Reader, dropAfter int) (choices []soakChoice, dropped bool, r soakResult) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), maxEventBytes)
	byIndex := map[int]*soakChoice{}
	chunks, done := 0, false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data:") {
			continue // blank separators, ": keep-alive" comments
		}
		data := strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		if done {
			return nil, false, fail(k, "after_done", "data after [DONE]: %.200s", data)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(data), &raw); err != nil {
			return nil, false, fail(k, "body", "chunk is not JSON: %.200s", data)
		}
		if e, ok := raw["error"]; ok {
			return nil, false, fail(k, "error", "in-band error: %s", e)
		}
		var chunk wireReply
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return nil, false, fail(k, "body", "chunk: %v", err)
		}
		for _, wc := range chunk.Choices {
			ch := byIndex[wc.Index]
			if ch == nil {
				ch = &soakChoice{}
				byIndex[wc.Index] = ch
			}
			if ch.finish != "" {
				return nil, false, fail(k, "after_finish", "choice %d: chunk after its finish_reason", wc.Index)
			}
			ch.text += wc.Text
			if d := wc.Delta; d != nil {
				if d.Content != nil {
					ch.text += *d.Content
				}
				for _, tc := range d.ToolCalls {
					for len(ch.calls) <= tc.Index {
						ch.calls = append(ch.calls, soakCall{})
					}
					ch.calls[tc.Index].name += tc.Function.Name
					ch.calls[tc.Index].args += tc.Function.Arguments
				}
			}
			if wc.FinishReason != nil {
				ch.finish = *wc.FinishReason
			}
		}
		chunks++
		if dropAfter > 0 && chunks >= dropAfter {
			return nil, true, soakResult{}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, false, fail(k, "cut_stream", "reading the stream after %d chunks: %v", chunks, err)
	}
	if !done {
		return nil, false, fail(k, "cut_stream", "stream ended after %d chunks without [DONE]", chunks)
	}
	choices = make([]soakChoice, len(byIndex))
	for i, ch := range byIndex {
		if i < 0 || i >= len(choices) {
			return nil, false, fail(k, "choices", "choice index %d of %d", i, len(byIndex))
		}
		choices[i] = *ch
	}
	return choices, false, soakResult{}
}
