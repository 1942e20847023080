package api

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/conveyor-llm/conveyor/engine"
	"github.com/gin-gonic/gin"
)

// chatRoles are the message roles the server accepts.
var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// chatRequest is a validated POST /v1/chat/completions body.
type chatRequest struct {
	common
	messages []Message
	prompt   []int32
}

// parseMessages reads messages: [{role, content: string | [{type:"text", text}]}].
func parseMessages(f *fields) []Message {
	elems, ok := f.array("messages")
	if f.err != nil {
		return nil
	}
	if !ok {
		f.fail(invalidParam("messages", "messages is required"))
		return nil
	}
	if len(elems) == 0 {
		f.fail(invalidParam("messages", "messages must not be empty"))
		return nil
	}
	out := make([]Message, 0, len(elems))
	for i, e := range elems {
		m, err := splitObject(e)
		if err != nil {
			f.fail(invalidParam("messages", "messages[%d] must be an object, got %s", i, jsonKind(e)))
			return nil
		}
		mf := &fields{m: m, prefix: fmt.Sprintf("messages[%d].", i)}
		role, ok := mf.string("role")
		if mf.err == nil && !ok {
			mf.fail(invalidParam(mf.pname("role"), "messages[%d].role is required", i))
		}
		if mf.err == nil && !chatRoles[role] {
			mf.fail(invalidParam(mf.pname("role"), "messages[%d].role %q is not one of system, developer, user, assistant, tool", i, role))
		}
		content := parseContent(mf, i, role)
		mf.string("name")
		if mf.err != nil {
			f.fail(mf.err)
			return nil
		}
		out = append(out, Message{Role: role, Content: content})
	}
	return out
}

// parseContent reads a message's content: a string or an array of text parts. Content may
// be absent only on assistant messages (which then carry tool calls the template ignores).
func parseContent(mf *fields, i int, role string) string {
	v := mf.raw("content")
	if mf.err != nil {
		return ""
	}
	name := mf.pname("content")
	if v == nil {
		if role != "assistant" {
			mf.fail(invalidParam(name, "%s is required", name))
		}
		return ""
	}
	switch jsonKind(v) {
	case "a string":
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			mf.fail(invalidParam(name, "%s is not a valid string", name))
		}
		return s
	case "an array":
	default:
		mf.fail(invalidParam(name, "%s must be a string or an array of content parts, got %s", name, jsonKind(v)))
		return ""
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(v, &parts); err != nil {
		mf.fail(invalidParam(name, "%s is not a valid array", name))
		return ""
	}
	var sb strings.Builder
	for k, p := range parts {
		pm, err := splitObject(p)
		if err != nil {
			mf.fail(invalidParam(name, "%s[%d] must be an object, got %s", name, k, jsonKind(p)))
			return ""
		}
		pf := &fields{m: pm, prefix: fmt.Sprintf("%s[%d].", name, k)}
		typ, _ := pf.string("type")
		if pf.err == nil && typ != "text" {
			if typ == "" {
				pf.fail(invalidParam(pf.pname("type"), "%s is required", pf.pname("type")))
			} else {
				pf.fail(unsupportedParam(pf.pname("type"), "content part type %q is not supported; only \"text\" parts are", typ))
			}
		}
		text, ok := pf.string("text")
		if pf.err == nil && !ok {
			pf.fail(invalidParam(pf.pname("text"), "%s is required", pf.pname("text")))
		}
		if pf.err != nil {
			mf.fail(pf.err)
			return ""
		}
		sb.WriteString(text)
	}
	return sb.String()
}

