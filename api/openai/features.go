package openai

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"

	"github.com/conveyor-llm/conveyor/engine/structured"
)

// The OpenAI chat parameters that ask for something beyond sampling text. Each is
// either honoured, accepted because what it asks for changes nothing in what Conveyor
// returns (a cache hint, an id for abuse monitoring, "text" as the output format), or
// refused with a 400 naming it: a request is never served while silently dropping
// something it asked for.

// responseFormat is response_format: {"type":"text"|"json_object"|"json_schema", ...}.
type responseFormat struct {
	Type       opt[string]           `json:"type"`
	JSONSchema opt[jsonSchemaFormat] `json:"json_schema"`
}

// jsonSchemaFormat is response_format.json_schema.
type jsonSchemaFormat struct {
	Name        opt[string]     `json:"name"`
	Description opt[string]     `json:"description"` // accepted, not used (as vLLM): the schema alone decides what is valid
	Schema      json.RawMessage `json:"schema"`
	Strict      opt[bool]       `json:"strict"`
}

// responseConstraint validates response_format and returns the constraint it asks
// for: nil for {"type":"text"}, any JSON object for json_object, and for json_schema
// JSON that validates against the schema (compiled once per schema and kept in the
// backend's cache). A schema the compiler cannot honour is a 400 naming the keyword.
func responseConstraint(c *check, m *Model, o opt[responseFormat]) *structured.Constraint {
	if !shape(c, "response_format", "an object", o) {
		return nil
	}
	typ, ok := c.str("response_format.type", o.V.Type)
	switch {
	case c.failed():
		return nil
	case !ok:
		c.fail(InvalidParam("response_format.type", "response_format.type is required"))
		return nil
	case typ == "text":
		return nil
	case typ != "json_object" && typ != "json_schema":
		c.fail(InvalidParam("response_format.type", "response_format.type %q is not one of text, json_object, json_schema", typ))
		return nil
	}
	if m.Formats == nil {
		c.fail(UnsupportedValue("response_format", "response_format {\"type\": %q} is not supported by this server", typ))
		return nil
	}
	if typ == "json_object" {
		return m.Formats.JSONObject()
	}
	if !shape(c, "response_format.json_schema", "an object", o.V.JSONSchema) {
		if !c.failed() {
			c.fail(InvalidParam("response_format.json_schema", "response_format.json_schema is required with type json_schema"))
		}
		return nil
	}
	js := o.V.JSONSchema.V
	name, ok := c.str("response_format.json_schema.name", js.Name)
	if !c.failed() && (!ok || !validSchemaName(name)) {
		c.fail(InvalidParam("response_format.json_schema.name", "response_format.json_schema.name must be 1 to 64 letters, digits, underscores and dashes"))
	}
	c.str("response_format.json_schema.description", js.Description)
	strict := c.boolean("response_format.json_schema.strict", js.Strict, false)
	if c.failed() {
		return nil
	}
	schema := js.Schema
	if len(schema) == 0 || string(schema) == "null" {
		schema = json.RawMessage(`{}`) // OpenAI: no schema means any JSON value
	}
	con, err := m.Formats.Schema(schema, strict)
	switch {
	case errors.Is(err, structured.ErrUnsupported):
		c.fail(UnsupportedValue("response_format.json_schema.schema", "%s", strings.TrimPrefix(err.Error(), "structured: ")))
	case err != nil:
		c.fail(InvalidParam("response_format.json_schema.schema", "%s", strings.TrimPrefix(err.Error(), "structured: ")))
	}
	return con
}

// validSchemaName reports whether name is an OpenAI response format name.
func validSchemaName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// chatFeatures are the chat members beyond sampling: tools, other modalities, and the
// hints and bookkeeping of OpenAI's platform.
type chatFeatures struct {
	// Tool calling (toolplan.go: parseTools); the deprecated functions are refused.
	Tools             opt[[]json.RawMessage] `json:"tools"`
	ToolChoice        opt[json.RawMessage]   `json:"tool_choice"`
	Functions         opt[[]json.RawMessage] `json:"functions"`
	FunctionCall      opt[json.RawMessage]   `json:"function_call"`
	ParallelToolCalls opt[bool]              `json:"parallel_tool_calls"` // no-op without tools
	// flatTools: Tools came in the Responses shape ({"type", "name", "parameters"}), so
	// errors name tools[i].name rather than tools[i].function.name.
	flatTools bool

	// Refused unless they ask for plain text only.
	Modalities      opt[[]string]          `json:"modalities"`
	Audio           opt[json.RawMessage]   `json:"audio"`
	Prediction      opt[json.RawMessage]   `json:"prediction"`
	WebSearch       opt[json.RawMessage]   `json:"web_search_options"`
	Moderation      opt[json.RawMessage]   `json:"moderation"`
	ReasoningEffort opt[string]            `json:"reasoning_effort"`
	Verbosity       opt[string]            `json:"verbosity"`
	Store           opt[bool]              `json:"store"`
	Metadata        opt[map[string]string] `json:"metadata"`

	platformHints
}

