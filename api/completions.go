package api

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/conveyor-llm/conveyor/engine"
	"github.com/gin-gonic/gin"
)

// maxTotalSeqs caps prompts × best_of in one request.
const maxTotalSeqs = 1024

// prompt is one parsed prompt: its token ids and the text echo returns.
type prompt struct {
	tokens []int32
	text   string
}

// completionRequest is a validated POST /v1/completions body.
type completionRequest struct {
	common
	prompts []prompt
	n       int // choices per prompt returned
	bestOf  int // sequences per prompt generated (>= n)
	echo    bool
	// promptOnly is echo with max_tokens 0: the prompt (and its logprobs) come back and
	// nothing is generated. The engine always generates, so one token is asked for and dropped.
	promptOnly bool
}

// parseCompletion validates a /v1/completions body.
func parseCompletion(f *fields, b *Backend) (*completionRequest, error) {
	r := &completionRequest{common: parseCommon(f, b, "max_tokens")}
	r.echo = f.bool("echo", false)
	lp := f.int("logprobs", -1, 0, maxLogprobs)
	if s, ok := f.string("suffix"); ok && s != "" {
		f.fail(unsupportedParam("suffix", "suffix is not supported"))
	}
	r.n = r.params.N
	r.bestOf = int(f.int("best_of", int64(r.n), 1, maxN))
	if f.err != nil {
		return nil, f.err
	}
	if r.bestOf < r.n {
		return nil, invalidParam("best_of", "best_of (%d) must be greater than or equal to n (%d)", r.bestOf, r.n)
	}
	if r.stream && r.bestOf > r.n {
		return nil, invalidParam("best_of", "best_of > n cannot be streamed")
	}
	if r.params.MaxTokens == 0 {
		if !r.echo {
			return nil, invalidParam("max_tokens", "max_tokens must be at least 1 (0 is allowed only with echo)")
		}
		r.promptOnly = true
		r.params.MaxTokens = 1
		r.params.MinTokens = 0
		r.params.Stop = nil
	}
	r.params.Logprobs = int(lp)
	if r.echo && lp >= 0 {
		r.params.PromptLogprobs = int(lp)
	}
	// best_of has one owner, the engine: it generates best_of sequences and sends back
	// the n with the highest cumulative logprob, best first, as indexes 0..n-1.
	r.params.N, r.params.BestOf = r.n, r.bestOf
	prompts, err := parsePrompt(f, b)
	if err != nil {
		return nil, err
	}
	if len(prompts)*r.bestOf > maxTotalSeqs {
		return nil, invalidParam("prompt", "%d prompts × %d sequences exceeds the limit of %d sequences per request", len(prompts), r.bestOf, maxTotalSeqs)
	}
	for i, p := range prompts {
		if err := checkPromptLen(b, len(p.tokens), "prompt", i, len(prompts) > 1); err != nil {
			return nil, err
		}
	}
	r.prompts = prompts
	return r, nil
}

// checkPromptLen rejects a prompt that leaves no room for a completion.
func checkPromptLen(b *Backend, n int, param string, i int, several bool) error {
	if b.MaxModelLen <= 0 || n < b.MaxModelLen {
		return nil
	}
	which := "the prompt"
	if several {
		which = fmt.Sprintf("prompt %d", i)
	}
	return &paramError{param: param, kind: engine.ErrPromptTooLong, msg: fmt.Sprintf(
		"this model's maximum context length is %d tokens, but %s has %d tokens; it must be at most %d tokens to leave room for at least one completion token",
		b.MaxModelLen, which, n, b.MaxModelLen-1)}
}

