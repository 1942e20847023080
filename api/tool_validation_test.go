package api

import (
	"strings"
	"testing"

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
