//go:build conveyorgen

package webui_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var modelDir = flag.String("model", "", "serve this model directory instead of a random tiny model")

// TestREADMEScreenshot writes docs/webui.png: the page mid-stream with a few other
// chats in the batch. It is built only with the conveyorgen tag:
//
//	go test -tags conveyorgen ./api/webui/ -run TestREADMEScreenshot [-model DIR]
//
// (-model serves a trained model instead of a random tiny one).
func TestREADMEScreenshot(t *testing.T) {
	b := newBrowser(t)
	fx := newFixture(t, *modelDir)
	fx.model.setPace(40 * time.Millisecond)
	p := &pageDriver{t: t, ctx: b.tab(t)}
	p.open(fx.url)
	p.setValue("#system-prompt", "You are a friendly storyteller.")
	p.setSettings("0.8", "40", "1")
	p.send("Once upon a time")
	p.waitIdle()

	// Other users' chats, so the batch view has something to show.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 700 * time.Millisecond)
			fx.streamInBackground(ctx, fmt.Sprintf("The little dog number %d", i), 300)
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	p.setSettings("0.8", "300", "2")
	p.send("Tell me about the little cat.")
	p.pollStats(`s.running === "4"`)
	p.poll(`document.querySelector("#messages .msg.assistant:last-child .content").textContent.length > 150`)
	shot := p.screenshot(filepath.Join(t.TempDir(), "webui.png"))
	p.click("#stop")
	out := filepath.Join(repoRoot(t), "docs", "webui.png")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", out)
}
