package engine

import (
	"context"
	"slices"
	"testing"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// TestGraphMatchesDenseGreedy serves the same greedy requests, all at once (prompts
// prefilled in chunks beside decoding rows), on the shipped default model through the
// dense path and through the step graph: every sequence's tokens must be the same.
func TestGraphMatchesDenseGreedy(t *testing.T) {
	_, tok := defaultModel(t) // builds the default model's directory
	var got [2][][]int32
	for i, path := range []string{models.AttentionDense, models.AttentionGraph} {
		m, err := models.Open(defaultDir, models.RunnerOptions{ORTLib: ortLib(t), IntraOpThreads: 2, Attention: path})
		if err != nil {
			t.Fatal(err)
		}
		got[i] = serveGreedy(t, m, tok)
		m.Close()
	}
	tokens := 0
	for r := range got[0] {
		tokens += len(got[0][r])
		if !slices.Equal(got[0][r], got[1][r]) {
			t.Errorf("request %d: dense %v, graph %v", r, got[0][r], got[1][r])
		}
	}
	if tokens < 100 {
		t.Fatalf("only %d tokens generated", tokens)
	}
}

// serveGreedy submits tinyRequests' prompts at once, each for 24 tokens, and returns the
// tokens of each.
func serveGreedy(t *testing.T, m models.Model, tok *tokenizer.Tokenizer) [][]int32 {
	t.Helper()
	cfg := tinyConfig()
	cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens = 8, 48 // longer prompts prefill in chunks beside decoding rows
	e, err := New(cfg, m, tok)
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	defer shutdown(t, e)
	reqs := tinyRequests(t, tok, 8)
	var chans []<-chan Event
	for _, r := range reqs {
		r.Params.MaxTokens, r.Params.IgnoreEOS = 24, true
		ch, err := e.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	var out [][]int32
	for _, ch := range chans {
		res := collect(ch)
		if ev := res.seqs[0]; ev != nil {
			out = append(out, ev.TokenIDs)
		} else {
			out = append(out, nil)
		}
	}
	return out
}
