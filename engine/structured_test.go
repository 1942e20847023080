package engine

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/conveyor-llm/conveyor/engine/structured"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

var (
	defaultOnce sync.Once
	defaultDir  string
	defaultErr  error
)

// defaultModel opens the shipped default model (built once per test binary).
func defaultModel(t *testing.T) (models.Model, *tokenizer.Tokenizer) {
	t.Helper()
	defaultOnce.Do(func() {
		defaultDir = filepath.Join(onnxTmpDirOrTemp(t), "default")
		_, defaultErr = convert.BuildFromHF(filepath.Join("..", "models", "default"), defaultDir, convert.Options{})
	})
	if defaultErr != nil {
		t.Fatal(defaultErr)
	}
	m, err := models.Open(defaultDir, models.RunnerOptions{ORTLib: ortLib(t), IntraOpThreads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	tok, err := tokenizer.Load(defaultDir)
	if err != nil {
		t.Fatal(err)
	}
	return m, tok
}

// onnxTmpDirOrTemp is the directory the ONNX tests build into (removed by TestMain).
func onnxTmpDirOrTemp(t *testing.T) string {
	tinyModelDir(t)
	return onnxTmpDir
}

// TestStructuredOutputValidates samples the default model at temperature 1 under
// schema constraints, n sequences per request, and validates every finished output
// with an independent JSON Schema validator; logprobs see the masked distribution.
func TestStructuredOutputValidates(t *testing.T) {
	m, tok := defaultModel(t)
	e, err := New(tinyConfig(), m, tok)
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	vocab := structured.NewVocabulary(m.Spec().VocabSize, tok.TokenBytes, tok.IsSpecial, tok.EOS())
	schemas := []string{
		`{"type":"object","properties":{"name":{"type":"string","maxLength":20},"age":{"type":"integer","minimum":0,"maximum":120},
		  "city":{"type":["string","null"]}},"required":["name","age"],"additionalProperties":false}`,
		`{"type":"object","properties":{"answer":{"enum":["yes","no","maybe"]},"score":{"type":"number"},
		  "tags":{"type":"array","items":{"type":"string","maxLength":8},"maxItems":3}},"required":["answer","tags"]}`,
		`{"type":"array","items":{"type":"integer","minimum":-9,"maximum":99},"minItems":1,"maxItems":5}`,
	}
	prompt, err := tok.Encode("Here is the record as JSON:", true)
	if err != nil {
		t.Fatal(err)
	}
	for i, schema := range schemas {
		g, err := structured.CompileSchema([]byte(schema), true)
		if err != nil {
			t.Fatal(err)
		}
		v := engineValidator(t, schema)
		p := DefaultSamplingParams()
		p.N, p.MaxTokens, p.Temperature, p.Logprobs = 4, 160, 1, 2
		seed := int64(i)
		p.Seed = &seed
		p.Constraint = structured.NewConstraint(g, vocab)
		res := runAll(t, e, []*Request{{ID: fmt.Sprintf("schema-%d", i), Prompt: prompt, Params: p}})[0]
		finished := 0
		for j := 0; j < p.N; j++ {
			ev := res.seqs[j]
			if ev == nil || ev.Err != nil {
				t.Fatalf("schema %d sequence %d: %+v", i, j, ev)
			}
			for _, lp := range ev.Logprobs {
				if math.IsInf(float64(lp.Logprob), 0) || math.IsNaN(float64(lp.Logprob)) {
					t.Errorf("schema %d: chosen token %d has logprob %v", i, lp.ID, lp.Logprob)
				}
				for _, alt := range lp.Top {
					if math.IsInf(float64(alt.Logprob), -1) {
						t.Errorf("schema %d: a masked token %d is among the top logprobs", i, alt.ID)
					}
				}
			}
			if ev.FinishReason != FinishStop {
				continue
			}
			finished++
			t.Logf("schema %d: %s", i, ev.Text)
			inst, err := jsonschema.UnmarshalJSON(strings.NewReader(ev.Text))
			if err != nil {
				t.Fatalf("schema %d: %q is not JSON: %v", i, ev.Text, err)
			}
			if err := v.Validate(inst); err != nil {
				t.Fatalf("schema %d: %q does not validate: %v", i, ev.Text, err)
			}
		}
		if finished < 2 {
			t.Errorf("schema %d: %d of %d sequences finished within %d tokens", i, finished, p.N, p.MaxTokens)
		}
	}
}

func engineValidator(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("s.json", doc); err != nil {
		t.Fatal(err)
	}
	v, err := c.Compile("s.json")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRequestIDReusableOnceClosed submits the same request id again as soon as its
// channel closes, many times: the id must be free by then.
func TestRequestIDReusableOnceClosed(t *testing.T) {
	m, tok := defaultModel(t)
	e, err := New(tinyConfig(), m, tok)
	if err != nil {
		t.Fatal(err)
	}
	e.Start(context.Background())
	t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	for i := 0; i < 30; i++ {
		ch, err := e.Submit(context.Background(), greedyRequest("same", []int32{1, 5, 9}, 1))
		if err != nil {
			t.Fatalf("submission %d: %v", i, err)
		}
		for range ch {
		}
	}
}

// TestLazyConstraint checks the lazily triggered constraint of tool_choice auto: a reply
// that opens with "{" is constrained from there on (the model's favourite token, which
// the call grammar refuses, is not taken), and a reply that starts as prose is not.
func TestLazyConstraint(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join("..", "models", "default"))
	if err != nil {
		t.Fatal(err)
	}
	vocab := structured.NewVocabulary(tok.VocabSize(), tok.TokenBytes, tok.IsSpecial, tok.EOS())
	g, err := structured.CompileWrapped("", []byte(`{"type":"object","properties":{"name":{"const":"f"},
		"arguments":{"type":"object","properties":{"x":{"type":"integer","minimum":0,"maximum":9}},"required":["x"]}},
		"required":["name","arguments"],"additionalProperties":false}`), "", "\n", 1, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	con := structured.NewConstraint(g, vocab)
	id := func(s string) int32 {
		ids, err := tok.Encode(s, false)
		if err != nil || len(ids) != 1 {
			t.Fatalf("%q is not one token: %v", s, ids)
		}
		return ids[0]
	}
	favour := func(tokID int32) []float32 {
		logits := make([]float32, tok.VocabSize())
		for i := range logits {
			logits[i] = -10
		}
		logits[tokID] = 10
		return logits
	}
	run := func(first string) int32 {
		p := DefaultSamplingParams()
		p.Temperature = 0
		p.LazyConstraint, p.LazyTrigger = con, structured.Trigger{Text: "{", AtStart: true}
		s := newSampler(&p, nil, tok.EOS(), 0)
		sc := &sampleScratch{}
		got := s.sample(favour(id(first)), sc)
		s.accept(got.ID)
		next := s.sample(favour(id(" the")), sc) // prose: not a call's next token
		return next.ID
	}
	if got := run("{"); got == id(" the") {
		t.Error("after a reply opened with {, a token the call grammar refuses was sampled")
	}
	if got := run(" the"); got != id(" the") {
		t.Errorf("a prose reply was constrained: got %d, want %d", got, id(" the"))
	}
}

// TestLazyConstraintPrettyOpening: with Llama 3.1's real vocabulary, a reply whose first
// token is "{\n" (id 517, the way the model opens pretty-printed JSON) is
// constrained from there on, as one opened by "{" is: the call stays a call.
func TestLazyConstraintPrettyOpening(t *testing.T) {
	root := os.Getenv("CONVEYOR_TOKENIZER_FILES")
	if root == "" {
		t.Skip("CONVEYOR_TOKENIZER_FILES is not set")
	}
	tok, err := tokenizer.Load(filepath.Join(root, "llama3_1"))
	if err != nil {
		t.Skipf("no llama3_1 tokenizer files: %v", err)
	}
	vocab := structured.NewVocabulary(tok.VocabSize(), tok.TokenBytes, tok.IsSpecial, tok.EOS())
	g, err := structured.CompileWrapped("", []byte(`{"type":"object","properties":{"name":{"const":"get_weather"},
		"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},
		"required":["name","parameters"],"additionalProperties":false}`), "", "; ", 1, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	con := structured.NewConstraint(g, vocab)
	prose, err := tok.Encode(" the", false)
	if err != nil || len(prose) != 1 {
		t.Fatalf("\" the\": %v %v", prose, err)
	}
	for _, opening := range []string{"{\n", "{\""} {
		first := int32(-1)
		for id := range int32(tok.VocabSize()) {
			if string(tok.TokenBytes(id)) == opening {
				first = id
				break
			}
		}
		if first < 0 {
			t.Fatalf("%q is not a token of Llama 3.1's vocabulary", opening)
		}
		if opening == "{\n" && first != 517 {
			t.Errorf("%q is token %d, want 517", opening, first)
		}
		p := DefaultSamplingParams()
		p.Temperature = 0
		p.LazyConstraint, p.LazyTrigger = con, structured.Trigger{Text: "{", AtStart: true}
		s := newSampler(&p, nil, tok.EOS(), 0)
		s.accept(first)
		logits := make([]float32, tok.VocabSize())
		for i := range logits {
			logits[i] = -10
		}
		logits[prose[0]] = 10
		got := s.sample(logits, &sampleScratch{})
		if got.ID == prose[0] {
			t.Errorf("after a reply opened with %q, a token the call grammar refuses was sampled: the constraint was dropped", opening)
		}
		if b := tok.TokenBytes(got.ID); len(b) == 0 {
			t.Errorf("after %q: sampled token %d has no bytes", opening, got.ID)
		}
	}
}
