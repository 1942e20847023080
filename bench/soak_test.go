package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// fakeSoakServer answers /v1/models and /metrics like Conveyor (an idle, empty KV cache)
// and hands generation requests to gen.
func fakeSoakServer(t *testing.T, gen http.HandlerFunc) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"object":"list","data":[{"id":"fake","object":"model","max_model_len":64}]}`)
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "# HELP x\nconveyor_num_requests_running 0\nconveyor_num_requests_waiting 0\n"+
			"conveyor_kv_cache_usage_perc 0\nconveyor_cache_config_info{block_size=\"16\",num_blocks=\"100\"} 1\n"+
			"process_resident_memory_bytes 1.048576e+07\n")
	})
	mux.HandleFunc("/v1/", gen)
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

const okChunk = `data: {"choices":[{"index":0,"text":"hi","delta":{"content":"hi"},"finish_reason":null}]}`

// TestSoakFlagsBadReplies runs the soak against fake servers that each break one rule
// and requires every reply to be counted unexpected under the rule's class.
func TestSoakFlagsBadReplies(t *testing.T) {
	cases := []struct {
		name  string
		kinds string
		class string
		gen   http.HandlerFunc
	}{
		{"cut stream", "completion_stream,chat_stream", "cut_stream", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s\n\n", okChunk) // no finish_reason, no [DONE]: the connection just ends
		}},
		{"finish without [DONE]", "chat_stream", "cut_stream", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n", okChunk)
		}},
		{"in-band error", "chat_stream", "error", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s\n\ndata: {\"error\":{\"message\":\"boom\"}}\n\ndata: [DONE]\n\n", okChunk)
		}},
		{"500", "completion,chat,json_schema,tool_call", "5xx", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"error":{"message":"internal","type":"server_error"}}`, http.StatusInternalServerError)
		}},
		{"malformed accepted", "malformed", "status", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `{"choices":[{"index":0,"text":"","finish_reason":"stop"}]}`)
		}},
		{"400 without error object", "malformed", "error_object", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad request", http.StatusBadRequest)
		}},
		{"over-context wrong code", "over_context", "error_code", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"too long","type":"invalid_request_error","code":null}}`)
		}},
		{"schema violated", "json_schema", "schema", func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(readBody(r), `"stream":true`) {
				io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{\\\"city\\\":3}\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
				return
			}
			io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"{\"city\":3}"},"finish_reason":"stop"}]}`)
		}},
		{"tool arguments violated", "tool_call", "tool_args", func(w http.ResponseWriter, r *http.Request) {
			call := `{"index":0,"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"days\":99}"}}`
			if strings.Contains(readBody(r), `"stream":true`) {
				fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[%s]},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n", call)
				return
			}
			fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","tool_calls":[%s]},"finish_reason":"tool_calls"}]}`, call)
		}},
		{"max body accepted", "max_body", "status", func(w http.ResponseWriter, r *http.Request) {
			if n := len(readBody(r)); n < 8<<20-8192 || n > 8<<20 {
				t.Errorf("max_body body is %d bytes, want just under 8 MiB", n)
			}
			io.WriteString(w, `{"choices":[{"index":0,"text":"","finish_reason":"stop"}]}`)
		}},
		{"max n short of choices", "max_n", "choices", func(w http.ResponseWriter, r *http.Request) {
			body := readBody(r)
			if !strings.Contains(body, `"n":128`) {
				t.Errorf("max_n request without n 128: %.200s", body)
			}
			if strings.Contains(body, `"stream":true`) {
				io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"text\":\"x\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
				return
			}
			io.WriteString(w, `{"choices":[{"index":0,"text":"x","finish_reason":"length"}]}`)
		}},
		{"wrong n", "chat_n", "choices", func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(readBody(r), `"stream":true`) {
				io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
				return
			}
			io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}]}`)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := fakeSoakServer(t, tc.gen)
			kinds, err := ParseSoakKinds(tc.kinds)
			if err != nil {
				t.Fatal(err)
			}
			cfg := DefaultSoakConfig()
			cfg.Target = Target{BaseURL: srv.URL}
			cfg.Duration, cfg.Clients, cfg.Kinds = 300*time.Millisecond, 2, kinds
			cfg.ReportEvery, cfg.IdlePause, cfg.RequestTimeout = 100*time.Millisecond, 10*time.Millisecond, 5*time.Second
			rep, err := Soak(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Requests == 0 || rep.Unexpected != rep.Requests || !rep.Failed() {
				t.Fatalf("%d requests, %d unexpected, failed %v: want every reply flagged (%v)", rep.Requests, rep.Unexpected, rep.Failed(), rep.Outcomes)
			}
			for _, k := range kinds {
				if rep.Outcomes[string(k)][tc.class] == 0 {
					t.Errorf("kind %s: outcomes %v, want class %q", k, rep.Outcomes[string(k)], tc.class)
				}
			}
			if rep.RSS.Max != 10<<20 || rep.IdleKVUsed != 0 || rep.IdleErr != "" {
				t.Errorf("rss %+v, idle kv %d %q", rep.RSS, rep.IdleKVUsed, rep.IdleErr)
			}
		})
	}
}

// TestParseSoakKinds: "all" is the default mix, "storm" the storm kinds, names combine.
func TestParseSoakKinds(t *testing.T) {
	for in, want := range map[string]int{"": len(SoakKinds), "all": len(SoakKinds), "storm": 2,
		"storm,malformed": 3, "max_n": 1} {
		ks, err := ParseSoakKinds(in)
		if err != nil || len(ks) != want {
			t.Errorf("%q: %v, %v; want %d kinds", in, ks, err, want)
		}
	}
	for _, k := range SoakKinds {
		if k.Kind == SoakMaxBody || k.Kind == SoakMaxN {
			t.Errorf("storm kind %s in the default mix", k.Kind)
		}
	}
	if _, err := ParseSoakKinds("storm,nope"); err == nil {
		t.Error("unknown kind accepted")
	}
}

// TestSoakFlagsKVLeftInUse: a server whose KV cache is not empty once idle fails the soak.
func TestSoakFlagsKVLeftInUse(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"data":[{"id":"fake","max_model_len":64}]}`)
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "conveyor_num_requests_running 0\nconveyor_num_requests_waiting 0\n"+
			"conveyor_kv_cache_usage_perc 0.03\nconveyor_cache_config_info{block_size=\"16\",num_blocks=\"100\"} 1\n")
	})
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"bad","type":"invalid_request_error","code":null}}`)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	cfg := DefaultSoakConfig()
	cfg.Target = Target{BaseURL: srv.URL}
	cfg.Duration, cfg.Clients, cfg.Kinds = 100*time.Millisecond, 1, []SoakKind{SoakMalformed}
	cfg.ReportEvery, cfg.IdlePause = time.Second, 10*time.Millisecond
	rep, err := Soak(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Unexpected != 0 || rep.IdleKVUsed != 3 || !rep.Failed() {
		t.Fatalf("unexpected %d, idle kv %d, failed %v: want 0, 3, true", rep.Unexpected, rep.IdleKVUsed, rep.Failed())
	}
	if rep.RSS.Max != -1 {
		t.Errorf("rss %+v without process_resident_memory_bytes, want -1", rep.RSS)
	}
}

func readBody(r *http.Request) string {
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

// TestSoakInterrupted: an interrupted soak still reports what ran, and fails.
func TestSoakInterrupted(t *testing.T) {
	srv := fakeSoakServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"bad","type":"invalid_request_error","code":null}}`)
	})
	cfg := DefaultSoakConfig()
	cfg.Target = Target{BaseURL: srv.URL}
	cfg.Clients, cfg.Kinds = 2, []SoakKind{SoakMalformed}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rep, err := Soak(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests == 0 || rep.Unexpected != 0 || !rep.Failed() || rep.Duration >= time.Minute || len(rep.Windows) != 1 {
		t.Fatalf("requests %d, unexpected %d, failed %v, duration %v, %d windows", rep.Requests, rep.Unexpected, rep.Failed(), rep.Duration, len(rep.Windows))
	}
}
