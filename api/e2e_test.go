package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	apiopenai "github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// The end-to-end tests run the real engine on the tiny test model (random weights,
// tests/testdata tokenizer) behind a real listener and talk to it with the official
// OpenAI Go SDK.

const e2eModel = "tiny"

var (
	tinyOnce sync.Once
	tinyDir  string
	tinyErr  error
)

// ortLib finds ONNX Runtime: $CONVEYOR_ORT_LIB, else .ort/libonnxruntime.so.1 next to go.mod.
func ortLib(t *testing.T) string {
	t.Helper()
	lib := os.Getenv(models.ORTLibEnv)
	if lib == "" {
		dir, _ := filepath.Abs(".")
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				lib = filepath.Join(dir, ".ort", "libonnxruntime.so.1")
				break
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	if _, err := os.Stat(lib); lib == "" || err != nil {
		t.Fatalf("ONNX Runtime library %q is missing: run `make ort` (or set %s)", lib, models.ORTLibEnv)
	}
	return lib
}

// tinyModel builds the tiny-llama test model once per test binary.
func tinyModel(t *testing.T) string {
	t.Helper()
	lib := ortLib(t)
	tinyOnce.Do(func() {
		if tinyErr = models.InitORT(lib); tinyErr != nil {
			return
		}
		tinyDir, tinyErr = os.MkdirTemp("", "conveyor-api-e2e-")
		if tinyErr != nil {
			return
		}
		cfg := filepath.Join("..", "models", "testdata", "tiny-llama", "config.json")
		_, tinyErr = convert.BuildRandom(cfg, tinyDir, 7, convert.Options{})
	})
	if tinyErr != nil {
		t.Fatalf("building the tiny test model: %v", tinyErr)
	}
	return tinyDir
}

// e2e is a real server on 127.0.0.1 with a real engine.
type e2e struct {
	base   string
	srv    *Server
	eng    *engine.Engine
	client openai.Client
	served chan error
	closed bool
}

func startE2E(t *testing.T, modAPI func(*Config), modEngine func(*engine.Config)) *e2e {
	t.Helper()
	return startE2EModel(t, tinyModel(t), modAPI, modEngine)
}

// startE2EModel is startE2E serving the model in dir.
func startE2EModel(t *testing.T, dir string, modAPI func(*Config), modEngine func(*engine.Config)) *e2e {
	t.Helper()
	return startE2ERunner(t, dir, nil, modAPI, modEngine)
}

// startE2ERunner is startE2EModel with the runner wrapped by wrap (nil: as opened), as
// the fault tests wrap it to inject failures.
func startE2ERunner(t *testing.T, dir string, wrap func(models.Model) models.Model, modAPI func(*Config), modEngine func(*engine.Config)) *e2e {
	t.Helper()
	opened, err := models.Open(dir, models.RunnerOptions{ORTLib: ortLib(t), IntraOpThreads: 1}) // the paged path, as served
	if err != nil {
		t.Fatal(err)
	}
	runner := opened
	if wrap != nil {
		runner = wrap(opened)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	metrics := NewMetrics()
	ecfg := engine.DefaultConfig()
	ecfg.KVCacheBytes = 8 << 20
	ecfg.MaxNumSeqs = 16
	ecfg.MaxNumBatchedTokens = 256
	ecfg.OnStep = metrics.OnStep
	ecfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if modEngine != nil {
		modEngine(&ecfg)
	}
	eng, err := engine.New(ecfg, runner, tok)
	if err != nil {
		t.Fatal(err)
	}
	eng.Start(context.Background())
	cfg := DefaultConfig()
	cfg.ModelName = e2eModel
	cfg.Metrics = metrics
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if modAPI != nil {
		modAPI(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetBackend(Backend{Engine: eng, Tokenizer: apiopenai.NewTokenizer(tok), MaxModelLen: eng.MaxModelLen(),
		Formats: apiopenai.NewFormats(tok, runner.Spec().VocabSize, eng.EOSTokenIDs())})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &e2e{base: "http://" + ln.Addr().String(), srv: srv, eng: eng, served: make(chan error, 1)}
	go func() { e.served <- srv.Serve(ln) }()
	key := cfg.APIKey
	if key == "" {
		key = "unused"
	}
	e.client = openai.NewClient(option.WithBaseURL(e.base+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	t.Cleanup(func() {
		if !e.closed {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
			<-e.served
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Shutdown(ctx)
		_ = opened.Close()
		http.DefaultClient.CloseIdleConnections()
	})
	return e
}

// waitFor polls cond (the engine reports on its own goroutine) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func promptString(s string) openai.CompletionNewParamsPromptUnion {
	return openai.CompletionNewParamsPromptUnion{OfString: openai.String(s)}
}

func TestE2ECompletions(t *testing.T) {
	e := startE2E(t, nil, nil)
	ctx := context.Background()
	greedy := openai.CompletionNewParams{Model: e2eModel, Prompt: promptString("Once upon a time"),
		MaxTokens: openai.Int(12), Temperature: openai.Float(0)}
	base, err := e.client.Completions.New(ctx, greedy)
	if err != nil {
		t.Fatal(err)
	}
	if len(base.Choices) != 1 || base.Object != "text_completion" || !strings.HasPrefix(base.ID, "cmpl-") {
		t.Fatalf("%+v", base)
	}
	text := base.Choices[0].Text
	if base.Usage.CompletionTokens != 12 || base.Choices[0].FinishReason != "length" || base.Usage.TotalTokens != base.Usage.PromptTokens+12 {
		t.Fatalf("usage %+v finish %q", base.Usage, base.Choices[0].FinishReason)
	}

	t.Run("same greedy text when streamed, with include_usage", func(t *testing.T) {
		p := greedy
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		st := e.client.Completions.NewStreaming(ctx, p)
		var got strings.Builder
		var usage openai.CompletionUsage
		chunks, finish := 0, ""
		for st.Next() {
			c := st.Current()
			chunks++
			if len(c.Choices) == 0 {
				usage = c.Usage
				continue
			}
			got.WriteString(c.Choices[0].Text)
			if c.Choices[0].FinishReason != "" {
				finish = string(c.Choices[0].FinishReason)
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if got.String() != text || finish != "length" || usage.CompletionTokens != 12 || chunks < 3 {
			t.Fatalf("streamed %q (finish %q, usage %+v, %d chunks), want %q", got.String(), finish, usage, chunks, text)
		}
	})

	t.Run("token-id prompt", func(t *testing.T) {
		tok := apiopenai.NewTokenizer(mustLoadTok(t))
		ids, _ := tok.Encode("Once upon a time", true)
		toks := make([]int64, len(ids))
		for i, id := range ids {
			toks[i] = int64(id)
		}
		p := greedy
		p.Prompt = openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: toks}
		r, err := e.client.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Choices[0].Text != text {
			t.Fatalf("token prompt gave %q, want %q", r.Choices[0].Text, text)
		}
	})

	t.Run("stop string", func(t *testing.T) {
		runes := []rune(text)
		if len(runes) < 6 {
			t.Fatalf("greedy text %q too short to pick a stop string", text)
		}
		stop := string(runes[3:5])
		want := text[:strings.Index(text, stop)]
		p := greedy
		p.Stop = openai.CompletionNewParamsStopUnion{OfStringArray: []string{stop}}
		r, err := e.client.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Choices[0].Text != want || r.Choices[0].FinishReason != "stop" {
			t.Fatalf("with stop %q: %q (%s), want %q", stop, r.Choices[0].Text, r.Choices[0].FinishReason, want)
		}
	})

	t.Run("n=2 and several prompts", func(t *testing.T) {
		p := openai.CompletionNewParams{Model: e2eModel, MaxTokens: openai.Int(4), N: openai.Int(2), Seed: openai.Int(1),
			Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"Once upon a time", "The cat"}}}
		r, err := e.client.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Choices) != 4 {
			t.Fatalf("%d choices", len(r.Choices))
		}
		for i, c := range r.Choices {
			if int(c.Index) != i || c.FinishReason == "" {
				t.Fatalf("choice %d: %+v", i, c)
			}
		}
		if r.Usage.CompletionTokens > 16 || r.Usage.CompletionTokens < 4 {
			t.Fatalf("usage %+v", r.Usage)
		}
	})

	t.Run("logprobs", func(t *testing.T) {
		p := greedy
		p.Logprobs = openai.Int(3)
		r, err := e.client.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		lp := r.Choices[0].Logprobs
		if len(lp.Tokens) != 12 || len(lp.TokenLogprobs) != 12 || len(lp.TopLogprobs) != 12 || len(lp.TextOffset) != 12 {
			t.Fatalf("logprobs lengths %d %d %d %d", len(lp.Tokens), len(lp.TokenLogprobs), len(lp.TopLogprobs), len(lp.TextOffset))
		}
		for i, top := range lp.TopLogprobs {
			if len(top) < 1 || len(top) > 4 {
				t.Fatalf("position %d: %d alternatives", i, len(top))
			}
			// greedy: the chosen token is the most likely one
			for tokText, v := range top {
				if v > lp.TokenLogprobs[i]+1e-4 {
					t.Fatalf("position %d: %q has logprob %v above the greedy choice's %v", i, tokText, v, lp.TokenLogprobs[i])
				}
			}
			if lp.TokenLogprobs[i] > 0 {
				t.Fatalf("positive logprob %v", lp.TokenLogprobs[i])
			}
		}
	})

	t.Run("echo with logprobs", func(t *testing.T) {
		p := greedy
		p.Echo = openai.Bool(true)
		p.Logprobs = openai.Int(1)
		r, err := e.client.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		c := r.Choices[0]
		if c.Text != "Once upon a time"+text {
			t.Fatalf("echo text %q", c.Text)
		}
		n := int(r.Usage.PromptTokens) + 12
		if len(c.Logprobs.Tokens) != n {
			t.Fatalf("%d logprob tokens, want %d", len(c.Logprobs.Tokens), n)
		}
		if raw := c.Logprobs.JSON.TokenLogprobs.Raw(); !strings.HasPrefix(raw, "[null,") {
			t.Fatalf("first prompt logprob should be null: %.40s", raw)
		}
		// max_tokens 0 with echo scores the prompt only (what evaluation harnesses ask for)
		p.MaxTokens = openai.Int(0)
		r0, err := e.client.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		c0 := r0.Choices[0]
		np := int(r0.Usage.PromptTokens)
		if c0.Text != "Once upon a time" || len(c0.Logprobs.Tokens) != np || r0.Usage.CompletionTokens != 0 {
			t.Fatalf("prompt-only echo: %q, %d tokens, usage %+v", c0.Text, len(c0.Logprobs.Tokens), r0.Usage)
		}
		for i := 1; i < np; i++ { // the prompt's logprobs do not depend on what follows
			if d := c0.Logprobs.TokenLogprobs[i] - c.Logprobs.TokenLogprobs[i]; d > 1e-4 || d < -1e-4 {
				t.Fatalf("prompt logprob %d: %v vs %v", i, c0.Logprobs.TokenLogprobs[i], c.Logprobs.TokenLogprobs[i])
			}
		}
	})
}

func mustLoadTok(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	tok, err := tokenizer.Load(tinyModel(t))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestE2EBestOfPicksHighestCumulativeLogprob asks the real engine for best_of 4 and,
// with the same seed (each sequence index keeps its random stream), for all 4 candidates
// with their token logprobs: the best_of answer must be the candidate whose logprobs sum
// highest. Seeds are tried in order until one gives a best candidate whose text no other
// candidate shares (so taking the first, the last or any other candidate fails); a bounded
// search that finds none fails the test.
func TestE2EBestOfPicksHighestCumulativeLogprob(t *testing.T) {
	e := startE2E(t, nil, nil)
	ctx := context.Background()
	const candidates, firstSeed, seeds = 4, 11, 20
	p := openai.CompletionNewParams{Model: e2eModel, Prompt: promptString("The city of"), MaxTokens: openai.Int(8),
		Temperature: openai.Float(1.5)}
	var cands *openai.Completion
	best, bestSum := -1, math.Inf(-1)
	for seed := int64(firstSeed); seed < firstSeed+seeds && best < 0; seed++ {
		p.Seed = openai.Int(seed)
		all := p
		all.N, all.Logprobs = openai.Int(candidates), openai.Int(0)
		r, err := e.client.Completions.New(ctx, all)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Choices) != candidates {
			t.Fatalf("seed %d: %d candidates", seed, len(r.Choices))
		}
		if i, sum := bestUnique(r.Choices); i >= 0 {
			cands, best, bestSum = r, i, sum
			t.Logf("seed %d: candidate %d of %d is best (cumulative logprob %.3f): %q", seed, i, candidates, sum, r.Choices[i].Text)
		}
	}
	if best < 0 {
		t.Fatalf("no seed in [%d, %d) gives a best candidate with a text of its own", firstSeed, firstSeed+seeds)
	}
	one := p // the same seed, without logprobs: the engine must still rank by them
	one.BestOf = openai.Int(candidates)
	got, err := e.client.Completions.New(ctx, one)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Choices) != 1 {
		t.Fatalf("best_of %d with n 1 returned %d choices", candidates, len(got.Choices))
	}
	if got.Choices[0].Text != cands.Choices[best].Text {
		t.Fatalf("best_of %d returned %q; the candidate with the highest cumulative logprob (%.3f) is %d: %q",
			candidates, got.Choices[0].Text, bestSum, best, cands.Choices[best].Text)
	}
}

// bestUnique returns the index and cumulative logprob of the choice whose token logprobs
// sum highest, or -1 when that choice is the first or another choice has its text (then
// best_of's answer would not show which candidate it took).
func bestUnique(choices []openai.CompletionChoice) (int, float64) {
	best, bestSum := -1, math.Inf(-1)
	for i, c := range choices {
		sum := 0.0
		for _, lp := range c.Logprobs.TokenLogprobs {
			sum += lp
		}
		if sum > bestSum {
			best, bestSum = i, sum
		}
	}
	if best <= 0 {
		return -1, 0
	}
	for i, c := range choices {
		if i != best && c.Text == choices[best].Text {
			return -1, 0
		}
	}
	return best, bestSum
}

func TestE2EChat(t *testing.T) {
	e := startE2E(t, nil, nil)
	ctx := context.Background()
	p := openai.ChatCompletionNewParams{Model: e2eModel, MaxCompletionTokens: openai.Int(10), Temperature: openai.Float(0),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Hello there")}}
	r, err := e.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if r.Object != "chat.completion" || len(r.Choices) != 1 || r.Choices[0].Message.Role != "assistant" {
		t.Fatalf("%+v", r)
	}
	text := r.Choices[0].Message.Content
	if r.Usage.CompletionTokens != 10 && r.Choices[0].FinishReason != "stop" {
		t.Fatalf("usage %+v finish %s", r.Usage, r.Choices[0].FinishReason)
	}

	t.Run("streamed", func(t *testing.T) {
		sp := p
		sp.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		st := e.client.Chat.Completions.NewStreaming(ctx, sp)
		acc := openai.ChatCompletionAccumulator{}
		first := true
		for st.Next() {
			c := st.Current()
			acc.AddChunk(c)
			if first {
				first = false
				if len(c.Choices) != 1 || c.Choices[0].Delta.Role != "assistant" || c.Choices[0].Delta.Content != "" {
					t.Fatalf("first chunk %+v", c)
				}
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if got := acc.Choices[0].Message.Content; got != text {
			t.Fatalf("streamed %q, want %q", got, text)
		}
		if acc.Usage.CompletionTokens != r.Usage.CompletionTokens || acc.Choices[0].FinishReason != r.Choices[0].FinishReason {
			t.Fatalf("usage %+v finish %q", acc.Usage, acc.Choices[0].FinishReason)
		}
	})

	t.Run("logprobs and n=2", func(t *testing.T) {
		lp := p
		lp.Logprobs = openai.Bool(true)
		lp.TopLogprobs = openai.Int(2)
		lp.N = openai.Int(2)
		lp.Temperature = openai.Float(1)
		lp.Seed = openai.Int(3)
		r, err := e.client.Chat.Completions.New(ctx, lp)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Choices) != 2 {
			t.Fatalf("%d choices", len(r.Choices))
		}
		for _, c := range r.Choices {
			if len(c.Logprobs.Content) == 0 {
				t.Fatal("no logprobs")
			}
			for _, tl := range c.Logprobs.Content {
				// bytes are the token's own bytes; its text shows each byte that is not
				// part of a whole character as U+FFFD
				if len(tl.TopLogprobs) != 2 || tl.Logprob > 0 || lossyText(tl.Bytes) != tl.Token {
					t.Fatalf("entry %+v", tl)
				}
			}
		}
	})
}

func TestE2ETokenizeMatchesGeneration(t *testing.T) {
	e := startE2E(t, nil, nil)
	post := func(path, body string) map[string]any {
		t.Helper()
		resp, err := http.Post(e.base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", path, resp.StatusCode, err)
		}
		return m
	}
	text := "Once upon a time, there was a cat."
	m := post("/tokenize", `{"prompt":`+quote(text)+`,"add_special_tokens":false}`)
	ids, _ := json.Marshal(m["tokens"])
	if back := post("/detokenize", `{"tokens":`+string(ids)+`}`); back["prompt"] != text {
		t.Fatalf("round trip gave %q", back["prompt"])
	}
	// /tokenize counts exactly the prompt tokens the endpoints bill
	withBOS := post("/tokenize", `{"prompt":`+quote(text)+`}`)
	r, err := e.client.Completions.New(context.Background(), openai.CompletionNewParams{Model: e2eModel, Prompt: promptString(text), MaxTokens: openai.Int(1)})
	if err != nil {
		t.Fatal(err)
	}
	if int64(withBOS["count"].(float64)) != r.Usage.PromptTokens {
		t.Fatalf("/tokenize counts %v, completion billed %d prompt tokens", withBOS["count"], r.Usage.PromptTokens)
	}
	msgs := `[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hello "},{"type":"text","text":"there"}]}]`
	chatTok := post("/tokenize", `{"messages":`+msgs+`}`)
	cr, err := e.client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: e2eModel, MaxTokens: openai.Int(1),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Hello there")}})
	if err != nil {
		t.Fatal(err)
	}
	if int64(chatTok["count"].(float64)) != cr.Usage.PromptTokens {
		t.Fatalf("/tokenize messages counts %v, chat billed %d prompt tokens", chatTok["count"], cr.Usage.PromptTokens)
	}
	if chatTok["max_model_len"] != float64(e.eng.MaxModelLen()) {
		t.Fatalf("max_model_len %v", chatTok["max_model_len"])
	}
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// lossyText decodes bytes as UTF-8 with one U+FFFD per byte that is not part of a valid
// character, as the tokenizer shows a token's text.
func lossyText(bs []int64) string {
	b := make([]byte, len(bs))
	for i, x := range bs {
		b[i] = byte(x)
	}
	var sb strings.Builder
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size <= 1 {
			sb.WriteRune(utf8.RuneError)
			b = b[1:]
			continue
		}
		sb.WriteRune(r)
		b = b[size:]
	}
	return sb.String()
}
