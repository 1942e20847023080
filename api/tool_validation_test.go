package api

import (
	"strings"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/api/openai"
)

// TestToolParametersMustCompile: a tool whose parameters are not a valid JSON Schema is
// a 400 naming it, before anything is generated.
func TestToolParametersMustCompile(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	body := `{"model":"test-model","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":7}}}}}]}`
	rec := do(t, s.Handler(), "POST", "/v1/chat/completions", body)
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "tools[0].function.parameters is not a valid JSON Schema") {
		t.Errorf("status %d %s, want a 400 naming tools[0].function.parameters", rec.Code, rec.Body)
	}
}

// TestToolParametersRefusedFast: parameters nested past the schema compiler's depth, or
// whose $refs lead only to each other, are a 400 in milliseconds on both endpoints (the
// validator took minutes on 5,000 levels); the messages name the field in the endpoint's
// own shape and no server path.
func TestToolParametersRefusedFast(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	deep := strings.Repeat(`{"type":"array","items":`, 5000) + `{}` + strings.Repeat(`}`, 5000)
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":` + deep + `}}]}`,
			"tools[0].function.parameters is not a valid JSON Schema: nested deeper than 64"},
		{"/v1/responses", `{"model":"test-model","store":false,"input":"x","tools":[{"type":"function","name":"f","parameters":` + deep + `}]}`,
			"tools[0].parameters is not a valid JSON Schema: nested deeper than 64"},
		{"/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"$ref":"#"}}}]}`,
			"tools[0].function.parameters is not a valid JSON Schema: the schema matches no value"},
		{"/v1/responses", `{"model":"test-model","store":false,"input":"x","tools":[{"type":"function","name":"f g"}]}`,
			"tools[0].name must be 1 to 64 letters"},
	} {
		start := time.Now()
		rec := do(t, s.Handler(), "POST", tc.path, tc.body)
		if took := time.Since(start); rec.Code != 400 || !strings.Contains(rec.Body.String(), tc.want) || took > 10*time.Second {
			t.Errorf("%s: status %d in %v: %.300s; want a 400 saying %q", tc.path, rec.Code, took, rec.Body, tc.want)
		}
	}
	rec := do(t, s.Handler(), "POST", "/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string","format":7}}}}}]}`)
	if rec.Code != 400 || strings.Contains(rec.Body.String(), "file://") || !strings.Contains(rec.Body.String(), "tools[0].function.parameters") {
		t.Errorf("an invalid keyword value: %d %s; want a 400 without a file path", rec.Code, rec.Body)
	}
}

// TestToolRejectionsExposed: the rejection counter is served at /metrics with both
// reasons from the start, and counts what the chat converter reports.
func TestToolRejectionsExposed(t *testing.T) {
	s := newTestServer(t, newFakeEngine(), nil)
	s.metrics.rejectToolCalls(openai.RejectUnknownTool)
	body := do(t, s.Handler(), "GET", "/metrics", "").Body.String()
	for _, want := range []string{
		`conveyor_tool_calls_rejected_total{reason="unknown_tool"} 1`,
		`conveyor_tool_calls_rejected_total{reason="invalid_arguments"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
