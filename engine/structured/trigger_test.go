package structured

import "testing"

// TestTrigger checks the one rule both the engine (where to start a lazy constraint)
// and the streaming front end (what prose may go out) read.
func TestTrigger(t *testing.T) {
	tag := Trigger{Text: "<tool_call>"}
	brace := Trigger{Text: "{", AtStart: true}
	for _, tc := range []struct {
		trig      Trigger
		out       string
		at        int
		final     bool
		safeBytes int
	}{
		{tag, "Sure. ", -1, false, 6},
		{tag, "Sure. <tool", -1, false, 6},        // a possible beginning is held
		{tag, "Sure. <tool_call>\n{", 6, true, 6}, // the call opens at 6
		{tag, "a < b", -1, false, 5},
		{brace, "", -1, false, 0},
		{brace, " \n", -1, false, 0},        // whitespace: a call may still open
		{brace, "\n {\"name\"", 2, true, 0}, // the leading whitespace is the call's
		{brace, "Hello {", -1, true, 7},     // prose first: never a call
		{Trigger{Text: "[TOOL_CALLS]"}, "x[TOOL_", -1, false, 1},
		{Trigger{}, "anything", -1, true, 8},
	} {
		at, final := tc.trig.Locate([]byte(tc.out))
		if at != tc.at || final != tc.final {
			t.Errorf("%+v.Locate(%q) = %d, %v; want %d, %v", tc.trig, tc.out, at, final, tc.at, tc.final)
		}
		if a, f, got := tc.trig.Scan([]byte(tc.out)); got != tc.safeBytes || a != at || f != final {
			t.Errorf("%+v.Scan(%q) = %d, %v, %d; want %d, %v, %d", tc.trig, tc.out, a, f, got, at, final, tc.safeBytes)
		}
	}
}