// parsePrompt reads prompt: a string, an array of strings, an array of token ids, or an
// array of token-id arrays.
func parsePrompt(f *fields, b *Backend) ([]prompt, error) {
	v := f.raw("prompt")
	if f.err != nil {
		return nil, f.err
	}
	if v == nil {
		return nil, invalidParam("prompt", "prompt is required")
	}
	encode := func(s string, i int) (prompt, error) {
		if s == "" {
			return prompt{}, invalidParam("prompt", "prompt must not be empty")
		}
		ids, err := b.Tokenizer.Encode(s, true)
		if err != nil {
			return prompt{}, invalidParam("prompt", "prompt %d could not be tokenized: %v", i, err)
		}
		if len(ids) == 0 {
			return prompt{}, invalidParam("prompt", "prompt %d has no tokens", i)
		}
		return prompt{tokens: ids, text: s}, nil
	}
	fromIDs := func(ids []int32) prompt {
		return prompt{tokens: ids, text: b.Tokenizer.Decode(ids, false)}
	}
	switch jsonKind(v) {
	case "a string":
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, invalidParam("prompt", "prompt is not a valid string")
		}
		p, err := encode(s, 0)
		if err != nil {
			return nil, err
		}
		return []prompt{p}, nil
	case "an array":
	default:
		return nil, invalidParam("prompt", "prompt must be a string, an array of strings, an array of token ids or an array of token-id arrays, got %s", jsonKind(v))
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(v, &elems); err != nil {
		return nil, invalidParam("prompt", "prompt is not a valid array")
	}
	if len(elems) == 0 {
		return nil, invalidParam("prompt", "prompt must not be empty")
	}
	switch jsonKind(elems[0]) {
	case "a string":
		out := make([]prompt, len(elems))
		for i, e := range elems {
			var s string
			if jsonKind(e) != "a string" || json.Unmarshal(e, &s) != nil {
				return nil, invalidParam("prompt", "prompt[%d] must be a string like the first element, got %s", i, jsonKind(e))
			}
			p, err := encode(s, i)
			if err != nil {
				return nil, err
			}
			out[i] = p
		}
		return out, nil
	case "a number":
		ids, err := tokenIDs("prompt", elems, b.vocab())
		if err != nil {
			return nil, err
		}
		return []prompt{fromIDs(ids)}, nil
	case "an array":
		out := make([]prompt, len(elems))
		for i, e := range elems {
			var inner []json.RawMessage
			if jsonKind(e) != "an array" || json.Unmarshal(e, &inner) != nil {
				return nil, invalidParam("prompt", "prompt[%d] must be an array of token ids like the first element, got %s", i, jsonKind(e))
			}
			if len(inner) == 0 {
				return nil, invalidParam("prompt", "prompt[%d] must not be empty", i)
			}
			ids, err := tokenIDs(fmt.Sprintf("prompt[%d]", i), inner, b.vocab())
			if err != nil {
				err.(*paramError).param = "prompt"
				return nil, err
			}
			out[i] = fromIDs(ids)
		}
		return out, nil
	}
	return nil, invalidParam("prompt", "prompt[0] must be a string, a token id or an array of token ids, got %s", jsonKind(elems[0]))
}

// completionLogprobs is the logprobs object of a completion choice.
type completionLogprobs struct {
	Tokens        []string               `json:"tokens"`
	TokenLogprobs []jsonFloat            `json:"token_logprobs"`
	TopLogprobs   []map[string]jsonFloat `json:"top_logprobs"`
	TextOffset    []int                  `json:"text_offset"`
}

// add appends token logprobs; offset is the running text offset (in characters).
func (l *completionLogprobs) add(tls []engine.TokenLogprob, offset *int) {
	for _, t := range tls {
		l.Tokens = append(l.Tokens, t.Text)
		l.TokenLogprobs = append(l.TokenLogprobs, jsonFloat(t.Logprob))
		var top map[string]jsonFloat
		if !isNaN32(t.Logprob) {
			top = make(map[string]jsonFloat, len(t.Top)+1)
			for _, a := range t.Top {
				top[a.Text] = jsonFloat(a.Logprob)
			}
			top[t.Text] = jsonFloat(t.Logprob)
		}
		l.TopLogprobs = append(l.TopLogprobs, top)
		l.TextOffset = append(l.TextOffset, *offset)
		*offset += utf8.RuneCountInString(t.Text)
	}
}

// addGenerated appends generated tokens' logprobs, advancing acc's text offset. When tok
// can tell a token's bytes, a token's offset is the index (in characters) of the
// character its first byte belongs to, so the tokens holding the bytes of one multi-byte
// character share that character's offset, the text after it is counted in characters,
// and special tokens (left out of the text) take the offset without advancing it;
// otherwise each token counts the characters of its display text.
func (l *completionLogprobs) addGenerated(tls []engine.TokenLogprob, acc *seqAcc, tok Tokenizer) {
	tb, ok := tok.(TokenByter)
	if !ok {
		l.add(tls, &acc.offset)
		return
	}
	for _, t := range tls {
		off := -1
		if !tb.IsSpecial(t.ID) {
			buf := append(acc.partial, tb.TokenBytes(t.ID)...)
			first := len(acc.partial) // where this token's bytes start in buf
			i := 0
			for i < len(buf) {
				r, size := utf8.DecodeRune(buf[i:])
				if r == utf8.RuneError && size <= 1 && !utf8.FullRune(buf[i:]) {
					break // the rest of this character is still to come
				}
				if off < 0 && i+size > first {
					off = acc.offset
				}
				acc.offset++ // a character, or a byte that is none (shown as U+FFFD)
				i += size
			}
			acc.partial = append(acc.partial[:0], buf[i:]...)
		}
		if off < 0 {
			off = acc.offset
		}
		l.add([]engine.TokenLogprob{t}, &off)
	}
}

