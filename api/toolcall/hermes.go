package toolcall

import (
	"regexp"
	"strings"

	"github.com/conveyor-llm/conveyor/engine/structured"
)

// Hermes is vLLM's hermes format: <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>,
// one block per call (Qwen2.5, Qwen3 and Hermes models), chosen when the chat template
// writes <tool_call>.
var Hermes = register(Format{Name: "hermes", Prefix: "<tool_call>\n", Suffix: "\n</tool_call>", Sep: "\n",
	ArgsKey: "arguments", Trigger: structured.Trigger{Text: "<tool_call>"},
	marks: []string{"<tool_call>"}, rank: 0, parse: parseHermes, cut: cutHermes})

var hermesCall = regexp.MustCompile(`(?s)<tool_call>\s*(.*?)\s*</tool_call>`)

func parseHermes(text string) (string, []Call) {
	matches := hermesCall.FindAllStringSubmatchIndex(text, -1)
	if len(matches) == 0 {
		return text, nil
	}
	var calls []Call
	for _, m := range matches {
		c, ok := callFrom(text[m[2]:m[3]], "arguments")
		if !ok {
			return text, nil
		}
		calls = append(calls, c)
	}
	content := strings.TrimSpace(hermesCall.ReplaceAllString(text, ""))
	return content, calls
}

// cutHermes is ParseCut of hermes: the open call is a <tool_call> with no </tool_call>
// after it, or the beginning of "<tool_call>" ending the reply where only a call can
// begin (at its start or right after a call, whitespace aside).
func cutHermes(text string) (string, []Call, int) {
	const open, end = "<tool_call>", "</tool_call>"
	at := strings.LastIndex(text, open)
	if at >= 0 && strings.Contains(text[at:], end) {
		at = -1
	}
	if at < 0 {
		from := 0
		if i := strings.LastIndex(text, end); i >= 0 {
			from = i + len(end)
		}
		if tail := strings.TrimLeft(text[from:], " \t\r\n"); tail != "" && strings.HasPrefix(open, tail) {
			at = len(text) - len(tail)
		}
	}
	if at < 0 {
		content, calls := parseHermes(text)
		return content, calls, -1
	}
	content, calls := parseHermes(text[:at])
	if len(calls) == 0 {
		content = strings.TrimSpace(content)
	}
	return content, calls, at
}
