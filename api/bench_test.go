package api

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkCompletionHandler measures the HTTP layer's cost per request (parsing,
// validation, submission, response encoding) against the fake engine: 16 tokens, one
// event each.
func BenchmarkCompletionHandler(b *testing.B) {
	for _, bc := range []struct{ name, body string }{
		{"json", `{"model":"test-model","prompt":"Once upon a time","max_tokens":16}`},
		{"stream", `{"model":"test-model","prompt":"Once upon a time","max_tokens":16,"stream":true}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := newBenchServer(b)
			h := s.Handler()
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest("POST", "/v1/completions", strings.NewReader(bc.body))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatal(rec.Code)
				}
				_, _ = io.Copy(io.Discard, rec.Body)
			}
		})
	}
}

func newBenchServer(b *testing.B) *Server {
	b.Helper()
	cfg := DefaultConfig()
	cfg.ModelName = testModel
	cfg.Logger = discardLogger()
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	s.SetBackend(Backend{Engine: newFakeEngine(), Tokenizer: fakeTokenizer{}, MaxModelLen: testMaxLen})
	return s
}
