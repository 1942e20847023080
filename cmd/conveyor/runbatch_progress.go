package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progressBar redraws one status line on stderr a few times a second.
type progressBar struct {
	w     io.Writer
	stats *batchStats
	stopc chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	msg   string
}

func startProgressBar(w io.Writer, stats *batchStats) *progressBar {
	p := &progressBar{w: w, stats: stats, stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.draw(false)
			case <-p.stopc:
				p.draw(true)
				return
			}
		}
	}()
	return p
}

// note replaces the rate part of the line with msg.
func (p *progressBar) note(msg string) {
	p.mu.Lock()
	p.msg = msg
	p.mu.Unlock()
}

// stop draws the final state and ends the line. A nil bar does nothing.
func (p *progressBar) stop() {
	if p == nil {
		return
	}
	close(p.stopc)
	<-p.done
}

func (p *progressBar) draw(final bool) {
	s := p.stats
	if s.started.IsZero() {
		return
	}
	p.mu.Lock()
	msg := p.msg
	p.mu.Unlock()
	line := formatProgress(s.skipped+int(s.written.Load()), s.total, int(s.written.Load()), int(s.tokens.Load()),
		int(s.failed.Load()), int(s.inflight.Load()), time.Since(s.started), 30)
	if msg != "" && final {
		msg = "interrupted"
	}
	if msg != "" {
		line += "  " + msg
	}
	end := ""
	if final {
		end = "\n"
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s%s", line, end)
}

// formatProgress renders the bar: done of total lines, this run's line and output-token
// rates, and the time left at the current line rate.
func formatProgress(done, total, ran, tokens, failed, inflight int, elapsed time.Duration, width int) string {
	frac := 1.0
	if total > 0 {
		frac = float64(done) / float64(total)
	}
	fill := int(frac * float64(width))
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	secs := elapsed.Seconds()
	rate, tps := 0.0, 0.0
	if secs > 0 {
		rate, tps = float64(ran)/secs, float64(tokens)/secs
	}
	eta := "--:--"
	if rate > 0 {
		eta = formatClock(time.Duration(float64(total-done) / rate * float64(time.Second)))
	}
	s := fmt.Sprintf("[%s] %d/%d lines  %.1f lines/s  %.0f tok/s  ETA %s  (%d running", bar, done, total, rate, tps, eta, inflight)
	if failed > 0 {
		s += fmt.Sprintf(", %d not 200", failed)
	}
	return s + ")"
}

// formatClock prints d as m:ss or h:mm:ss.
func formatClock(d time.Duration) string {
	t := int(d.Round(time.Second).Seconds())
	if t >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", t/3600, t/60%60, t%60)
	}
	return fmt.Sprintf("%d:%02d", t/60, t%60)
}
