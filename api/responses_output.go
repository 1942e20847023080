package api

import (
	"slices"
	"strings"

	"github.com/conveyor-llm/conveyor/engine"
)

// responseBuilder turns a response's generation into output items and, when a sink is
// set, into the stream's item events. It does not parse text itself: the chat
// endpoint's converter (chatOutput, streaming) decides what is content and what is a
// tool call — the same formats, constraint and checks — and its deltas become items
// here: content deltas the text of one message item, each tool call a function_call
// item with its arguments.
type responseBuilder struct {
	chat  *chatOutput
	items []respItem
	texts []*strings.Builder // per item: a message's text
	// msg is the index of the open message item, call of the open function_call item
	// (-1: none).
	msg, call int
	finish    engine.FinishReason
	// emit sends one event (the sequence number is the sink's); nil when not streaming.
	emit func(responseEvent)
}

func newResponseBuilder(req *parsedResponses, tok Tokenizer, rejected func(string), emit func(responseEvent)) *responseBuilder {
	g := req.generation
	g.stream, g.includeUsage = true, false
	pc := &parsedChat{generation: g, tools: req.tools}
	return &responseBuilder{chat: newChatOutput(pc, tok, "", 0, "", rejected), msg: -1, call: -1, emit: emit}
}

func ptr[T any](v T) *T { return &v }

func (r *responseBuilder) send(ev responseEvent) {
	if r.emit != nil {
		r.emit(ev)
	}
}

// add takes one engine event.
func (r *responseBuilder) add(ev *engine.Event) {
	if ev.FinishReason != "" {
		r.finish = ev.FinishReason
	}
	for _, chunk := range r.chat.add(0, ev) {
		for _, ch := range chunk.(chatResponse).Choices {
			r.delta(ch)
		}
	}
}

// delta applies one chat delta.
func (r *responseBuilder) delta(ch chatChoice) {
	d := ch.Delta
	if d == nil {
		return
	}
	if d.Content != nil && *d.Content != "" {
		r.text(*d.Content)
	}
	for _, tc := range d.ToolCalls {
		if tc.ID != "" {
			r.closeMessage()
			r.closeCall()
			args := ""
			r.items = append(r.items, respItem{Type: "function_call", ID: newID("fc_"), Status: statusInProgress,
				CallID: tc.ID, Name: tc.Function.Name, Arguments: &args})
			r.texts = append(r.texts, nil)
			r.call = len(r.items) - 1
			it := r.items[r.call]
			r.send(responseEvent{Type: "response.output_item.added", OutputIndex: ptr(r.call), Item: &it})
		}
		if a := tc.Function.Arguments; a != "" && r.call >= 0 {
			it := &r.items[r.call]
			*it.Arguments += a
			r.send(responseEvent{Type: "response.function_call_arguments.delta", ItemID: it.ID, OutputIndex: ptr(r.call), Delta: &a})
		}
	}
	if ch.FinishReason != nil {
		r.closeMessage()
		if r.chat.accs[0].cutSent {
			r.dropCall()
		}
		r.closeCall()
	}
}

// text appends generated text to the open message item, opening one when needed.
func (r *responseBuilder) text(s string) {
	if r.msg < 0 {
		r.closeCall()
		r.items = append(r.items, respItem{Type: "message", ID: newID("msg_"), Status: statusInProgress, Role: "assistant", Content: []respContent{}})
		r.texts = append(r.texts, &strings.Builder{})
		r.msg = len(r.items) - 1
		it := r.items[r.msg]
		r.send(responseEvent{Type: "response.output_item.added", OutputIndex: ptr(r.msg), Item: &it})
		part := outputText("")
		r.send(responseEvent{Type: "response.content_part.added", ItemID: it.ID, OutputIndex: ptr(r.msg), ContentIndex: ptr(0), Part: &part})
	}
	r.texts[r.msg].WriteString(s)
	r.send(responseEvent{Type: "response.output_text.delta", ItemID: r.items[r.msg].ID, OutputIndex: ptr(r.msg), ContentIndex: ptr(0),
		Delta: &s, Logprobs: emptyArray})
}

// itemStatus is the status of a finished item: incomplete when the output was cut.
func (r *responseBuilder) itemStatus() string {
	if r.finish == engine.FinishLength {
		return statusIncomplete
	}
	return statusCompleted
}

func (r *responseBuilder) closeMessage() {
	if r.msg < 0 {
		return
	}
	i := r.msg
	r.msg = -1
	it := &r.items[i]
	text := r.texts[i].String()
	part := outputText(text)
	it.Content = []respContent{part}
	it.Status = r.itemStatus()
	r.send(responseEvent{Type: "response.output_text.done", ItemID: it.ID, OutputIndex: ptr(i), ContentIndex: ptr(0), Text: &text, Logprobs: emptyArray})
	r.send(responseEvent{Type: "response.content_part.done", ItemID: it.ID, OutputIndex: ptr(i), ContentIndex: ptr(0), Part: &part})
	done := *it
	r.send(responseEvent{Type: "response.output_item.done", OutputIndex: ptr(i), Item: &done})
}

func (r *responseBuilder) closeCall() {
	if r.call < 0 {
		return
	}
	i := r.call
	r.call = -1
	it := &r.items[i]
	it.Status = r.itemStatus()
	args := *it.Arguments
	r.send(responseEvent{Type: "response.function_call_arguments.done", ItemID: it.ID, OutputIndex: ptr(i), Arguments: &args, Name: it.Name})
	done := *it
	done.Arguments = &args
	r.send(responseEvent{Type: "response.output_item.done", OutputIndex: ptr(i), Item: &done})
}

// dropCall ends the open function_call item as the call the output's end cut short: a
// stream has announced it, so its done events still go out (status incomplete), but it
// is no call and the response's output leaves it out.
func (r *responseBuilder) dropCall() {
	i := r.call
	if i < 0 {
		return
	}
	r.closeCall()
	r.items = slices.Delete(r.items, i, i+1)
	r.texts = slices.Delete(r.texts, i, i+1)
}

// finishOutput closes what is open and fills in the response's output, output_text,
// status and usage from the finished generation.
func (r *responseBuilder) finishOutput(resp *responseObject, u usageJSON, now int64) {
	r.closeMessage()
	r.closeCall()
	resp.Output = append([]respItem{}, r.items...)
	var sb strings.Builder
	for _, it := range r.items {
		for _, p := range it.Content {
			if p.Type == "output_text" {
				sb.WriteString(p.Text)
			}
		}
	}
	resp.OutputText = sb.String()
	resp.Usage = toResponseUsage(u)
	resp.Status = statusCompleted
	if r.finish == engine.FinishLength {
		resp.Status = statusIncomplete
		resp.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
	} else {
		resp.CompletedAt = &now
	}
}

// toResponseUsage converts the chat usage to the Responses API's.
func toResponseUsage(u usageJSON) *responseUsage {
	out := &responseUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	out.InputTokensDetails.CachedTokens = u.cached
	return out
}
