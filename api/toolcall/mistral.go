package toolcall

import (
	"encoding/json"
	"strings"

	"github.com/conveyor-llm/conveyor/engine/structured"
)

// Mistral is vLLM's mistral format: [TOOL_CALLS][{"name": ..., "arguments": ...}, ...],
// chosen when the chat template writes [TOOL_CALLS]. [TOOL_CALLS] is a control token in
// Mistral's tokenizers: the reply's text keeps it (ControlPrefix) and constrained
// decoding may emit it (ControlLiterals).
var Mistral = register(Format{Name: "mistral", Prefix: "[TOOL_CALLS][", Suffix: "]", Sep: ", ", ArgsKey: "arguments",
	Trigger: structured.Trigger{Text: "[TOOL_CALLS]"}, ControlPrefix: true,
	marks: []string{"[TOOL_CALLS]"}, rank: 1, parse: parseMistral})

func parseMistral(text string) (string, []Call) {
	i := strings.Index(text, "[TOOL_CALLS]")
	if i < 0 {
		return text, nil
	}
	var raw []json.RawMessage
	dec := json.NewDecoder(strings.NewReader(text[i+len("[TOOL_CALLS]"):]))
	if err := dec.Decode(&raw); err != nil || len(raw) == 0 {
		return text, nil
	}
	var calls []Call
	for _, r := range raw {
		c, ok := callFrom(string(r), "arguments")
		if !ok {
			return text, nil
		}
		calls = append(calls, c)
	}
	return strings.TrimSpace(text[:i]), calls
}
