// Package toolcall knows the formats in which chat models write tool calls: how a
// format's calls look (so that decoding can be constrained to well-formed calls whose
// arguments validate against the tool's parameters), how to find calls in a finished
// reply (Parse) and in one cut short inside a call (ParseCut: the cut call is no call),
// and which format a chat template speaks (Detect).
//
// # Formats
//
// A format is one file that registers it under vLLM's parser name, as vLLM's
// tool_parsers hold one file per format: its detection from the chat template (the
// markers the template writes), its call layout (Prefix, Suffix, Sep and ArgsKey), its
// Trigger and, unless its calls are bare JSON objects, its parser.
//
//   - hermes.go: hermes, <tool_call>{"name": ..., "arguments": ...}</tool_call> (Qwen2.5,
//     Qwen3 and Hermes models), with its own parser.
//   - mistral.go: mistral, [TOOL_CALLS][{"name": ..., "arguments": ...}, ...], with its
//     own parser; its tag is a control token (ControlPrefix, ControlLiterals).
//   - llama3.go: llama3_json, {"name": ..., "parameters": ...} (Llama 3.1 and later),
//     read in the bare layout, optionally after its lead <|python_tag|>.
//   - generic.go: generic, for models whose template knows no tools: the tools are
//     described in a system message and the whole reply is one {"name": ...,
//     "arguments": ...} object per call, read in the bare layout. It has no markers,
//     which makes it Detect's fallback.
//
// bare.go reads the bare layout (one JSON object per call, separated by ';' or
// newlines, optionally after a registered lead) for every format without a parser of
// its own. toolcall.go holds what every format shares: Tool, Call and Format, the
// registry (ByName, Detect, ControlLiterals), CallSchema, the dispatch of Parse and
// ParseCut, and the reading of one call object. It refers to formats only through the
// registry, and nothing outside this package names a format: adding one is one file and
// its tests.
//
// # Constraining and reading
//
// CallSchema is the JSON Schema of one call object to one of the tools; with the
// format's Prefix, Suffix and Sep it compiles (structured.CompileWrapped) into the
// grammar of a reply made of calls. Under tool_choice auto the reply may be prose, and
// the constraint starts where the format's Trigger appears. Parse never fails: a reply
// whose call text is malformed has no calls and is content whole.
//
// # Usage
//
//	f := toolcall.Detect(chatTemplate)
//	schema, err := f.CallSchema(tools, "") // any of the tools
//	...
//	grammar, err := structured.CompileWrapped(f.Prefix, schema, f.Suffix, f.Sep, 1, 8, false)
//	...
//	content, calls := f.Parse(reply)
package toolcall
