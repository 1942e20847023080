package openai

import (
	"strings"

	"github.com/conveyor-llm/conveyor/engine"
)

type chatMessageOut struct {
	Role      string        `json:"role"`
	Content   *string       `json:"content"` // null when the reply is only tool calls
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

type chatDelta struct {
	Role      string        `json:"role,omitempty"`
	Content   *string       `json:"content,omitempty"`
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Message      *chatMessageOut `json:"message,omitempty"`
	Delta        *chatDelta      `json:"delta,omitempty"`
	Logprobs     *chatLogprobs   `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

// chatResponse is a chat.completion response or chat.completion.chunk.
type chatResponse = envelope[chatChoice]

// chatAcc accumulates one chat choice.
type chatAcc struct {
	text     strings.Builder
	logprobs *chatLogprobs
	finish   engine.FinishReason
	started  bool

	// Streaming with tool_choice auto: sent is how much of text went out as content,
	// inCall that a call has opened (the rest is held until the reply ends).
	sent   int
	inCall bool
	prose  bool // no call can open any more: the rest is content

	// checked records that the reply's calls were checked (and a rejection counted).
	checked bool
	// cutSent: the reply ended inside a call whose id and name (and some arguments)
	// had already been streamed; the stream ends with finish_reason "length".
	cutSent bool
	// calls streams the arguments of constrained calls as they are generated (nil when
	// the reply is held until it ends); callsFrom is where the calls begin in text.
	calls     *callStream
	callsFrom int
}

// chatOutput is the Converter of /v1/chat/completions. Streamed, a choice opens with a
// delta {"role":"assistant","content":""}, carries its text in content deltas and ends
// with an empty delta and the finish reason.
//
// With tools, a choice's text is held back until it finishes: then the calls found in it
// (in the request's tool-call format) become message.tool_calls — streamed as OpenAI
// does, each call's id and name first, then its arguments — with finish_reason
// "tool_calls"; text outside the calls (or a reply without calls) is the content. A reply
// cut short (max_tokens, the context) inside a call keeps finish_reason "length": the
// calls completed before the cut are calls, the cut one is neither a call nor content.
type chatOutput struct {
	stream bool
	tok    Tokenizer
	wantLP bool
	base   chatResponse
	accs   []chatAcc
	tools  *toolPlan
	// rejected counts replies whose calls failed their tools' schemas; nil in tests
	// that need no metrics.
	rejected func(reason string)
}

// NewChatOutput is the converter of a /v1/chat/completions request answered as the
// chat.completion id, created and served under model; rejected, when not nil, counts the
// replies whose tool calls failed their check, by reason (RejectUnknownTool,
// RejectInvalidArguments).
func NewChatOutput(req *ParsedChat, tok Tokenizer, id string, created int64, model string, rejected func(reason string)) Converter {
	return newChatOutput(req, tok, id, created, model, rejected)
}

func newChatOutput(req *ParsedChat, tok Tokenizer, id string, created int64, model string, rejected func(reason string)) *chatOutput {
	object := "chat.completion"
	if req.Stream {
		object = "chat.completion.chunk"
	}
	base := newEnvelope[chatChoice](id, object, created, model, req.Stream && req.IncludeUsage)
	return &chatOutput{stream: req.Stream, tok: tok, wantLP: req.Params.Logprobs >= 0, base: base, accs: make([]chatAcc, req.Params.N), tools: req.tools, rejected: rejected}
}

func (o *chatOutput) Add(_ int, ev *engine.Event) []any {
	a := &o.accs[ev.Index]
	if !o.stream || o.tools != nil {
		a.text.WriteString(ev.Text)
		if o.wantLP {
			if a.logprobs == nil {
				a.logprobs = &chatLogprobs{Content: []chatLogprob{}}
			}
			a.logprobs.Content = append(a.logprobs.Content, toChatLogprobs(ev.Logprobs, o.tok)...)
		}
		if ev.FinishReason != "" {
			a.finish = ev.FinishReason
		}
		if o.stream && o.tools.choice == "auto" {
			return o.streamAuto(ev)
		}
		if o.stream && o.tools.streamArgs {
			return o.streamCalls(ev)
		}
		if o.stream && ev.FinishReason != "" {
			return o.finishTools(ev.Index)
		}
		return nil
	}
	var chunks []any
	send := func(ch chatChoice) { chunks = append(chunks, o.chunk(ch)) }
	if !a.started {
		a.started = true
		send(openingDelta(ev.Index))
	}
	var lp *chatLogprobs
	if o.wantLP && len(ev.Logprobs) > 0 {
		lp = &chatLogprobs{Content: toChatLogprobs(ev.Logprobs, o.tok)}
	}
	if ev.Text != "" || lp != nil {
		text := ev.Text
		send(chatChoice{Index: ev.Index, Delta: &chatDelta{Content: &text}, Logprobs: lp})
	}
	if ev.FinishReason != "" {
		send(chatChoice{Index: ev.Index, Delta: &chatDelta{}, FinishReason: finishReason(ev.FinishReason)})
	}
	return chunks
}

func (o *chatOutput) Body(u Usage) any {
	var choices []chatChoice
	for j := range o.accs {
		text := o.accs[j].text.String()
		msg := &chatMessageOut{Role: "assistant", Content: &text}
		finish := finishReason(o.accs[j].finish)
		if o.tools != nil {
			rc := o.calls(j)
			msg.Content = &rc.content
			if len(rc.calls) > 0 {
				msg.ToolCalls = rc.calls
				if rc.content == "" {
					msg.Content = nil
				}
				if !rc.cut {
					finish = toolCallsFinish()
				}
			}
		}
		choices = append(choices, chatChoice{
			Index:        j,
			Message:      msg,
			Logprobs:     o.accs[j].logprobs,
			FinishReason: finish,
		})
	}
	return o.base.final(choices, u)
}

func (o *chatOutput) UsageChunk(u Usage) any {
	return o.base.final([]chatChoice{}, u)
}

// calls returns choice j's content and the tool calls its finished text holds (the
// request has tools; see toolPlan.reply), counting a rejection once per reply.
func (o *chatOutput) calls(j int) replyCalls {
	a := &o.accs[j]
	rc, reason := o.tools.reply(a.text.String(), a.finish == engine.FinishLength)
	if reason != "" && !a.checked && o.rejected != nil {
		o.rejected(reason)
	}
	a.checked = true
	return rc
}

// finishTools streams choice j's held-back reply once it finished: its opening delta,
// its content, its tool calls (id and name, then the arguments) and the finish reason.
func (o *chatOutput) finishTools(j int) []any {
	a := &o.accs[j]
	var chunks []any
	send := func(ch chatChoice) { chunks = append(chunks, o.chunk(ch)) }
	send(openingDelta(j))
	rc := o.calls(j)
	if rc.content != "" || a.logprobs != nil {
		send(chatChoice{Index: j, Delta: &chatDelta{Content: &rc.content}, Logprobs: a.logprobs})
	}
	for _, ch := range callDeltas(j, rc.calls) {
		send(ch)
	}
	finish := finishReason(a.finish)
	if len(rc.calls) > 0 && !rc.cut {
		finish = toolCallsFinish()
	}
	send(chatChoice{Index: j, Delta: &chatDelta{}, FinishReason: finish})
	return chunks
}

// streamCalls streams a required or named reply whose calls the constraint fully
// enforces: each call's name as soon as it is complete, then its arguments as they come.
func (o *chatOutput) streamCalls(ev *engine.Event) []any {
	a := &o.accs[ev.Index]
	var chunks []any
	send := func(ch chatChoice) { chunks = append(chunks, o.chunk(ch)) }
	if !a.started {
		a.started = true
		a.calls = &callStream{}
		send(openingDelta(ev.Index))
	}
	for _, ch := range a.calls.advance(ev.Index, a.text.String()) {
		send(ch)
	}
	if ev.FinishReason == "" {
		return chunks
	}
	finish := finishReason(a.finish)
	switch rc := o.calls(ev.Index); {
	case rc.cut:
		// What went out of the cut call cannot be taken back: "length" says to drop it.
		a.cutSent = len(a.calls.calls) > len(rc.calls)
	case len(rc.calls) > 0:
		finish = toolCallsFinish()
	case len(a.calls.calls) == 0 && rc.content != "":
		send(chatChoice{Index: ev.Index, Delta: &chatDelta{Content: &rc.content}})
	}
	send(chatChoice{Index: ev.Index, Delta: &chatDelta{}, FinishReason: finish})
	return chunks
}

func toolCallsFinish() *string {
	s := "tool_calls"
	return &s
}

// streamAuto streams a tool_choice auto reply: prose goes out as content deltas as it
// comes, except text that may be the opening of a call (the format's trigger, or a
// prefix of it at the end), which is held; once a call opens, the rest is held until
// the reply ends and then sent as tool calls (or as content when it holds none).
func (o *chatOutput) streamAuto(ev *engine.Event) []any {
	a := &o.accs[ev.Index]
	var chunks []any
	send := func(ch chatChoice) { chunks = append(chunks, o.chunk(ch)) }
	if !a.started {
		a.started = true
		send(openingDelta(ev.Index))
	}
	text := a.text.String()
	if !a.inCall {
		// Only the text not sent yet is scanned: what went out is prose and ends with no
		// beginning of the trigger.
		pending := text[a.sent:]
		safe := len(pending)
		if !a.prose {
			var at int
			var final bool
			at, final, safe = o.tools.format.Trigger.Scan([]byte(pending))
			a.inCall, a.prose = at >= 0, at < 0 && final
		}
		if safe > 0 {
			out := pending[:safe]
			a.sent += safe
			send(chatChoice{Index: ev.Index, Delta: &chatDelta{Content: &out}})
		}
	}
	if a.inCall && o.tools.streamArgs {
		if a.calls == nil {
			a.calls, a.callsFrom = &callStream{}, a.sent
		}
		for _, ch := range a.calls.advance(ev.Index, text[a.callsFrom:]) {
			send(ch)
		}
	}
	if ev.FinishReason == "" {
		return chunks
	}
	finish := finishReason(a.finish)
	switch rc := o.calls(ev.Index); {
	case a.calls != nil && len(a.calls.calls) > 0: // the calls went out as they came
		if rc.cut {
			a.cutSent = len(a.calls.calls) > len(rc.calls)
		} else if len(rc.calls) > 0 {
			finish = toolCallsFinish()
		}
	case a.inCall && len(rc.calls) > 0: // the calls were held
		for _, ch := range callDeltas(ev.Index, rc.calls) {
			send(ch)
		}
		if !rc.cut {
			finish = toolCallsFinish()
		}
	case rc.cut:
		// The held text is the opening of the cut call: neither a call nor content.
	default:
		if rest := text[a.sent:]; rest != "" {
			send(chatChoice{Index: ev.Index, Delta: &chatDelta{Content: &rest}})
		}
	}
	send(chatChoice{Index: ev.Index, Delta: &chatDelta{}, FinishReason: finish})
	return chunks
}

// chunk is a chat.completion.chunk carrying one choice.
func (o *chatOutput) chunk(ch chatChoice) chatResponse { return o.base.chunk(ch) }

// openingDelta opens a streamed choice: {"role":"assistant","content":""}.
func openingDelta(index int) chatChoice {
	empty := ""
	return chatChoice{Index: index, Delta: &chatDelta{Role: "assistant", Content: &empty}}
}

// callDeltas streams tool calls as OpenAI does: each call's index, id, type and name,
// then its arguments.
func callDeltas(index int, calls []toolCallOut) []chatChoice {
	var out []chatChoice
	for i, c := range calls {
		i := i
		out = append(out,
			chatChoice{Index: index, Delta: &chatDelta{ToolCalls: []toolCallOut{{Index: &i, ID: c.ID, Type: "function",
				Function: toolCallFunction{Name: c.Function.Name, Arguments: ""}}}}},
			chatChoice{Index: index, Delta: &chatDelta{ToolCalls: []toolCallOut{{Index: &i, Function: toolCallFunction{Arguments: c.Function.Arguments}}}}})
	}
	return out
}
