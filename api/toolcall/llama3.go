package toolcall

import "github.com/conveyor-llm/conveyor/engine/structured"

// Llama3JSON is vLLM's llama3_json format: {"name": ..., "parameters": ...}, several
// separated by "; " (Llama 3.1 and later), optionally after <|python_tag|>; chosen when
// the chat template writes <|python_tag|> or "Environment: ipython". A call opens the
// reply or not at all. Its calls are read in the bare layout (bare.go), which skips the
// <|python_tag|> lead.
var Llama3JSON = register(Format{Name: "llama3_json", ArgsKey: "parameters", Sep: "; ",
	Trigger: structured.Trigger{Text: "{", AtStart: true}, lead: "<|python_tag|>",
	marks: []string{"<|python_tag|>", "Environment: ipython"}, rank: 2})
