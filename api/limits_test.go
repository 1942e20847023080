package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serveLimits runs a server without a backend (/health answers 503, which is a reply
// all the same) on a loopback listener with the limits mod sets, until the test ends.
func serveLimits(t *testing.T, mod func(*Config)) string {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	mod(&cfg)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, s)
}

// serveOn runs s on a loopback listener until the test ends and returns its address.
func serveOn(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// rawGet sends a GET /health on conn and reads the status line, failing after wait.
func rawGet(conn net.Conn, extraHeader string, wait time.Duration) (string, error) {
	if _, err := fmt.Fprintf(conn, "GET /health HTTP/1.1\r\nHost: x\r\n%s\r\n", extraHeader); err != nil {
		return "", err
	}
	return readStatus(conn, wait)
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestMaxConnections: with two connections open, a third is not served until one closes.
func TestMaxConnections(t *testing.T) {
	addr := serveLimits(t, func(c *Config) { c.MaxConnections = 2 })
	a, b := dial(t, addr), dial(t, addr)
	for _, c := range []net.Conn{a, b} {
		if _, err := rawGet(c, "", 5*time.Second); err != nil {
			t.Fatalf("one of the first two connections: %v", err)
		}
	}
	third := dial(t, addr) // the kernel completes the handshake; the server does not accept it
	if status, err := rawGet(third, "", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("third connection answered (%q, %v) while two were open", status, err)
	}
	a.Close()
	_ = third.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(third), nil)
	if err != nil {
		t.Fatalf("third connection after one closed: %v", err)
	}
	resp.Body.Close()
}

// TestMaxHeaderBytes: a request whose headers exceed the cap gets 431; a small one is served.
func TestMaxHeaderBytes(t *testing.T) {
	addr := serveLimits(t, func(c *Config) { c.MaxHeaderBytes = 1 << 10 })
	// net/http allows 4096 bytes of slack past MaxHeaderBytes: go well beyond both.
	status, err := rawGet(dial(t, addr), "X-Big: "+strings.Repeat("a", 16<<10)+"\r\n", 5*time.Second)
	if err != nil || !strings.HasPrefix(status, "431") {
		t.Fatalf("oversized header: %q, %v; want 431", status, err)
	}
	status, err = rawGet(dial(t, addr), "X-Small: a\r\n", 5*time.Second)
	if err != nil || strings.HasPrefix(status, "431") {
		t.Fatalf("small header: %q, %v", status, err)
	}
}

// TestSlowHeaderDisconnected: a client that sends part of its headers and stalls is
// disconnected after ReadHeaderTimeout.
func TestSlowHeaderDisconnected(t *testing.T) {
	addr := serveLimits(t, func(c *Config) { c.ReadHeaderTimeout = 200 * time.Millisecond })
	conn := dial(t, addr)
	if _, err := io.WriteString(conn, "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, conn, 200*time.Millisecond)
}

// TestIdleConnectionClosed: a keep-alive connection idle past IdleTimeout is closed.
func TestIdleConnectionClosed(t *testing.T) {
	addr := serveLimits(t, func(c *Config) { c.IdleTimeout = 200 * time.Millisecond })
	conn := dial(t, addr)
	if _, err := rawGet(conn, "", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, conn, 200*time.Millisecond)
}

// expectClosed waits for the server to close conn: not before after (less some slack),
// and well within a few seconds.
func expectClosed(t *testing.T, conn net.Conn, after time.Duration) {
	t.Helper()
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := conn.Read(make([]byte, 1))
	elapsed := time.Since(start)
	if err == nil || isTimeout(err) { // EOF, or a reset: closed either way
		t.Fatalf("connection still open after %v (read %d bytes, %v)", elapsed, n, err)
	}
	if elapsed < after/2 {
		t.Fatalf("closed after %v, before the %v timeout", elapsed, after)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestConfigValidateLimits(t *testing.T) {
	c := DefaultConfig()
	c.MaxHeaderBytes = 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "MaxHeaderBytes") {
		t.Fatalf("MaxHeaderBytes 0: %v", err)
	}
	c = DefaultConfig()
	c.MaxBodyBytesInFlight = c.MaxBodyBytes - 1
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "MaxBodyBytesInFlight") {
		t.Fatalf("MaxBodyBytesInFlight below MaxBodyBytes: %v", err)
	}
}

// startPost sends a POST /v1/completions whose body is padded to size bytes, but only
// its first sent bytes; finish sends the rest.
func startPost(t *testing.T, conn net.Conn, size, sent int) (finish func()) {
	t.Helper()
	body := `{"model":"` + testModel + `","prompt":"hi","max_tokens":2}`
	body += strings.Repeat(" ", size-len(body))
	if _, err := fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", size, body[:sent]); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := io.WriteString(conn, body[sent:]); err != nil {
			t.Fatal(err)
		}
	}
}

// readStatus reads one response's status line from conn, failing after wait.
func readStatus(conn net.Conn, wait time.Duration) (string, error) {
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.Status, nil
}

