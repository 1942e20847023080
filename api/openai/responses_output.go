package openai

import (
	"slices"
	"strings"

	"github.com/conveyor-llm/conveyor/engine"
)

// ResponseBuilder turns a response's generation into output items and, when a sink is
// set, into the stream's item events. It does not parse text itself: the chat
// endpoint's Converter (chatOutput, streaming) decides what is content and what is a
// tool call — the same formats, constraint and checks — and its deltas become items
// here: content deltas the text of one message item, each tool call a function_call
// item with its arguments.
type ResponseBuilder struct {
	chat  *chatOutput
	items []ResponseItem
	texts []*strings.Builder // per item: a message's text
	// msg is the index of the open message item, call of the open function_call item
	// (-1: none).
	msg, call int
	finish    engine.FinishReason
	// emit sends one event (the sequence number is the sink's); nil when not streaming.
	emit func(ResponseEvent)
}

// NewResponseBuilder returns the builder of a /v1/responses request's output; rejected
// is as NewChatOutput's, and emit, when not nil, receives the stream's events (their
// sequence numbers are the caller's).
func NewResponseBuilder(req *ParsedResponses, tok Tokenizer, rejected func(string), emit func(ResponseEvent)) *ResponseBuilder {
	g := req.Generation
	g.Stream, g.IncludeUsage = true, false
	pc := &ParsedChat{Generation: g, tools: req.tools}
	return &ResponseBuilder{chat: newChatOutput(pc, tok, "", 0, "", rejected), msg: -1, call: -1, emit: emit}
}

func ptr[T any](v T) *T { return &v }

func (r *ResponseBuilder) send(ev ResponseEvent) {
	if r.emit != nil {
		r.emit(ev)
	}
}

// Add takes one engine event.
func (r *ResponseBuilder) Add(ev *engine.Event) {
	if ev.FinishReason != "" {
		r.finish = ev.FinishReason
	}
	for _, chunk := range r.chat.Add(0, ev) {
		for _, ch := range chunk.(chatResponse).Choices {
			r.delta(ch)
		}
	}
}

// delta applies one chat delta.
func (r *ResponseBuilder) delta(ch chatChoice) {
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
			r.items = append(r.items, ResponseItem{Type: "function_call", ID: NewID("fc_"), Status: StatusInProgress,
				CallID: tc.ID, Name: tc.Function.Name, Arguments: &args})
			r.texts = append(r.texts, nil)
			r.call = len(r.items) - 1
			it := r.items[r.call]
			r.send(ResponseEvent{Type: "response.output_item.added", OutputIndex: ptr(r.call), Item: &it})
		}
		if a := tc.Function.Arguments; a != "" && r.call >= 0 {
			it := &r.items[r.call]
			*it.Arguments += a
			r.send(ResponseEvent{Type: "response.function_call_arguments.delta", ItemID: it.ID, OutputIndex: ptr(r.call), Delta: &a})
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
func (r *ResponseBuilder) text(s string) {
	if r.msg < 0 {
		r.closeCall()
		r.items = append(r.items, ResponseItem{Type: "message", ID: NewID("msg_"), Status: StatusInProgress, Role: "assistant", Content: []ResponseContent{}})
		r.texts = append(r.texts, &strings.Builder{})
		r.msg = len(r.items) - 1
		it := r.items[r.msg]
		r.send(ResponseEvent{Type: "response.output_item.added", OutputIndex: ptr(r.msg), Item: &it})
		part := outputText("")
		r.send(ResponseEvent{Type: "response.content_part.added", ItemID: it.ID, OutputIndex: ptr(r.msg), ContentIndex: ptr(0), Part: &part})
	}
	r.texts[r.msg].WriteString(s)
	r.send(ResponseEvent{Type: "response.output_text.delta", ItemID: r.items[r.msg].ID, OutputIndex: ptr(r.msg), ContentIndex: ptr(0),
		Delta: &s, Logprobs: emptyArray})
}

// itemStatus is the status of a finished item: incomplete when the output was cut.
func (r *ResponseBuilder) itemStatus() string {
	if r.finish == engine.FinishLength {
		return StatusIncomplete
	}
	return StatusCompleted
}

func (r *ResponseBuilder) closeMessage() {
	if r.msg < 0 {
		return
	}
	i := r.msg
	r.msg = -1
	it := &r.items[i]
	text := r.texts[i].String()
	part := outputText(text)
	it.Content = []ResponseContent{part}
	it.Status = r.itemStatus()
	r.send(ResponseEvent{Type: "response.output_text.done", ItemID: it.ID, OutputIndex: ptr(i), ContentIndex: ptr(0), Text: &text, Logprobs: emptyArray})
	r.send(ResponseEvent{Type: "response.content_part.done", ItemID: it.ID, OutputIndex: ptr(i), ContentIndex: ptr(0), Part: &part})
	done := *it
	r.send(ResponseEvent{Type: "response.output_item.done", OutputIndex: ptr(i), Item: &done})
}

func (r *ResponseBuilder) closeCall() {
	if r.call < 0 {
		return
	}
	i := r.call
	r.call = -1
	it := &r.items[i]
	it.Status = r.itemStatus()
	args := *it.Arguments
	r.send(ResponseEvent{Type: "response.function_call_arguments.done", ItemID: it.ID, OutputIndex: ptr(i), Arguments: &args, Name: it.Name})
	done := *it
	done.Arguments = &args
	r.send(ResponseEvent{Type: "response.output_item.done", OutputIndex: ptr(i), Item: &done})
}

// dropCall ends the open function_call item as the call the output's end cut short: a
// stream has announced it, so its done events still go out (status incomplete), but it
// is no call and the response's output leaves it out.
func (r *ResponseBuilder) dropCall() {
	i := r.call
	if i < 0 {
		return
	}
	r.closeCall()
	r.items = slices.Delete(r.items, i, i+1)
	r.texts = slices.Delete(r.texts, i, i+1)
}

// Finish closes what is open and fills in the response's output, output_text, status
// and usage from the finished generation.
func (r *ResponseBuilder) Finish(resp *Response, u Usage, now int64) {
	r.closeMessage()
	r.closeCall()
	resp.Output = append([]ResponseItem{}, r.items...)
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
	resp.Status = StatusCompleted
	if r.finish == engine.FinishLength {
		resp.Status = StatusIncomplete
		resp.IncompleteDetails = &IncompleteDetails{Reason: "max_output_tokens"}
	} else {
		resp.CompletedAt = &now
	}
}

// toResponseUsage converts the chat usage to the Responses API's.
func toResponseUsage(u Usage) *ResponseUsage {
	out := &ResponseUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	out.InputTokensDetails.CachedTokens = u.cached
	return out
}
