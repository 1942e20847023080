package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/conveyor-llm/conveyor/tokenizer"
)

func TestSeedIndependentOfBatch(t *testing.T) {
	seeded := func(id string) *Request {
		p := DefaultSamplingParams()
		p.Temperature = 1
		p.MaxTokens = 30
		p.IgnoreEOS = true
		seed := int64(1234)
		p.Seed = &seed
		return &Request{ID: id, Prompt: testPrompt(5, 17), Params: p}
	}
	e := startEngine(t, testConfig(), newFakeModel(1024), nil)
	alone := runAll(t, e, []*Request{seeded("alone")})[0].seqs[0].TokenIDs

	reqs := []*Request{seeded("mixed")}
	for i := range 10 {
		r := greedyRequest(fmt.Sprintf("o%d", i), testPrompt(i, 3+i*5), 30)
		r.Params.Temperature = 1
		reqs = append(reqs, r)
	}
	mixed := runAll(t, e, reqs)[0].seqs[0].TokenIDs
	if !slices.Equal(alone, mixed) {
		t.Fatalf("seeded request alone %v, in a batch %v", alone, mixed)
	}
	if slices.Equal(alone, fakeGreedyIgnoreEOS(testPrompt(5, 17), 30)) {
		t.Fatal("temperature 1 sampled exactly the greedy tokens: the sampler ignores temperature")
	}
}

func TestParallelSequencesSharePrompt(t *testing.T) {
	cfg := testConfig()
	cfg.EnablePrefixCaching = false
	m := newFakeModel(1024)
	e := startEngine(t, cfg, m, nil)
	prompt := testPrompt(3, 70)
	r := greedyRequest("n3", prompt, 6)
	r.Params.N = 3
	r.Params.IgnoreEOS = true
	res := runAll(t, e, []*Request{r})[0]
	want := fakeGreedyIgnoreEOS(prompt, 6)
	for i := range 3 {
		if got := res.seqs[i]; got == nil || !slices.Equal(got.TokenIDs, want) {
			t.Fatalf("sequence %d: %+v, want %v", i, got, want)
		}
	}
	if res.usage.CompletionTokens != 18 {
		t.Fatalf("usage %+v, want 18 completion tokens", res.usage)
	}
	// The prompt is computed once, but its last token once per sequence.
	if _, fed := m.stats(); fed != len(prompt)+2+3*5 {
		t.Fatalf("fed %d tokens, want %d (prompt once + 2 forked last tokens + 3×5 decode)", fed, len(prompt)+2+3*5)
	}
}

// refLogprob is log_softmax(fakeLogits(prefix))[tok] computed independently.
func refLogprob(prefix []int32, tok int32) float64 {
	logits := make([]float32, fakeVocab)
	fakeLogits(prefix, logits)
	sum := 0.0
	for _, l := range logits {
		sum += math.Exp(float64(l))
	}
	return float64(logits[tok]) - math.Log(sum)
}

func TestBestOfReturnsHighestCumulativeLogprob(t *testing.T) {
	e := startEngine(t, testConfig(), newFakeModel(1024), nil)
	p := DefaultSamplingParams()
	p.N, p.BestOf, p.MaxTokens, p.Temperature, p.IgnoreEOS = 2, 5, 8, 2, true
	seed := int64(9)
	p.Seed = &seed
	prompt := testPrompt(4, 12)
	res := runAll(t, e, []*Request{{ID: "b", Prompt: prompt, Params: p}})[0]
	if len(res.seqs) != 2 || res.events != 2 {
		t.Fatalf("%d sequences in %d events, want 2 in 2", len(res.seqs), res.events)
	}
	if res.usage.CompletionTokens != 5*8 {
		t.Fatalf("usage %+v, want 40 completion tokens (all five sequences)", res.usage)
	}
	for i := range 2 {
		ev := res.seqs[i]
		seq := slices.Clone(prompt)
		cum := 0.0
		for _, tok := range ev.TokenIDs {
			cum += refLogprob(seq, tok)
			seq = append(seq, tok)
		}
		if math.Abs(cum-ev.CumulativeLogprob) > 1e-3 {
			t.Fatalf("sequence %d: cumulative logprob %v, reference %v", i, ev.CumulativeLogprob, cum)
		}
	}
	if res.seqs[0].CumulativeLogprob < res.seqs[1].CumulativeLogprob {
		t.Fatalf("best first: %v then %v", res.seqs[0].CumulativeLogprob, res.seqs[1].CumulativeLogprob)
	}
}