// parseChat validates a /v1/chat/completions body and renders its prompt.
func parseChat(f *fields, b *Backend) (*chatRequest, error) {
	r := &chatRequest{common: parseCommon(f, b, "max_tokens", "max_completion_tokens")}
	logprobs := f.bool("logprobs", false)
	top := f.int("top_logprobs", -1, 0, maxTopLogprob)
	addGen := f.bool("add_generation_prompt", true)
	r.messages = parseMessages(f)
	if f.err != nil {
		return nil, f.err
	}
	if r.params.MaxTokens == 0 {
		return nil, invalidParam("max_tokens", "max_tokens must be at least 1")
	}
	if top >= 0 && !logprobs {
		return nil, invalidParam("top_logprobs", "top_logprobs requires logprobs to be true")
	}
	if logprobs {
		r.params.Logprobs = max(int(top), 0)
	}
	ids, err := b.Tokenizer.EncodeChat(r.messages, addGen)
	if err != nil {
		return nil, invalidParam("messages", "the messages could not be rendered with the chat template: %v", err)
	}
	if len(ids) == 0 {
		return nil, invalidParam("messages", "the rendered messages have no tokens")
	}
	if err := checkPromptLen(b, len(ids), "messages", 0, false); err != nil {
		return nil, err
	}
	r.prompt = ids
	return r, nil
}

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

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      *chatMessage  `json:"message,omitempty"`
	Delta        *chatDelta    `json:"delta,omitempty"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
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

// handleChat serves POST /v1/chat/completions.
func (s *Server) handleChat(c *gin.Context) {
	b, err := s.ready()
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	f, err := readBody(c.Request)
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	req, err := parseChat(f, b)
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	if req.model != s.cfg.ModelName {
		writeError(c.Writer, modelNotFound(req.model))
		return
	}
	s.active.Add(1)
	defer s.active.Done()
	ctx := c.Request.Context()
	id := newID("chatcmpl-")
	c.Set(completionIDKey, id)
	jobs, err := s.submitAll(ctx, b, id, [][]int32{req.prompt}, req.params, "messages")
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	fn := &fan{s: s, jobs: jobs}
	base := chatResponse{ID: id, Created: time.Now().Unix(), Model: s.cfg.ModelName}
	if req.stream {
		base.Object = "chat.completion.chunk"
		s.streamChat(ctx, c, b, req, fn, base)
		return
	}
	base.Object = "chat.completion"
	s.collectChat(ctx, c, b, req, fn, base)
}

// chatAcc accumulates one chat choice.
type chatAcc struct {
	text     strings.Builder
	logprobs *chatLogprobs
	finish   engine.FinishReason
	started  bool
}

func (s *Server) collectChat(ctx context.Context, c *gin.Context, b *Backend, req *chatRequest, fn *fan, resp chatResponse) {
	n := req.params.N
	accs := make([]chatAcc, n)
	for {
		kind, _, ev := fn.next(ctx, nil)
		switch kind {
		case gotCancel:
			abortJobs(b, fn.jobs)
			if s.Draining() {
				writeError(c.Writer, fmt.Errorf("the server is shutting down: %w", engine.ErrClosed))
			}
			return
		case gotEvent:
			if isFailure(ev) || ev.Index < 0 || ev.Index >= n {
				abortJobs(b, fn.jobs)
				if !isFailure(ev) {
					ev.Err = fmt.Errorf("the engine sent sequence index %d of %d: %w", ev.Index, n, engine.ErrModel)
				}
				writeError(c.Writer, eventError(ev))
				return
			}
			a := &accs[ev.Index]
			a.text.WriteString(ev.Text)
			if req.params.Logprobs >= 0 {
				if a.logprobs == nil {
					a.logprobs = &chatLogprobs{Content: []chatLogprob{}}
				}
				a.logprobs.Content = append(a.logprobs.Content, toChatLogprobs(ev.Logprobs, b.Tokenizer)...)
			}
			if ev.FinishReason != "" {
				a.finish = ev.FinishReason
			}
			continue
		case gotEnd:
		}
		break
	}
	for j := range accs {
		resp.Choices = append(resp.Choices, chatChoice{
			Index:        j,
			Message:      &chatMessage{Role: "assistant", Content: accs[j].text.String()},
			Logprobs:     accs[j].logprobs,
			FinishReason: finishReason(accs[j].finish),
		})
	}
	resp.Usage = rawJSON(fn.usage())
	writeJSON(c.Writer, 200, resp)
}

func (s *Server) streamChat(ctx context.Context, c *gin.Context, b *Backend, req *chatRequest, fn *fan, base chatResponse) {
	n := req.params.N
	sse := newSSEWriter(c.Writer)
	if req.includeUsage {
		base.Usage = nullJSON
	}
	started := make([]bool, n)
	send := func(ch chatChoice) bool {
		chunk := base
		chunk.Choices = []chatChoice{ch}
		if sse.data(chunk) != nil {
			abortJobs(b, fn.jobs)
			return false
		}
		return true
	}
	tick := time.NewTicker(s.cfg.KeepAliveInterval)
	defer tick.Stop()
	for {
		kind, _, ev := fn.next(ctx, tick.C)
		if kind == gotEvent {
			tick.Reset(s.cfg.KeepAliveInterval) // keep-alives only fill silences
		}
		switch kind {
		case gotCancel:
			abortJobs(b, fn.jobs)
			if s.Draining() {
				sse.fail(fmt.Errorf("the server is shutting down: %w", engine.ErrClosed))
			}
			return
		case gotTick:
			if sse.keepAlive() != nil {
				abortJobs(b, fn.jobs)
				return
			}
			continue
		case gotEvent:
			if isFailure(ev) || ev.Index < 0 || ev.Index >= n {
				abortJobs(b, fn.jobs)
				if !isFailure(ev) {
					ev.Err = fmt.Errorf("the engine sent sequence index %d of %d: %w", ev.Index, n, engine.ErrModel)
				}
				sse.fail(eventError(ev))
				return
			}
			if !started[ev.Index] {
				started[ev.Index] = true
				empty := ""
				if !send(chatChoice{Index: ev.Index, Delta: &chatDelta{Role: "assistant", Content: &empty}}) {
					return
				}
			}
			var lp *chatLogprobs
			if req.params.Logprobs >= 0 && len(ev.Logprobs) > 0 {
				lp = &chatLogprobs{Content: toChatLogprobs(ev.Logprobs, b.Tokenizer)}
			}
			if ev.Text != "" || lp != nil {
				text := ev.Text
				if !send(chatChoice{Index: ev.Index, Delta: &chatDelta{Content: &text}, Logprobs: lp}) {
					return
				}
			}
			if ev.FinishReason != "" {
				if !send(chatChoice{Index: ev.Index, Delta: &chatDelta{}, FinishReason: finishReason(ev.FinishReason)}) {
					return
				}
			}
			continue
		case gotEnd:
		}
		break
	}
	if req.includeUsage {
		chunk := base
		chunk.Choices = []chatChoice{}
		chunk.Usage = rawJSON(fn.usage())
		if sse.data(chunk) != nil {
			return
		}
	}
	_ = sse.done()
}