// addPrompt appends the prompt's token logprobs with offsets into the echoed prompt
// text. A token's offset is the index (in characters) of the character its first byte
// belongs to, so the tokens holding the bytes of one multi-byte character (shown as
// U+FFFD, one per byte) share that character's offset. A token whose text is not at the
// current position (BOS, which the prompt string does not contain) takes the offset
// without advancing it.
func (l *completionLogprobs) addPrompt(tls []engine.TokenLogprob, text string) {
	pos := 0   // bytes into text
	start := 0 // byte index of the character holding pos
	runes := 0 // characters in text[:start]
	for _, t := range tls {
		for start < pos && start < len(text) {
			_, size := utf8.DecodeRuneInString(text[start:])
			if start+size > pos {
				break
			}
			start += size
			runes++
		}
		off := runes
		if n := matchTokenText(text[pos:], t.Text); n > 0 {
			pos += n
		}
		l.add([]engine.TokenLogprob{t}, &off)
	}
}

// matchTokenText returns how many bytes at the start of text a token's display text
// stands for, or 0 when it is not there. Each U+FFFD of the display text stands for
// itself or for one byte of a multi-byte character that the token holds only part of.
func matchTokenText(text, tok string) int {
	if tok == "" {
		return 0
	}
	if strings.HasPrefix(text, tok) {
		return len(tok)
	}
	i := 0
	for j, r := range tok {
		if r == utf8.RuneError && i < len(text) && text[i] >= utf8.RuneSelf {
			i++
			continue
		}
		size := utf8.RuneLen(r)
		if size < 0 || !strings.HasPrefix(text[i:], tok[j:j+size]) {
			return 0
		}
		i += size
	}
	return i
}

func isNaN32(f float32) bool { return f != f }

func newCompletionLogprobs() *completionLogprobs {
	return &completionLogprobs{Tokens: []string{}, TokenLogprobs: []jsonFloat{}, TopLogprobs: []map[string]jsonFloat{}, TextOffset: []int{}}
}

// completionChoice is one choice of a completion response or chunk.
type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// completionResponse is a completion response or stream chunk (object text_completion).
type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   json.RawMessage    `json:"usage,omitempty"`
}

// seqAcc accumulates one sequence's output.
type seqAcc struct {
	text     strings.Builder
	logprobs *completionLogprobs
	offset   int    // characters of text so far (logprobs text_offset)
	partial  []byte // bytes of a character not yet complete (logprobs text_offset)
	finish   engine.FinishReason
	started  bool
}

// handleCompletions serves POST /v1/completions.
func (s *Server) handleCompletions(c *gin.Context) {
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
	req, err := parseCompletion(f, b)
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
	id := newID("cmpl-")
	c.Set(completionIDKey, id)
	tokens := make([][]int32, len(req.prompts))
	for i, p := range req.prompts {
		tokens[i] = p.tokens
	}
	jobs, err := s.submitAll(ctx, b, id, tokens, req.params, "prompt")
	if err != nil {
		writeError(c.Writer, err)
		return
	}
	fn := &fan{s: s, jobs: jobs}
	base := completionResponse{ID: id, Object: "text_completion", Created: time.Now().Unix(), Model: s.cfg.ModelName}
	if req.stream {
		s.streamCompletion(ctx, c, b, req, fn, base)
		return
	}
	s.collectCompletion(ctx, c, b, req, fn, base)
}

// modelNotFound is the 404 for a model this server does not serve.
func modelNotFound(name string) error {
	return &paramError{param: "model", kind: errModelNotFound, msg: fmt.Sprintf("the model %q does not exist", name)}
}

// applyEvent folds one event into a sequence's accumulator and returns the text and
// logprobs this event adds (echo puts the prompt first on the sequence's first event).
func applyEvent(acc *seqAcc, ev *engine.Event, p prompt, tok Tokenizer, echo, promptOnly, wantLogprobs bool) (string, *completionLogprobs) {
	var text strings.Builder
	var lp *completionLogprobs
	if wantLogprobs {
		lp = newCompletionLogprobs()
	}
	if !acc.started {
		acc.started = true
		if echo {
			text.WriteString(p.text)
			if lp != nil {
				lp.addPrompt(ev.PromptLogprobs, p.text)
				acc.offset = utf8.RuneCountInString(p.text)
			}
		}
	}
	if promptOnly && ev.FinishReason != "" {
		ev.FinishReason = engine.FinishLength // the prompt is all that was asked for
	}
	if !promptOnly {
		text.WriteString(ev.Text)
		if lp != nil {
			lp.addGenerated(ev.Logprobs, acc, tok)
		}
	}
	acc.text.WriteString(text.String())
	if lp != nil {
		if acc.logprobs == nil {
			acc.logprobs = newCompletionLogprobs()
		}
		acc.logprobs.Tokens = append(acc.logprobs.Tokens, lp.Tokens...)
		acc.logprobs.TokenLogprobs = append(acc.logprobs.TokenLogprobs, lp.TokenLogprobs...)
		acc.logprobs.TopLogprobs = append(acc.logprobs.TopLogprobs, lp.TopLogprobs...)
		acc.logprobs.TextOffset = append(acc.logprobs.TextOffset, lp.TextOffset...)
	}
	if ev.FinishReason != "" {
		acc.finish = ev.FinishReason
	}
	return text.String(), lp
}

