package api

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"testing"
	"time"
)

const bigBodyBytes = 40 << 20 // five times the default MaxBodyBytes

// bigBody is a completion request of about n bytes (the prompt fills it).
func bigBody(n int) []byte {
	head, tail := `{"model":"test-model","prompt":"`, `"}`
	return append(append([]byte(head), bytes.Repeat([]byte("a"), n-len(head)-len(tail))...), tail...)
}

// check413 checks a 413 response: the OpenAI error object, and a connection that closes.
func check413(t *testing.T, resp *http.Response) {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the 413 body: %v", err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if !resp.Close {
		t.Errorf("the 413 does not close the connection (headers %v)", resp.Header)
	}
	if e := errorObject(t, body); e["code"] != "request_too_large" || e["type"] != "invalid_request_error" {
		t.Fatalf("error %v", e)
	}
}

// rawExchange writes a whole request (head, then body) on a fresh connection before
// reading anything, as curl and Python's http.client do, and returns the response. A
// server that answers and closes while the body is still coming resets the connection,
// and the write fails.
func rawExchange(t *testing.T, addr, head string, writeBody func(io.Writer) error) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatalf("writing the head: %v", err)
	}
	if err := writeBody(conn); err != nil {
		t.Fatalf("writing the body: %v (the server closed the connection before reading it)", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// chunked writes body with the chunked transfer coding, in chunks of 32 KiB.
func chunked(body []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		cw := httputil.NewChunkedWriter(w)
		if _, err := io.Copy(cw, bytes.NewReader(body)); err != nil {
			return err
		}
		if err := cw.Close(); err != nil {
			return err
		}
		_, err := io.WriteString(w, "\r\n") // no trailers
		return err
	}
}

// plain writes body as it is.
func plain(body []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(body)
		return err
	}
}

// TestOversizedBodyGets413 sends a 40 MB body to a real server with the default 8 MB
// limit: the client reads the 413 and its error object instead of a connection reset,
// whether the size is declared (Content-Length) or found while reading (chunked), and
// whether the client reads while it writes (Go) or only after (curl, Python).
func TestOversizedBodyGets413(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	body := bigBody(bigBodyBytes)

	t.Run("Go client, Content-Length", func(t *testing.T) {
		resp, err := http.Post(srv.URL+cp, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		check413(t, resp)
	})
	t.Run("Go client, chunked", func(t *testing.T) {
		req, _ := http.NewRequest("POST", srv.URL+cp, io.MultiReader(bytes.NewReader(body)))
		req.ContentLength = -1
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		check413(t, resp)
	})
	t.Run("writes all before reading, Content-Length", func(t *testing.T) {
		head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", cp, len(body))
		check413(t, rawExchange(t, addr, head, plain(body)))
	})
	t.Run("writes all before reading, chunked", func(t *testing.T) {
		head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n", cp)
		check413(t, rawExchange(t, addr, head, chunked(body)))
	})
	t.Run("Expect: 100-continue gets the 413 instead of the 100", func(t *testing.T) {
		head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", cp, len(body))
		start := time.Now()
		resp := rawExchange(t, addr, head, plain(nil))
		check413(t, resp)
		if d := time.Since(start); d > discardTimeout/2 {
			t.Fatalf("the server waited %v for a body the client was told not to send", d)
		}
	})
	// the server still serves after all that
	if rec := do(t, s.Handler(), "POST", cp, comp(`,"max_tokens":1`)); rec.Code != 200 {
		t.Fatalf("after the refusals: %d %s", rec.Code, rec.Body)
	}
}

// TestLimitedBody checks the reader behind the chunked case: the limit itself passes,
// one byte more fails with *http.MaxBytesError, and the rest stays readable to discard.
func TestLimitedBody(t *testing.T) {
	for _, tc := range []struct {
		size int
		over bool
	}{{99, false}, {100, false}, {101, true}, {1000, true}} {
		src := io.NopCloser(strings.NewReader(strings.Repeat("x", tc.size)))
		b := &limitedBody{rc: src, left: 100, limit: 100}
		got, err := io.ReadAll(b)
		var mbe *http.MaxBytesError
		if tc.over != (err != nil) || (tc.over && (!b.over || len(got) != 100 || !errors.As(err, &mbe) || mbe.Limit != 100)) {
			t.Fatalf("size %d: read %d bytes, err %v, over %v", tc.size, len(got), err, b.over)
		}
		if rest, _ := io.ReadAll(b.rc); tc.over && len(rest) != tc.size-101 {
			t.Fatalf("size %d: %d bytes left to discard, want %d", tc.size, len(rest), tc.size-101)
		}
	}
}