// TestBodiesInFlightWaitTheirTurn: with MaxBodyBytesInFlight taken by one body still
// arriving, a second request is not read until the first is parsed; a client that gives
// up while waiting takes nothing with it; all the room comes back.
func TestBodiesInFlightWaitTheirTurn(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), func(c *Config) {
		c.MaxBodyBytes, c.MaxBodyBytesInFlight = 4<<10, 4<<10
	})
	addr := serveOn(t, s)

	a := dial(t, addr)
	finishA := startPost(t, a, 3<<10, 100)
	time.Sleep(100 * time.Millisecond) // let a take its room
	b := dial(t, addr)
	finishB := startPost(t, b, 2<<10, 2<<10)
	finishB()
	if status, err := readStatus(b, 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("second request answered (%q, %v) while the first body held the room", status, err)
	}
	gone := dial(t, addr) // waits as well, then gives up
	startPost(t, gone, 2<<10, 2<<10)()
	time.Sleep(100 * time.Millisecond)
	gone.Close()

	finishA()
	for name, c := range map[string]net.Conn{"first": a, "second": b} {
		if status, err := readStatus(c, 10*time.Second); err != nil || !strings.HasPrefix(status, "200") {
			t.Fatalf("%s request: %q, %v", name, status, err)
		}
	}
	waitFor(t, "every body's room back", func() bool {
		if s.bodies.TryAcquire(4 << 10) {
			s.bodies.Release(4 << 10)
			return true
		}
		return false
	})
}

// TestSlowBodyDisconnected: a body that stops arriving is cut off after BodyReadTimeout
// with a 400, and the room it held goes to the next request.
func TestSlowBodyDisconnected(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), func(c *Config) {
		c.MaxBodyBytes, c.MaxBodyBytesInFlight = 4<<10, 4<<10
		c.BodyReadTimeout = 300 * time.Millisecond
	})
	addr := serveOn(t, s)
	slow := dial(t, addr)
	startPost(t, slow, 3<<10, 100)
	time.Sleep(50 * time.Millisecond)
	next := dial(t, addr)
	startPost(t, next, 2<<10, 2<<10)()
	start := time.Now()
	if status, err := readStatus(slow, 5*time.Second); err != nil || !strings.HasPrefix(status, "400") {
		t.Fatalf("stalled body: %q, %v; want 400", status, err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("stalled body cut off after %v, before the 300ms timeout", d)
	}
	if status, err := readStatus(next, 10*time.Second); err != nil || !strings.HasPrefix(status, "200") {
		t.Fatalf("request after the stalled one: %q, %v", status, err)
	}
}

// TestPromptsBeyondAdmission: a completions request with more prompts than the engine can
// ever take at once is a bad request, refused before any prompt is submitted.
func TestPromptsBeyondAdmission(t *testing.T) {
	eng := newFakeEngine()
	s := newTestServer(t, nil, nil)
	s.SetBackend(Backend{Engine: eng, Tokenizer: fakeTokenizer{}, MaxModelLen: testMaxLen,
		MaxPrompts: func(seqs int) int { return 4/seqs + 1 }})
	h := s.Handler()
	body := func(prompts, n int) string {
		ps := make([]string, prompts)
		for i := range ps {
			ps[i] = fmt.Sprintf("%q", fmt.Sprintf("prompt %d", i))
		}
		return fmt.Sprintf(`{"model":%q,"prompt":[%s],"max_tokens":2,"n":%d}`, testModel, strings.Join(ps, ","), n)
	}
	for _, tc := range []struct {
		prompts, n, status int
	}{
		{5, 1, http.StatusOK},
		{6, 1, http.StatusBadRequest},
		{3, 2, http.StatusOK},
		{4, 2, http.StatusBadRequest},
	} {
		eng.mu.Lock()
		before := len(eng.reqs)
		eng.mu.Unlock()
		rec := do(t, h, "POST", "/v1/completions", body(tc.prompts, tc.n))
		if rec.Code != tc.status {
			t.Fatalf("%d prompts, n=%d: status %d, want %d: %s", tc.prompts, tc.n, rec.Code, tc.status, rec.Body)
		}
		eng.mu.Lock()
		submitted := len(eng.reqs) - before
		eng.mu.Unlock()
		if tc.status != http.StatusOK {
			e := errorObject(t, rec.Body.Bytes())
			if e["param"] != "prompt" || !strings.Contains(e["message"].(string), "send them in several requests") {
				t.Fatalf("%d prompts, n=%d: error %v", tc.prompts, tc.n, e)
			}
			if submitted != 0 {
				t.Fatalf("%d prompts, n=%d: %d submitted before the refusal", tc.prompts, tc.n, submitted)
			}
		} else if submitted != tc.prompts {
			t.Fatalf("%d prompts, n=%d: %d submitted", tc.prompts, tc.n, submitted)
		}
	}
	eng.wg.Wait()
}
