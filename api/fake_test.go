package api

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
)

// fakeTokenizer maps each byte b to token id b+1; id 0 is BOS ("<s>"). Vocabulary 257.
type fakeTokenizer struct{}

const fakeBOS = 0

func (fakeTokenizer) Encode(text string, addSpecial bool) ([]int32, error) {
	var ids []int32
	if addSpecial {
		ids = append(ids, fakeBOS)
	}
	for i := 0; i < len(text); i++ {
		ids = append(ids, int32(text[i])+1)
	}
	return ids, nil
}

func (fakeTokenizer) Decode(ids []int32, skipSpecial bool) string {
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteString(fakeTokenizer{}.tokenText(id, skipSpecial))
	}
	return sb.String()
}

func (fakeTokenizer) tokenText(id int32, skipSpecial bool) string {
	if id == fakeBOS {
		if skipSpecial {
			return ""
		}
		return "<s>"
	}
	return string([]byte{byte(id - 1)})
}

func (fakeTokenizer) TokenText(id int32) string  { return fakeTokenizer{}.tokenText(id, false) }
func (fakeTokenizer) TokenBytes(id int32) []byte { return []byte(fakeTokenizer{}.tokenText(id, false)) }
func (fakeTokenizer) IsSpecial(id int32) bool    { return id == fakeBOS }
func (fakeTokenizer) VocabSize() int             { return 257 }

func (fakeTokenizer) EncodeChat(msgs []openai.Message, addGen bool) ([]int32, error) {
	var sb strings.Builder
	for _, m := range msgs {
		sb.WriteString("<" + m.Role + ">" + m.Content + "\n")
	}
	if addGen {
		sb.WriteString("<assistant>")
	}
	return fakeTokenizer{}.Encode(sb.String(), true)
}

// EncodeChatWith renders as EncodeChat: the fake's template takes no tools nor keyword
// arguments.
func (fakeTokenizer) EncodeChatWith(msgs []openai.Message, o openai.ChatOptions) ([]int32, error) {
	return fakeTokenizer{}.EncodeChat(msgs, o.AddGenerationPrompt)
}

// ChatTemplateSource is empty: the fake has no template text to choose a tool-call
// format from.
func (fakeTokenizer) ChatTemplateSource() string { return "" }

// fakeEngine generates deterministic text: sequence j of a request emits the letters
// 'a'+j, 'a'+j+1, ... one token per event, until MaxTokens (finish "length"). Its
// cumulative logprob is -(j+1) per token, so lower indexes are "better".
type fakeEngine struct {
	mu       sync.Mutex
	reqs     []*engine.Request
	aborted  map[string]bool
	live     map[string]chan struct{} // abort signal per running request
	submitFn func(*engine.Request) error
	// gate, when set, blocks every token event until it is closed.
	gate chan struct{}
	// failAfter, when > 0, ends every sequence with an ErrModel error event after that many tokens.
	failAfter int
	// failFirst ends requests with an error event before any token.
	failFirst bool
	// maxLen and vocab, when set, replace testMaxLen and fakeTokenizer's vocabulary as
	// the context and the vocabulary the fake checks prompts against.
	maxLen, vocab int
	wg            sync.WaitGroup
	stats         engine.Stats
}

func newFakeEngine() *fakeEngine {
	return &fakeEngine{aborted: map[string]bool{}, live: map[string]chan struct{}{}}
}

// fakeLimits are the fake engine's sizes: fakeTokenizer's vocabulary, testMaxLen.
var fakeLimits = engine.Limits{VocabSize: 257, MaxModelLen: testMaxLen}

func (e *fakeEngine) Submit(ctx context.Context, req *engine.Request) (<-chan engine.Event, error) {
	// The engine's own request rules, as the real engine applies them.
	limits := fakeLimits
	if e.maxLen > 0 {
		limits.MaxModelLen = e.maxLen
	}
	if e.vocab > 0 {
		limits.VocabSize = e.vocab
	}
	params, err := limits.Check(req)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if e.submitFn != nil {
		if err := e.submitFn(req); err != nil {
			e.mu.Unlock()
			return nil, err
		}
	}
	r := *req
	r.Params = params
	e.reqs = append(e.reqs, &r)
	abort := make(chan struct{})
	e.live[req.ID] = abort
	gate, failAfter, failFirst := e.gate, e.failAfter, e.failFirst
	e.mu.Unlock()

	ch := make(chan engine.Event, 4)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer close(ch)
		defer func() {
			e.mu.Lock()
			delete(e.live, r.ID)
			e.mu.Unlock()
		}()
		e.run(ctx, &r, ch, abort, gate, failAfter, failFirst)
	}()
	return ch, nil
}

