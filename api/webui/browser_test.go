package webui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/conveyor-llm/conveyor/api"
	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/scheduler"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// Forward passes take at least fastPace, so that the browser sees a reply grow; while
// the test is about to press Stop they take slowPace, so that the reply is still
// streaming when Stop lands and the stopped replies stay short (the conversation must
// fit the tiny model's 512-token context).
const (
	fastPace = 5 * time.Millisecond
	slowPace = 30 * time.Millisecond
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestChatPageInBrowser drives the real page in headless Chromium against the real
// server, engine and ONNX Runtime with a tiny random model. The subtests share one page
// and run in order, like a user's session.
func TestChatPageInBrowser(t *testing.T) {
	b := newBrowser(t)
	fx := newFixture(t, "")
	page := b.tab(t)
	p := &pageDriver{t: t, ctx: page}
	p.open(fx.url)

	if got := p.text("#model-name"); got != "model: "+fx.name {
		t.Fatalf("#model-name = %q, want %q", got, "model: "+fx.name)
	}
	if p.visible("#key-row") || p.visible("#error") {
		t.Fatalf("the API key field or the error box shows though the server wants no key")
	}

	t.Run("reply grows while it streams", func(t *testing.T) {
		p.t = t
		const maxTokens = 150
		p.setSettings("1", strconv.Itoa(maxTokens), "7")
		const prompt = "Tell me a long story."
		p.watchReplyLengths()
		p.sendWithEnter(prompt)
		p.waitIdle()
		lens := p.replyLengths()
		reply := p.lastReply()
		meta := p.text("#messages .msg.assistant:last-child .meta")

		distinct := 0
		for i, n := range lens {
			if i > 0 && n < lens[i-1] {
				t.Fatalf("reply shrank while streaming: lengths %v", lens)
			}
			if i == 0 || n != lens[i-1] {
				distinct++
			}
		}
		if distinct < 10 {
			t.Fatalf("reply took %d distinct lengths (%v); want it to grow over at least 10 updates", distinct, lens)
		}
		if len(lens) == 0 || lens[len(lens)-1] != utf16Len(reply) {
			t.Fatalf("last observed length %v does not match the final reply (%d UTF-16 units)", lens, utf16Len(reply))
		}
		for _, want := range []string{"TTFT ", " tokens/s", fmt.Sprintf("%d tokens", maxTokens), "finish: length"} {
			if !strings.Contains(meta, want) {
				t.Errorf("reply meta %q lacks %q", meta, want)
			}
		}
		// The same request without streaming, same seed: the page must have put the
		// deltas together into exactly the text the server generates.
		want := fx.chatText(t, []map[string]string{{"role": "user", "content": prompt}}, maxTokens, 7)
		if reply != want {
			t.Fatalf("streamed reply differs from the non-streamed one with the same seed:\npage:   %q\nserver: %q", reply, want)
		}
	})

	t.Run("live engine view follows the batch", func(t *testing.T) {
		p.t = t
		p.setSettings("1", "400", "")
		fx.model.setPace(slowPace)
		defer fx.model.setPace(fastPace)
		p.send("Keep going.")
		// Running is 1 while the reply streams; the same snapshot shows the blocks it holds.
		snap := p.pollStats(`s.running === "1" && s.steps > 0`)
		if n, _ := strconv.Atoi(snap["kv_used"]); n < 1 {
			t.Errorf("one sequence running but %q KV blocks used (snapshot %v)", snap["kv_used"], snap)
		}
		if n, _ := strconv.Atoi(snap["bars"]); n < 1 {
			t.Errorf("no batch-size bars drawn (snapshot %v)", snap)
		}
		if snap["waiting"] != "0" {
			t.Errorf("#stat-waiting = %q, want 0", snap["waiting"])
		}
		// The three block counts are the whole pool.
		used, _ := strconv.Atoi(snap["kv_used"])
		cached, _ := strconv.Atoi(snap["kv_cached"])
		free, _ := strconv.Atoi(snap["kv_free"])
		if total := fx.eng.Stats().KVTotalBlocks; used+cached+free != total {
			t.Errorf("used %d + cached %d + free %d blocks != %d in the pool", used, cached, free, total)
		}
		if w, err := strconv.ParseFloat(strings.TrimSuffix(snap["kv_bar_used"], "%"), 64); err != nil || w <= 0 {
			t.Errorf("the KV bar shows no used blocks (its width %q in the same snapshot)", snap["kv_bar_used"])
		}
		// The server speculates (ngram): a sampled reply of a few dozen tokens repeats a
		// token, and the view shows the proposals and what was accepted of them.
		spec := p.pollStats(`Number(s.spec_proposed) > 0`)
		if spec["spec_off_hidden"] != "true" || !strings.HasSuffix(spec["spec_rate"], " %") || spec["spec_length"] == "–" {
			t.Errorf("speculation view %v: want the rate in %% and the mean accepted length, the hint hidden", spec)
		}
		p.poll(`document.querySelector("#messages .msg.assistant.streaming .content").textContent.length > 60`)
		p.screenshot(artifactPath(t, "webui-midstream.png"))
		p.click("#stop")
		p.waitIdle()
		p.pollStats(`s.running === "0"`)
	})

	t.Run("stop aborts the request and frees the sequence", func(t *testing.T) {
		p.t = t
		p.setSettings("1", "400", "")
		fx.model.setPace(slowPace)
		defer fx.model.setPace(fastPace)
		before := fx.eng.Stats().GenerationTokens
		p.send("Do not stop.")
		p.poll(`document.querySelector("#messages .msg.assistant.streaming .content").textContent.length > 20`)
		if fx.eng.Stats().Running != 1 {
			t.Fatalf("engine runs %d sequences mid-stream, want 1", fx.eng.Stats().Running)
		}
		p.click("#stop")
		p.waitIdle()
		meta := p.text("#messages .msg.assistant:last-child .meta")
		if !strings.Contains(meta, "stopped") {
			t.Fatalf("reply meta %q: want it marked stopped (did the stream finish before Stop?)", meta)
		}
		stoppedAt := p.lastReply()
		waitFor(t, "the engine to drop the stopped sequence", func() bool {
			s := fx.eng.Stats()
			return s.Running == 0 && s.Waiting == 0
		})
		s := fx.eng.Stats()
		if used := s.KVTotalBlocks - s.KVFreeBlocks; used != 0 {
			t.Errorf("%d KV blocks still in use after Stop", used)
		}
		if gen := s.GenerationTokens - before; gen >= 400 {
			t.Errorf("engine generated %d tokens; Stop should have ended the 400-token reply early", gen)
		}
		p.pollStats(`s.running === "0"`)
		if got := p.lastReply(); got != stoppedAt {
			t.Errorf("reply changed after Stop: %q -> %q", stoppedAt, got)
		}
		if !p.eval(`document.querySelector("#stop").disabled && !document.querySelector("#send").disabled`) {
			t.Errorf("buttons not reset after Stop")
		}
	})

	t.Run("HTTP errors are shown", func(t *testing.T) {
		p.t = t
		// Enough distinct words to exceed the 512-token context.
		var sb strings.Builder
		for i := 0; i < 400; i++ {
			fmt.Fprintf(&sb, "word%d ", i)
		}
		long := strings.TrimSpace(sb.String())
		for _, tc := range []struct {
			name, prompt, maxTokens, want, hint string
		}{
			{"over-long prompt", long, "16", "tokens, but this model's maximum context length is 512 tokens", "press Clear"},
			{"max tokens out of range", "hi", "0", "max_tokens", ""},
		} {
			bubbles := p.count("#messages .msg")
			p.setSettings("1", tc.maxTokens, "")
			p.send(tc.prompt)
			p.waitIdle()
			msg := p.text("#error")
			if !strings.Contains(msg, "HTTP 400") || !strings.Contains(msg, tc.want) {
				t.Errorf("%s: #error = %q, want HTTP 400 and %q", tc.name, msg, tc.want)
			}
			if !p.visible("#error") {
				t.Errorf("%s: #error is hidden", tc.name)
			}
			if n := p.count("#messages .msg"); n != bubbles {
				t.Errorf("%s: failed turn left %d new messages", tc.name, n-bubbles)
			}
			if !strings.Contains(msg, tc.hint) {
				t.Errorf("%s: #error = %q does not say how to get out of it", tc.name, msg)
			}
			if got := p.value("#prompt"); got != tc.prompt {
				t.Errorf("%s: prompt box holds %.40q after the failure, want the prompt back for a retry", tc.name, got)
			}
			p.setValue("#prompt", "")
		}
	})

	t.Run("in-band stream errors are shown", func(t *testing.T) {
		p.t = t
		p.setSettings("1", "100", "")
		fx.model.failAfter(20) // after some text, so the failure comes in-band
		p.send("This reply breaks.")
		p.waitIdle()
		if msg := p.text("#error"); !strings.Contains(msg, "stream error") || !strings.Contains(msg, "model failure") {
			t.Errorf("#error = %q, want the in-band stream error", msg)
		}
		if meta := p.text("#messages .msg.assistant:last-child .meta"); !strings.Contains(meta, "error") {
			t.Errorf("reply meta %q should say the reply ended with an error", meta)
		}
	})

	t.Run("a good reply clears the error", func(t *testing.T) {
		p.t = t
		p.setSettings("1", "8", "")
		p.send("Hello again.")
		p.waitIdle()
		if p.visible("#error") {
			t.Errorf("#error still shown after a successful reply: %q", p.text("#error"))
		}
		// The request carried the conversation: every earlier turn that got a reply, in
		// order, each answered by the reply the page shows; the failed turns are not there.
		var req struct {
			Messages []struct{ Role, Content string } `json:"messages"`
		}
		if err := json.Unmarshal([]byte(p.evalString(`window.lastChatBody`)), &req); err != nil {
			t.Fatal(err)
		}
		shown := run(p, "replies", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#messages .msg.assistant .content")].map((e) => e.textContent)`))
		wantUser := []string{"Tell me a long story.", "Keep going.", "Do not stop.", "This reply breaks.", "Hello again."}
		if len(req.Messages) != 2*len(wantUser)-1 {
			t.Fatalf("the last request carried %d messages, want %d: %+v", len(req.Messages), 2*len(wantUser)-1, req.Messages)
		}
		for i, m := range req.Messages {
			want := struct{ Role, Content string }{"user", wantUser[i/2]}
			if i%2 == 1 {
				want = struct{ Role, Content string }{"assistant", shown[i/2]}
			}
			if m != want {
				t.Errorf("message %d = %+v, want %+v", i, m, want)
			}
		}
	})

	t.Run("text is never interpreted as HTML", func(t *testing.T) {
		p.t = t
		p.click("#clear")
		const prompt = `Is <b>x</b> bold? <img src=x onerror="window.pwned=1">`
		const forced = "<b>x</b><i>y</i>"
		ids, err := fx.tok.Encode(forced, false)
		if err != nil || fx.tok.Decode(ids, true) != forced {
			t.Fatalf("tokenizer does not round-trip %q: %v", forced, err)
		}
		promptIDs, err := openai.NewTokenizer(fx.tok).EncodeChat([]openai.Message{{Role: "user", Content: prompt}}, true)
		if err != nil {
			t.Fatal(err)
		}
		fx.model.forceTokens(len(promptIDs), ids)
		defer fx.model.forceTokens(0, nil)
		p.setSettings("1", strconv.Itoa(len(ids)), "")
		p.send(prompt)
		p.waitIdle()
		if got := p.evalString(`[...document.querySelectorAll("#messages .msg.user .content")].pop().textContent`); got != prompt {
			t.Errorf("user message shows %q, want %q literally", got, prompt)
		}
		if got := p.lastReply(); got != forced {
			t.Errorf("reply shows %q, want the model's text %q literally", got, forced)
		}
		if p.count("#messages b, #messages i, #messages img") != 0 || p.eval(`window.pwned === 1`) {
			t.Errorf("message text became markup: %s", p.html("#messages"))
		}
	})

	t.Run("asks for the API key", func(t *testing.T) {
		p.t = t
		keyed := fx.serve(t, "s3cret")
		p.open(keyed)
		if !p.visible("#key-row") {
			t.Fatalf("the API key field is hidden though the server wants a key")
		}
		if msg := p.text("#error"); !strings.Contains(msg, "HTTP 401") {
			t.Errorf("#error = %q, want the 401", msg)
		}
		p.setValue("#api-key", "s3cret")
		p.eval(`document.querySelector("#api-key").dispatchEvent(new Event("change")), true`)
		p.poll(`document.querySelector("#model-name").textContent === "model: ` + fx.name + `"`)
		p.pollStats(`s.steps > 0`)
		p.setSettings("1", "8", "")
		p.send("Hi with a key.")
		p.waitIdle()
		if meta := p.text("#messages .msg.assistant:last-child .meta"); !strings.Contains(meta, "8 tokens") {
			t.Errorf("reply meta %q, want an 8-token reply", meta)
		}
		p.eval(`localStorage.removeItem("conveyor-api-key"), true`)
	})
}

// utf16Len is the length of s in UTF-16 code units, the unit of JavaScript string lengths.
func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		n++
		if r >= 0x10000 {
			n++
		}
	}
	return n
}

