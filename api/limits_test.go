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
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.Status, nil
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
}
