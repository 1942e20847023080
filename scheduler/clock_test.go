package scheduler

import (
	"sync"
	"time"
)

// manualClock is a clock that moves only when told to. It is safe for concurrent use.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

// newManualClock returns a clock reading t.
func newManualClock(t time.Time) *manualClock { return &manualClock{t: t} }

// Now returns the clock's current reading.
func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *manualClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}