// collectCompletion waits for every sequence and writes one JSON response.
func (s *Server) collectCompletion(ctx context.Context, c *gin.Context, b *Backend, req *completionRequest, fn *fan, resp completionResponse) {
	accs := make([][]seqAcc, len(req.prompts))
	for i := range accs {
		accs[i] = make([]seqAcc, req.n)
	}
	wantLP := req.params.Logprobs >= 0
	for {
		kind, pi, ev := fn.next(ctx, nil)
		switch kind {
		case gotCancel:
			abortJobs(b, fn.jobs)
			if s.Draining() {
				writeError(c.Writer, fmt.Errorf("the server is shutting down: %w", engine.ErrClosed))
			}
			return
		case gotEvent:
			if isFailure(ev) || ev.Index < 0 || ev.Index >= req.n {
				abortJobs(b, fn.jobs)
				if !isFailure(ev) {
					ev.Err = fmt.Errorf("the engine sent sequence index %d of %d: %w", ev.Index, req.n, engine.ErrModel)
				}
				writeError(c.Writer, eventError(ev))
				return
			}
			applyEvent(&accs[pi][ev.Index], &ev, req.prompts[pi], b.Tokenizer, req.echo, req.promptOnly, wantLP)
			continue
		case gotEnd:
		}
		break
	}
	for pi := range req.prompts {
		for j := 0; j < req.n; j++ {
			acc := &accs[pi][j]
			resp.Choices = append(resp.Choices, completionChoice{
				Index: pi*req.n + j, Text: acc.text.String(), Logprobs: acc.logprobs, FinishReason: finishReason(acc.finish),
			})
		}
	}
	resp.Usage = rawJSON(req.usage(fn))
	writeJSON(c.Writer, 200, resp)
}

// streamCompletion writes the completion as Server-Sent Events.
func (s *Server) streamCompletion(ctx context.Context, c *gin.Context, b *Backend, req *completionRequest, fn *fan, base completionResponse) {
	sse := newSSEWriter(c.Writer)
	accs := make([][]seqAcc, len(req.prompts))
	for i := range accs {
		accs[i] = make([]seqAcc, req.n)
	}
	if req.includeUsage {
		base.Usage = nullJSON
	}
	wantLP := req.params.Logprobs >= 0
	tick := time.NewTicker(s.cfg.KeepAliveInterval)
	defer tick.Stop()
	for {
		kind, pi, ev := fn.next(ctx, tick.C)
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
			if isFailure(ev) || ev.Index < 0 || ev.Index >= req.n {
				abortJobs(b, fn.jobs)
				if !isFailure(ev) {
					ev.Err = fmt.Errorf("the engine sent sequence index %d of %d: %w", ev.Index, req.n, engine.ErrModel)
				}
				sse.fail(eventError(ev))
				return
			}
			text, lp := applyEvent(&accs[pi][ev.Index], &ev, req.prompts[pi], b.Tokenizer, req.echo, req.promptOnly, wantLP)
			if text == "" && ev.FinishReason == "" && (lp == nil || len(lp.Tokens) == 0) {
				continue
			}
			chunk := base
			chunk.Choices = []completionChoice{{Index: pi*req.n + ev.Index, Text: text, Logprobs: lp, FinishReason: finishReason(ev.FinishReason)}}
			if sse.data(chunk) != nil {
				abortJobs(b, fn.jobs)
				return
			}
			continue
		case gotEnd:
		}
		break
	}
	if req.includeUsage {
		chunk := base
		chunk.Choices = []completionChoice{}
		chunk.Usage = rawJSON(req.usage(fn))
		if sse.data(chunk) != nil {
			return
		}
	}
	_ = sse.done()
}

// usage is the request's usage; a prompt-only echo generated nothing it reports.
func (r *completionRequest) usage(fn *fan) usageJSON {
	u := fn.usage()
	if r.promptOnly {
		u.CompletionTokens = 0
		u.TotalTokens = u.PromptTokens
	}
	return u
}
