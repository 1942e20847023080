package api

import (
	"encoding/json"
	"strings"

	"github.com/conveyor-llm/conveyor/engine"
)

// chatLogprob is one entry of a chat choice's logprobs.content.
type chatLogprob struct {
	Token       string         `json:"token"`
	Logprob     jsonFloat      `json:"logprob"`
	Bytes       []int          `json:"bytes"`
	TopLogprobs []chatTopEntry `json:"top_logprobs"`
}

type chatTopEntry struct {
	Token   string    `json:"token"`
	Logprob jsonFloat `json:"logprob"`
	Bytes   []int     `json:"bytes"`
}

type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

func textBytes(s string) []int {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out
}

// tokenBytes is the "bytes" of a logprobs entry: the token's own bytes when tok can
// tell them, else the bytes of its display text.
func tokenBytes(tok Tokenizer, id int32, text string) []int {
	if tb, ok := tok.(TokenByter); ok {
		if b := tb.TokenBytes(id); b != nil {
			return textBytes(string(b))
		}
	}
	return textBytes(text)
}

// toChatLogprobs converts engine logprobs to the chat wire format.
func toChatLogprobs(tls []engine.TokenLogprob, tok Tokenizer) []chatLogprob {
	out := make([]chatLogprob, 0, len(tls))
	for _, t := range tls {
		e := chatLogprob{Token: t.Text, Logprob: jsonFloat(t.Logprob), Bytes: tokenBytes(tok, t.ID, t.Text), TopLogprobs: make([]chatTopEntry, 0, len(t.Top))}
		for _, a := range t.Top {
			e.TopLogprobs = append(e.TopLogprobs, chatTopEntry{Token: a.Text, Logprob: jsonFloat(a.Logprob), Bytes: tokenBytes(tok, a.ID, a.Text)})
		}
		out = append(out, e)
	}
	return out
}

type chatMessageOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	Message      *chatMessageOut `json:"message,omitempty"`
	Delta        *chatDelta      `json:"delta,omitempty"`
	Logprobs     *chatLogprobs   `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

// chatResponse is a chat.completion response or chat.completion.chunk.
type chatResponse struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Choices []chatChoice    `json:"choices"`
	Usage   json.RawMessage `json:"usage,omitempty"`
}

// chatAcc accumulates one chat choice.
type chatAcc struct {
	text     strings.Builder
	logprobs *chatLogprobs
	finish   engine.FinishReason
	started  bool
}

// chatOutput is the converter of /v1/chat/completions. Streamed, a choice opens with a
// delta {"role":"assistant","content":""}, carries its text in content deltas and ends
// with an empty delta and the finish reason.
type chatOutput struct {
	stream bool
	tok    Tokenizer
	wantLP bool
	base   chatResponse
	accs   []chatAcc
}

func newChatOutput(req *parsedChat, tok Tokenizer, base chatResponse) *chatOutput {
	o := &chatOutput{stream: req.stream, tok: tok, wantLP: req.params.Logprobs >= 0, base: base, accs: make([]chatAcc, req.params.N)}
	o.base.Object = "chat.completion"
	if req.stream {
		o.base.Object = "chat.completion.chunk"
		if req.includeUsage {
			o.base.Usage = nullJSON
		}
	}
	return o
}

func (o *chatOutput) add(_ int, ev *engine.Event) []any {
	a := &o.accs[ev.Index]
	if !o.stream {
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
		return nil
	}
	var chunks []any
	send := func(ch chatChoice) {
		chunk := o.base
		chunk.Choices = []chatChoice{ch}
		chunks = append(chunks, chunk)
	}
	if !a.started {
		a.started = true
		empty := ""
		send(chatChoice{Index: ev.Index, Delta: &chatDelta{Role: "assistant", Content: &empty}})
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

func (o *chatOutput) body(u usageJSON) any {
	resp := o.base
	for j := range o.accs {
		resp.Choices = append(resp.Choices, chatChoice{
			Index:        j,
			Message:      &chatMessageOut{Role: "assistant", Content: o.accs[j].text.String()},
			Logprobs:     o.accs[j].logprobs,
			FinishReason: finishReason(o.accs[j].finish),
		})
	}
	resp.Usage = rawJSON(u)
	return resp
}

func (o *chatOutput) usageChunk(u usageJSON) any {
	chunk := o.base
	chunk.Choices = []chatChoice{}
	chunk.Usage = rawJSON(u)
	return chunk
}
