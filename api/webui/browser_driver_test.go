package webui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The headless browser the page tests drive, and the page driver: each of its actions
// is bounded by step and fails the test with what it was doing.

// chromiumFlags are the switches the browser runs with: headless, no sandbox (CI runs as
// root), and nothing that talks to the network on its own.
var chromiumFlags = []string{
	"headless", "no-sandbox", "disable-gpu", "disable-background-networking",
	"disable-component-update", "disable-sync", "no-first-run", "no-default-browser-check",
	"hide-scrollbars", "mute-audio",
}

type browser struct {
	ctx context.Context
}

// newBrowser starts headless Chromium with a fresh profile; it is stopped at cleanup.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	exe := chromiumPath(t)
	profile, err := os.MkdirTemp("", "conveyor-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(exe), chromedp.UserDataDir(profile), chromedp.WindowSize(1280, 860)}
	for _, f := range chromiumFlags {
		opts = append(opts, chromedp.Flag(f, true))
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		bcancel()
		acancel()
		// Chromium's helper processes may still write to the profile for a moment.
		for i := 0; i < 50; i++ {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	// Start the browser on a context without a deadline: it lives as long as bctx.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	return &browser{ctx: bctx}
}

// tab opens a new tab in the browser.
func (b *browser) tab(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// pageDriver runs actions on one tab, failing the current test on any error.
type pageDriver struct {
	t   *testing.T
	ctx context.Context
}

// step is the deadline of one browser action; polls have their own.
const step = 20 * time.Second

func run[T any](p *pageDriver, what string, a chromedp.Action[T]) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, step)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
	return v
}

func (p *pageDriver) open(url string) {
	p.t.Helper()
	run(p, "navigate "+url, chromedp.Steps(chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS("#prompt"))))
	p.poll(`!/connecting/.test(document.querySelector("#model-name").textContent)`)
	// Keep a copy of every chat request body the page sends.
	p.eval(`(() => { const f = window.fetch; window.fetch = (url, opts) => {
		if (url === "/v1/chat/completions") window.lastChatBody = opts.body;
		return f(url, opts); }; return true; })()`)
}

func (p *pageDriver) eval(js string) bool {
	p.t.Helper()
	return run(p, "eval "+js, chromedp.Evaluate[bool](js))
}

// visible reports whether the element takes up space on the page.
func (p *pageDriver) visible(sel string) bool {
	p.t.Helper()
	return p.eval(fmt.Sprintf(`document.querySelector(%q).getClientRects().length > 0`, sel))
}

func (p *pageDriver) evalString(js string) string {
	p.t.Helper()
	return run(p, "eval "+js, chromedp.Evaluate[string](js))
}

func (p *pageDriver) text(sel string) string {
	p.t.Helper()
	return run(p, "text of "+sel, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).textContent`, sel)))
}

func (p *pageDriver) html(sel string) string {
	p.t.Helper()
	return run(p, "html of "+sel, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).innerHTML`, sel)))
}

func (p *pageDriver) value(sel string) string {
	p.t.Helper()
	return run(p, "value of "+sel, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).value`, sel)))
}

func (p *pageDriver) count(sel string) int {
	p.t.Helper()
	return run(p, "count "+sel, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
}

// setValue sets a form field's value as typing would, with an input event.
func (p *pageDriver) setValue(sel, v string) {
	p.t.Helper()
	js := fmt.Sprintf(`(() => { const el = document.querySelector(%q); el.value = %s;
		el.dispatchEvent(new Event("input", {bubbles: true})); return el.value; })()`, sel, jsString(v))
	if got := run(p, "set "+sel, chromedp.Evaluate[string](js)); got != v {
		p.t.Fatalf("set %s to %.40q, it holds %.40q", sel, v, got)
	}
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func (p *pageDriver) click(sel string) {
	p.t.Helper()
	run(p, "click "+sel, chromedp.Click(chromedp.CSS(sel)))
}

// setSettings fills temperature, max tokens and seed ("" = none).
func (p *pageDriver) setSettings(temperature, maxTokens, seed string) {
	p.t.Helper()
	p.setValue("#temperature", temperature)
	p.setValue("#max-tokens", maxTokens)
	p.setValue("#seed", seed)
}

// send writes a prompt and presses Send, as a user does.
func (p *pageDriver) send(prompt string) {
	p.t.Helper()
	p.setValue("#prompt", prompt)
	p.click("#send")
}

// sendWithEnter writes a prompt and presses Enter in the prompt box.
func (p *pageDriver) sendWithEnter(prompt string) {
	p.t.Helper()
	p.setValue("#prompt", prompt)
	run(p, "press Enter", chromedp.SendKeys(chromedp.CSS("#prompt"), "\r"))
}

// poll waits until the JavaScript expression is truthy.
func (p *pageDriver) poll(expr string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(5*time.Millisecond))); err != nil {
		p.t.Fatalf("waiting for %s: %v (error box: %q)", expr, err, p.errorText())
	}
}

func (p *pageDriver) errorText() string {
	ctx, cancel := context.WithTimeout(p.ctx, 2*time.Second)
	defer cancel()
	s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("#error").textContent`))
	return s
}