func (e *fakeEngine) run(ctx context.Context, r *engine.Request, ch chan<- engine.Event, abort, gate chan struct{}, failAfter int, failFirst bool) {
	arrival := time.Now()
	p := r.Params
	send := func(ev engine.Event) bool {
		select {
		case ch <- ev:
			return true
		case <-ctx.Done():
		case <-abort:
		}
		return false
	}
	finishAll := func(reason engine.FinishReason, err error, from int) {
		for j := from; j < p.N; j++ {
			ev := engine.Event{Index: j, FinishReason: reason, Err: err}
			if j == p.N-1 {
				ev.Usage = &engine.Usage{PromptTokens: len(r.Prompt)}
			}
			select {
			case ch <- ev:
			default:
			}
		}
	}
	if failFirst {
		finishAll(engine.FinishError, fmt.Errorf("forward pass failed: %w", engine.ErrModel), 0)
		return
	}
	generated := 0
	for j := 0; j < p.N; j++ {
		for k := 0; k < p.MaxTokens; k++ {
			if gate != nil {
				select {
				case <-gate:
				case <-ctx.Done():
					finishAll(engine.FinishAbort, nil, j)
					return
				case <-abort:
					finishAll(engine.FinishAbort, nil, j)
					return
				}
			}
			if failAfter > 0 && k == failAfter {
				finishAll(engine.FinishError, fmt.Errorf("forward pass failed: %w", engine.ErrModel), j)
				return
			}
			id := int32('a'+j+k) + 1
			ev := engine.Event{Index: j, TokenIDs: []int32{id}, Text: string(rune('a' + j + k))}
			if p.Logprobs >= 0 {
				tl := engine.TokenLogprob{ID: id, Text: ev.Text, Logprob: -float32(j + 1)}
				for a := 0; a < p.Logprobs; a++ {
					tl.Top = append(tl.Top, engine.TopLogprob{ID: int32('A'+a) + 1, Text: string(rune('A' + a)), Logprob: -float32(j+1) - float32(a+1)})
				}
				ev.Logprobs = []engine.TokenLogprob{tl}
			}
			if k == 0 && p.PromptLogprobs >= 0 {
				for i, pid := range r.Prompt {
					lp := float32(-0.25)
					if i == 0 {
						lp = float32(math.NaN())
					}
					ev.PromptLogprobs = append(ev.PromptLogprobs, engine.TokenLogprob{ID: pid, Text: fakeTokenizer{}.TokenText(pid), Logprob: lp})
				}
			}
			generated++
			if k == p.MaxTokens-1 {
				ev.FinishReason = engine.FinishLength
				ev.CumulativeLogprob = -float64(j+1) * float64(p.MaxTokens)
				now := time.Now()
				ev.Timings = engine.Timings{Arrival: arrival, Scheduled: arrival, FirstToken: arrival, Finished: now}
				if j == p.N-1 {
					ev.Usage = &engine.Usage{PromptTokens: len(r.Prompt), CompletionTokens: generated}
				}
			}
			if !send(ev) {
				finishAll(engine.FinishAbort, nil, j)
				return
			}
		}
		if p.MaxTokens == 0 {
			ev := engine.Event{Index: j, FinishReason: engine.FinishLength}
			if j == p.N-1 {
				ev.Usage = &engine.Usage{PromptTokens: len(r.Prompt)}
			}
			if !send(ev) {
				return
			}
		}
	}
}

func (e *fakeEngine) Abort(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.aborted[id] = true
	if ch, ok := e.live[id]; ok {
		close(ch)
		delete(e.live, id)
	}
}

func (e *fakeEngine) Stats() engine.Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.Running = len(e.live)
	return s
}

func (e *fakeEngine) lastRequest() *engine.Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.reqs) == 0 {
		return nil
	}
	return e.reqs[len(e.reqs)-1]
}

func (e *fakeEngine) wasAborted(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.aborted[id]
}

func (e *fakeEngine) numLive() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.live)
}
