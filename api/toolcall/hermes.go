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
	marks: []string{"<tool_call>"}, rank: 0, parse: parseHermes})

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