// statsJS reads the live engine view into s, one snapshot.
const statsJS = `(() => { const g = (id) => document.getElementById(id).textContent; return {
	running: g("stat-running"), waiting: g("stat-waiting"), kv_used: g("stat-kv-used"),
	kv_cached: g("stat-kv-cached"), kv_free: g("stat-kv-free"), steps: g("stat-steps"),
	bars: String(document.querySelectorAll("#batch-bars div").length),
	kv_bar_used: document.querySelector("#kv-bar .used").style.width,
	spec_proposed: g("stat-spec-proposed"), spec_rate: g("stat-spec-rate"), spec_length: g("stat-spec-length"),
	spec_off_hidden: String(document.getElementById("spec-off").hidden) }; })()`

// pollStats waits until cond (a JavaScript expression over s, the live view's numbers
// as strings) holds and returns that snapshot.
func (p *pageDriver) pollStats(cond string) map[string]string {
	p.t.Helper()
	js := fmt.Sprintf(`(() => { const s = %s; s.steps = Number(s.steps); return (%s) ? JSON.stringify(s) : false; })()`, statsJS, cond)
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Poll[string](js, chromedp.WithPollingInterval(20*time.Millisecond)))
	if err != nil {
		p.t.Fatalf("waiting for engine view %s: %v", cond, err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		p.t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}

// waitIdle waits until no reply is in flight.
func (p *pageDriver) waitIdle() {
	p.t.Helper()
	p.poll(`!document.querySelector("#send").disabled && !document.querySelector(".msg.streaming")`)
}

// lastReply is the text of the newest assistant message.
func (p *pageDriver) lastReply() string {
	p.t.Helper()
	return p.text("#messages .msg.assistant:last-child .content")
}

// watchReplyLengths records the length of the streaming reply at every DOM change.
func (p *pageDriver) watchReplyLengths() {
	p.t.Helper()
	p.eval(`(() => {
		window.replyLengths = [];
		if (window.replyObserver) window.replyObserver.disconnect();
		window.replyObserver = new MutationObserver(() => {
			const el = document.querySelector("#messages .msg.assistant.streaming .content");
			if (el) window.replyLengths.push(el.textContent.length);
		});
		window.replyObserver.observe(document.querySelector("#messages"), {subtree: true, childList: true, characterData: true});
		return true; })()`)
}

func (p *pageDriver) replyLengths() []int {
	p.t.Helper()
	return run(p, "reply lengths", chromedp.Evaluate[[]int](`window.replyLengths`))
}

// screenshot saves the viewport as PNG at path and returns it.
func (p *pageDriver) screenshot(path string) []byte {
	p.t.Helper()
	png := run(p, "screenshot", chromedp.CaptureScreenshot())
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot: %s", path)
	return png
}

// ---- environment ----

// artifactPath is where a test artifact goes: $CONVEYOR_ARTIFACTS when set, else a
// temporary directory.
func artifactPath(t *testing.T, name string) string {
	dir := os.Getenv("CONVEYOR_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, name)
}

// chromiumPath finds the browser; its absence is a failure, not a skip.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CONVEYOR_CHROMIUM"); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("CONVEYOR_CHROMIUM=%s: %v (install Chromium with `apt-get install -y chromium`)", p, err)
		}
		return p
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("Chromium not found: install it with `apt-get install -y chromium` (or set CONVEYOR_CHROMIUM)")
	return ""
}