// platformHints are the members of OpenAI's platform that change nothing in what
// Conveyor generates or returns — a service tier, an id for abuse monitoring, the
// prompt-cache hints — accepted by the chat and responses endpoints alike and checked
// for their wire values only.
type platformHints struct {
	ServiceTier          opt[string]          `json:"service_tier"`
	SafetyIdentifier     opt[string]          `json:"safety_identifier"`
	PromptCacheKey       opt[string]          `json:"prompt_cache_key"`
	PromptCacheRetention opt[string]          `json:"prompt_cache_retention"`
	PromptCacheOptions   opt[json.RawMessage] `json:"prompt_cache_options"`
}

// check validates the hints' wire values.
func (h *platformHints) check(c *check) {
	c.str("service_tier", h.ServiceTier)
	c.str("safety_identifier", h.SafetyIdentifier)
	c.str("prompt_cache_key", h.PromptCacheKey)
	if r, ok := c.str("prompt_cache_retention", h.PromptCacheRetention); ok && !slices.Contains([]string{"in_memory", "24h"}, r) {
		c.fail(InvalidParam("prompt_cache_retention", "prompt_cache_retention %q is not one of in_memory, 24h", r))
	}
	if h.PromptCacheOptions.Set && !c.failed() && jsonKind(h.PromptCacheOptions.V) != "an object" {
		c.fail(InvalidParam("prompt_cache_options", "prompt_cache_options must be an object, got %s", jsonKind(h.PromptCacheOptions.V)))
	}
}

// check validates the chat features: what Conveyor does not do is refused by name.
func (f *chatFeatures) check(c *check) {
	// tools, tool_choice and parallel_tool_calls: parseTools.
	if shape(c, "functions", "an array", f.Functions) && len(f.Functions.V) > 0 {
		c.fail(UnsupportedParam("functions", "functions are not supported: Conveyor does not call functions"))
	}
	checkChoice(c, "function_call", f.FunctionCall, "a function")

	if shape(c, "modalities", "an array of strings", f.Modalities) {
		for _, m := range f.Modalities.V {
			if c.failed() {
				break
			}
			switch m {
			case "text":
			case "audio":
				c.fail(UnsupportedValue("modalities", "modalities %q is not supported; only [\"text\"] is", m))
			default:
				c.fail(InvalidParam("modalities", "modalities %q is not one of text, audio", m))
			}
		}
	}
	refuse(c, "audio", f.Audio, "audio output is not supported")
	refuse(c, "prediction", f.Prediction, "prediction (predicted outputs) is not supported")
	refuse(c, "web_search_options", f.WebSearch, "web search is not supported")
	refuse(c, "moderation", f.Moderation, "moderation is not supported")
	if effort, ok := c.str("reasoning_effort", f.ReasoningEffort); ok && effort != "none" {
		c.fail(UnsupportedValue("reasoning_effort", "reasoning_effort %q is not supported: the model does not reason; only \"none\" is", effort))
	}
	if v, ok := c.str("verbosity", f.Verbosity); ok && v != "medium" {
		c.fail(UnsupportedValue("verbosity", "verbosity %q is not supported; only \"medium\", the default, is", v))
	}
	if c.boolean("store", f.Store, false) {
		c.fail(UnsupportedValue("store", "store is not supported: Conveyor keeps no completions (send false or leave it out)"))
	}
	shape(c, "metadata", "an object of strings", f.Metadata)
	f.platformHints.check(c)
}

// checkChoice validates tool_choice or function_call: "none", and "auto" (with nothing
// to call it is "none"), are accepted; "required" or naming what to call is refused.
func checkChoice(c *check, name string, o opt[json.RawMessage], what string) {
	if c.failed() || !o.Set {
		return
	}
	var s string
	switch {
	case jsonKind(o.V) == "an object":
		c.fail(UnsupportedValue(name, "%s naming %s is not supported: Conveyor does not call tools", name, what))
	case jsonKind(o.V) != "a string" || json.Unmarshal(o.V, &s) != nil:
		c.fail(InvalidParam(name, "%s must be a string or an object, got %s", name, jsonKind(o.V)))
	case s == "none" || s == "auto":
	case s == "required":
		c.fail(UnsupportedValue(name, "%s \"required\" is not supported: Conveyor does not call tools", name))
	default:
		c.fail(InvalidParam(name, "%s %q is not one of none, auto, required", name, s))
	}
}

// refuse fails for any value of a member Conveyor does not implement.
func refuse(c *check, name string, o opt[json.RawMessage], msg string) {
	if !c.failed() && o.Set {
		c.fail(UnsupportedParam(name, "%s", msg))
	}
}