// ---- server fixture ----

// fixture is a real server stack: model runner (wrapped by pacedModel), engine, and the
// api server on 127.0.0.1.
type fixture struct {
	model *pacedModel
	eng   *engine.Engine
	tok   *tokenizer.Tokenizer
	name  string // the model's name in the API
	url   string
}

func newFixture(t *testing.T, dir string) *fixture {
	t.Helper()
	if err := models.InitORT(ortLib(t)); err != nil {
		t.Fatal(err)
	}
	name := filepath.Base(dir)
	if dir == "" {
		name, dir = "tiny", t.TempDir()
		cfg := filepath.Join(repoRoot(t), "models", "testdata", "tiny-llama", "config.json")
		if _, err := convert.BuildRandom(cfg, dir, 1, convert.Options{}); err != nil {
			t.Fatalf("building the tiny model: %v", err)
		}
	}
	runner, err := models.Open(dir, models.RunnerOptions{ORTLib: ortLib(t), IntraOpThreads: 1}) // the paged path, as served
	if err != nil {
		t.Fatalf("models.Open: %v", err)
	}
	t.Cleanup(func() { _ = runner.Close() })
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatalf("tokenizer.Load: %v", err)
	}
	pm := newPacedModel(runner, fastPace)
	ecfg := engine.DefaultConfig()
	ecfg.BlockSizeTokens = 16
	// A pool of 256 blocks: room for the test's conversations, small enough that the
	// page's KV bar visibly fills as sequences grow.
	spec := runner.Spec()
	blockBytes := int64(2 * spec.NumLayers * spec.NumKVHeads * spec.HeadDim * ecfg.BlockSizeTokens * spec.KVDType.Size())
	ecfg.KVCacheBytes = 256 * blockBytes
	ecfg.MaxNumSeqs = 16
	// Prompt lookup, as `serve --speculative-config '{"method": "ngram", ...}'` turns on:
	// exact, so every reply is what it would be without it; the live view shows it.
	ecfg.Speculation = scheduler.Speculation{NumTokens: 3, LookupMin: 1, LookupMax: 3, MaxBatch: 4}
	eng, err := engine.New(ecfg, pm, tok)
	if err != nil {
		t.Fatalf("engine.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	eng.Start(ctx)
	t.Cleanup(func() {
		pm.setPace(0)
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = eng.Shutdown(sctx)
		cancel()
	})
	fx := &fixture{model: pm, eng: eng, tok: tok, name: name}
	fx.url = fx.serve(t, "")
	return fx
}

// serve starts one more api server over the fixture's engine and returns its base URL.
func (fx *fixture) serve(t *testing.T, apiKey string) string {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.ModelName = fx.name
	cfg.APIKey = apiKey
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := api.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetBackend(api.Backend{Engine: fx.eng, Tokenizer: openai.NewTokenizer(fx.tok), MaxModelLen: fx.eng.MaxModelLen()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// chatText runs a non-streaming chat completion and returns the reply.
func (fx *fixture) chatText(t *testing.T, msgs []map[string]string, maxTokens int, seed int64) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"model": fx.name, "messages": msgs, "max_tokens": maxTokens, "temperature": 1, "seed": seed,
	})
	resp, err := http.Post(fx.url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion: %s: %s", resp.Status, raw)
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("chat completion body %s: %v", raw, err)
	}
	return out.Choices[0].Message.Content
}

// streamInBackground streams a chat completion and discards it, until done or ctx ends.
func (fx *fixture) streamInBackground(ctx context.Context, prompt string, maxTokens int) {
	body, _ := json.Marshal(map[string]any{
		"model": fx.name, "messages": []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": maxTokens, "stream": true,
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fx.url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
}

// pacedModel wraps the real runner for the browser test: every forward pass takes at
// least the pace (so a browser can watch a reply grow), eos never wins (so a random
// model's reply runs to max_tokens), and on request it forces given tokens or fails
// a pass.
type pacedModel struct {
	inner  engine.Model
	eos    []int32
	pace   atomic.Int64 // nanoseconds per forward pass
	failIn atomic.Int64 // fail the pass after this many more; 0 = never

	mu        sync.Mutex
	forceFrom int     // the position of the first forced token
	force     []int32 // tokens forced at positions forceFrom, forceFrom+1, ...
}

func newPacedModel(m engine.Model, pace time.Duration) *pacedModel {
	p := &pacedModel{inner: m, eos: m.Spec().EOSTokenIDs}
	p.setPace(pace)
	return p
}

func (p *pacedModel) setPace(d time.Duration) { p.pace.Store(int64(d)) }

// failAfter makes the (n+1)-th forward pass from now fail.
func (p *pacedModel) failAfter(n int64) { p.failIn.Store(n + 1) }

// forceTokens makes the sequence whose prompt has promptLen tokens generate ids next.
func (p *pacedModel) forceTokens(promptLen int, ids []int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forceFrom, p.force = promptLen, append([]int32(nil), ids...)
}

func (p *pacedModel) Spec() models.Spec { return p.inner.Spec() }

// Close does nothing: the test closes the runner it wraps.
func (p *pacedModel) Close() error { return nil }

func (p *pacedModel) Forward(b *models.Batch) (*models.Output, error) {
	start := time.Now()
	defer func() {
		if d := time.Duration(p.pace.Load()) - time.Since(start); d > 0 {
			time.Sleep(d)
		}
	}()
	if n := p.failIn.Load(); n > 0 {
		if p.failIn.Add(-1) == 0 {
			return nil, errors.New("injected failure")
		}
	}
	out, err := p.inner.Forward(b)
	if err != nil {
		return nil, err
	}
	vocab := p.inner.Spec().VocabSize
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, row := range out.Logits {
		for off := 0; off+vocab <= len(row); off += vocab {
			for _, id := range p.eos {
				row[off+int(id)] = -1e9
			}
		}
		// The row's last position predicts the token at index next, the one before it the
		// token before that (a speculating row brings several positions).
		n, next := len(row)/vocab, b.Seqs[i].PastLen+len(b.Seqs[i].Tokens)
		for j := range n {
			if k := next - (n - 1 - j) - p.forceFrom; p.force != nil && k >= 0 && k < len(p.force) {
				pos := row[j*vocab : (j+1)*vocab]
				for v := range pos {
					pos[v] = -1e9
				}
				pos[p.force[k]] = 0
			}
		}
	}
	return out, nil
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// ortLib finds ONNX Runtime like the other packages' tests do; a missing library fails.
func ortLib(t *testing.T) string {
	t.Helper()
	p := os.Getenv(models.ORTLibEnv)
	if p == "" {
		p = filepath.Join(repoRoot(t), models.DefaultORTLib)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("ONNX Runtime library %s not found: run `make ort` (or set %s)", p, models.ORTLibEnv)
	}
	return p
}

// waitFor polls cond until it holds, failing after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