func TestLogprobs(t *testing.T) {
	e := startEngine(t, testConfig(), newFakeModel(1024), fakeText{})
	prompt := testPrompt(6, 40)
	r := greedyRequest("lp", prompt, 5)
	r.Params.IgnoreEOS = true
	r.Params.Logprobs = 3
	r.Params.PromptLogprobs = 2
	res := runAll(t, e, []*Request{r})[0]
	ev := res.seqs[0]
	if len(ev.PromptLogprobs) != len(prompt) || !math.IsNaN(float64(ev.PromptLogprobs[0].Logprob)) {
		t.Fatalf("prompt logprobs: %d entries (want %d), first %+v", len(ev.PromptLogprobs), len(prompt), ev.PromptLogprobs)
	}
	for i := 1; i < len(prompt); i++ {
		lp := ev.PromptLogprobs[i]
		if lp.ID != prompt[i] || math.Abs(float64(lp.Logprob)-refLogprob(prompt[:i], prompt[i])) > 1e-4 || len(lp.Top) != 2 {
			t.Fatalf("prompt logprob %d: %+v, want id %d logprob %v", i, lp, prompt[i], refLogprob(prompt[:i], prompt[i]))
		}
		if lp.Top[0].ID != fakeNext(prompt[:i]) || lp.Text != fakeTokenText(lp.ID) {
			t.Fatalf("prompt logprob %d: top %+v text %q", i, lp.Top, lp.Text)
		}
	}
	seq := slices.Clone(prompt)
	if len(ev.Logprobs) != 5 {
		t.Fatalf("%d logprobs for 5 tokens", len(ev.Logprobs))
	}
	for i, lp := range ev.Logprobs {
		want := refLogprob(seq, lp.ID)
		if lp.ID != ev.TokenIDs[i] || math.Abs(float64(lp.Logprob)-want) > 1e-4 || len(lp.Top) != 3 || lp.Top[0].ID != lp.ID {
			t.Fatalf("logprob %d: %+v, want %v", i, lp, want)
		}
		seq = append(seq, lp.ID)
	}
	if ev.Text != tokensText(ev.TokenIDs) {
		t.Fatalf("text %q, want %q", ev.Text, tokensText(ev.TokenIDs))
	}
}

func tokensText(ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(fakeTokenText(id))
	}
	return b.String()
}

func TestPromptLogprobsWithChunkedPrefill(t *testing.T) {
	cfg := testConfig()
	cfg.MaxNumBatchedTokens = 32 // the 100-token prompt takes 4 chunks
	e := startEngine(t, cfg, newFakeModel(1024), nil)
	prompt := testPrompt(11, 100)
	r := greedyRequest("chunks", prompt, 2)
	r.Params.PromptLogprobs = 0
	ev := runAll(t, e, []*Request{r})[0].seqs[0]
	if len(ev.PromptLogprobs) != len(prompt) {
		t.Fatalf("%d prompt logprobs, want %d", len(ev.PromptLogprobs), len(prompt))
	}
	for i := 1; i < len(prompt); i++ {
		if want := refLogprob(prompt[:i], prompt[i]); math.Abs(float64(ev.PromptLogprobs[i].Logprob)-want) > 1e-4 {
			t.Fatalf("prompt logprob %d: %v, want %v", i, ev.PromptLogprobs[i].Logprob, want)
		}
	}
	if !slices.Equal(ev.TokenIDs, fakeGreedy(prompt, 2)) {
		t.Fatalf("tokens %v, want %v", ev.TokenIDs, fakeGreedy(prompt, 2))
	}
}

func TestStopStringEndToEnd(t *testing.T) {
	e := startEngine(t, testConfig(), newFakeModel(1024), fakeText{})
	prompt := testPrompt(2, 9)
	full := fakeGreedyIgnoreEOS(prompt, 12)
	text := tokensText(full)
	// A stop string that starts inside token 4's text and ends inside token 5's.
	stop := text[len(tokensText(full[:4]))+1 : len(tokensText(full[:5]))+2]
	cut := strings.Index(text, stop)
	r := greedyRequest("s", prompt, 12)
	r.Params.IgnoreEOS = true
	r.Params.Stop = []string{stop}
	ch, err := e.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	var streamed strings.Builder
	var last Event
	for ev := range ch {
		streamed.WriteString(ev.Text)
		last = ev
	}
	if streamed.String() != text[:cut] || last.FinishReason != FinishStop {
		t.Fatalf("streamed %q (%s), want %q (stop)", streamed.String(), last.FinishReason, text[:cut])
	}
}

