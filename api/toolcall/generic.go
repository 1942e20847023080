package toolcall

import "github.com/conveyor-llm/conveyor/engine/structured"

// Generic is the format of models whose chat template knows no tools (the default
// model): the tools are described in a system message (DescribeTools) and the whole
// reply is one {"name": ..., "arguments": ...} object per line. It is the fallback of
// Detect.
var Generic = register(Format{Name: "generic", ArgsKey: "arguments", Sep: "\n",
	Trigger: structured.Trigger{Text: "{", AtStart: true}, DescribeTools: true, rank: 3})