// metaspaceTokenizer is a Llama-2-style SentencePiece tokenizer whose decoder strips the
// leading space of a text: <unk>, <s>, </s>, then "▁w3" ... "▁w96", one per id of the fake
// model's vocabulary.
func metaspaceTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	vocab := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	for i := 3; i < fakeVocab; i++ {
		vocab[fmt.Sprintf("▁w%d", i)] = i
	}
	v, _ := json.Marshal(vocab)
	src := `{"version": "1.0",
	"added_tokens": [{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true}, {"id": 2, "content": "</s>", "special": true}],
	"normalizer": null,
	"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
	"post_processor": null,
	"decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
	"model": {"type": "BPE", "unk_token": "<unk>", "vocab": ` + string(v) + `, "merges": []}}`
	tok, err := tokenizer.FromBytes([]byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestCompletionTextContinuesThePrompt checks that a completion's text is what it adds
// to the prompt's text: with a decoder that strips a text's leading space, the first
// generated token "▁w5" after the prompt "w7" reads " w5", not "w5".
func TestCompletionTextContinuesThePrompt(t *testing.T) {
	tok := metaspaceTokenizer(t)
	e := startEngine(t, testConfig(), newFakeModel(1024), tokenizerText{tok})
	for _, prompt := range [][]int32{{1, 7, 9}, {7}, {1}} {
		r := greedyRequest(fmt.Sprint(prompt), prompt, 6)
		r.Params.IgnoreEOS = true
		ch, err := e.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		var ids []int32
		for ev := range ch {
			text.WriteString(ev.Text)
			ids = append(ids, ev.TokenIDs...)
		}
		head := tok.Decode(prompt, true)
		full := tok.Decode(append(slices.Clone(prompt), ids...), true)
		if want := strings.TrimPrefix(full, head); text.String() != want || !strings.HasPrefix(full, head) {
			t.Errorf("prompt %v (%q): completion %q, want %q", prompt, head, text.String(), want)
		}
	}
}

// TestParallelSamplingMatchesSerial: rows sampled on several goroutines at once get the
// very tokens and logprobs that one goroutine draws, whatever their sampling parameters.
func TestParallelSamplingMatchesSerial(t *testing.T) {
	requests := func() []*Request {
		var reqs []*Request
		for i := range 12 {
			p := DefaultSamplingParams()
			p.Temperature = 0.7 + 0.1*float32(i%4)
			p.MaxTokens = 24
			p.IgnoreEOS = true
			seed := int64(100 + i)
			p.Seed = &seed
			switch i % 6 {
			case 1:
				p.TopP = 0.9
			case 2:
				p.TopK = 20
			case 3:
				p.MinP = 0.05
				p.Logprobs = 3
			case 4:
				p.RepetitionPenalty = 1.3
				p.PresencePenalty = 0.5
			case 5:
				p.N = 2
				p.TopP = 0.8
			}
			reqs = append(reqs, &Request{ID: fmt.Sprintf("r%d", i), Prompt: testPrompt(i, 4+3*i), Params: p})
		}
		reqs = append(reqs, greedyRequest("greedy", testPrompt(99, 9), 24))
		return reqs
	}
	run := func(procs int) ([]result, int) {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		var mu sync.Mutex
		parallel := 0
		cfg := testConfig()
		cfg.OnStep = func(s StepInfo) {
			mu.Lock()
			parallel += s.ParallelSampled
			mu.Unlock()
		}
		e := startEngine(t, cfg, newFakeModel(1024), nil)
		res := runAll(t, e, requests())
		mu.Lock()
		defer mu.Unlock()
		return res, parallel
	}
	serial, none := run(1)
	parallel, some := run(4)
	if none != 0 || some == 0 {
		t.Fatalf("rows sampled in parallel: %d with GOMAXPROCS 1, %d with 4; want none, then some", none, some)
	}
	for i := range serial {
		for idx, want := range serial[i].seqs {
			got := parallel[i].seqs[idx]
			if got == nil || !slices.Equal(got.TokenIDs, want.TokenIDs) {
				t.Fatalf("request %d sequence %d: parallel %v, serial %v", i, idx, got, want.TokenIDs)
			}
			if fmt.Sprint(got.Logprobs) != fmt.Sprint(want.Logprobs) {
				t.Fatalf("request %d sequence %d: logprobs differ:\nparallel %v\nserial   %v", i, idx, got.Logprobs, want.Logprobs)
			}
		}
	}
}
