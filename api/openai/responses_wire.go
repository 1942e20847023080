package openai

import "encoding/json"

// ResponsesRequest is the wire schema of POST /v1/responses.
type ResponsesRequest struct {
	Model           opt[string]          `json:"model"`
	Input           opt[json.RawMessage] `json:"input"` // a string or an array of items
	Instructions    opt[string]          `json:"instructions"`
	MaxOutputTokens opt[jsonInt]         `json:"max_output_tokens"`
	Temperature     opt[float64]         `json:"temperature"`
	TopP            opt[float64]         `json:"top_p"`
	Stream          opt[bool]            `json:"stream"`
	StreamOptions   opt[struct {
		IncludeObfuscation opt[bool] `json:"include_obfuscation"` // accepted, not used
	}] `json:"stream_options"`
	Store              opt[bool]              `json:"store"`
	Background         opt[bool]              `json:"background"`
	PreviousResponseID opt[string]            `json:"previous_response_id"`
	Tools              opt[[]json.RawMessage] `json:"tools"`
	ToolChoice         opt[json.RawMessage]   `json:"tool_choice"`
	ParallelToolCalls  opt[bool]              `json:"parallel_tool_calls"`
	Text               opt[json.RawMessage]   `json:"text"` // responsesText
	Metadata           opt[map[string]string] `json:"metadata"`
	User               opt[string]            `json:"user"`
	Truncation         opt[string]            `json:"truncation"`
	Include            opt[[]string]          `json:"include"`
	Reasoning          opt[struct {
		Effort  opt[string]     `json:"effort"`
		Summary json.RawMessage `json:"summary"`
	}] `json:"reasoning"`
	TopLogprobs opt[jsonInt] `json:"top_logprobs"`

	// Refused by name: Conveyor does not implement them.
	MaxToolCalls      opt[json.RawMessage] `json:"max_tool_calls"`
	Conversation      opt[json.RawMessage] `json:"conversation"`
	Prompt            opt[json.RawMessage] `json:"prompt"`
	ContextManagement opt[json.RawMessage] `json:"context_management"`
	Moderation        opt[json.RawMessage] `json:"moderation"`

	platformHints // accepted, no-ops

	// Extensions, with the chat endpoint's names.
	Seed             opt[jsonInt]  `json:"seed"`
	Stop             opt[stopList] `json:"stop"`
	PresencePenalty  opt[float64]  `json:"presence_penalty"`
	FrequencyPenalty opt[float64]  `json:"frequency_penalty"`
	samplingExtensions
}

// responsesText is text: {"format": {...}, "verbosity"}.
type responsesText struct {
	Format    opt[responsesFormat] `json:"format"`
	Verbosity opt[string]          `json:"verbosity"`
}

// responsesFormat is text.format: response_format with the json_schema members inline.
type responsesFormat struct {
	Type        opt[string]     `json:"type"`
	Name        opt[string]     `json:"name"`
	Description opt[string]     `json:"description"`
	Schema      json.RawMessage `json:"schema"`
	Strict      opt[bool]       `json:"strict"`
}

// inputItem is one element of input (and of a stored conversation) as sent.
type inputItem struct {
	Type      opt[string]          `json:"type"`
	ID        opt[string]          `json:"id"`
	Status    opt[string]          `json:"status"`
	Role      opt[string]          `json:"role"`
	Content   opt[json.RawMessage] `json:"content"`
	CallID    opt[string]          `json:"call_id"`
	Name      opt[string]          `json:"name"`
	Arguments opt[string]          `json:"arguments"`
	Output    opt[json.RawMessage] `json:"output"`
}

// inputPart is one content part of an input message.
type inputPart struct {
	Type opt[string] `json:"type"`
	Text opt[string] `json:"text"`
}

// ResponseItem is an item as the server returns it: an output item, an input item of
// /input_items, and an element of a stored conversation.
type ResponseItem struct {
	Type      string            `json:"type"` // message, function_call, function_call_output
	ID        string            `json:"id"`
	Status    string            `json:"status,omitempty"`
	Role      string            `json:"role,omitempty"`
	Content   []ResponseContent `json:"content,omitempty"`
	CallID    string            `json:"call_id,omitempty"`
	Name      string            `json:"name,omitempty"`
	Arguments *string           `json:"arguments,omitempty"`
	Output    *string           `json:"output,omitempty"`
}

// MarshalJSON implements json.Marshaler: a message always carries its content array,
// empty while a streamed message has no part yet.
func (it ResponseItem) MarshalJSON() ([]byte, error) {
	type plain ResponseItem // without this method
	if it.Type != "message" {
		return json.Marshal(plain(it))
	}
	content := it.Content
	if content == nil {
		content = []ResponseContent{}
	}
	return json.Marshal(struct {
		plain
		Content []ResponseContent `json:"content"`
	}{plain(it), content})
}

// ResponseContent is one content part of a message item: input_text, or output_text with
// its (always empty) annotations and logprobs.
type ResponseContent struct {
	Type        string          `json:"type"`
	Text        string          `json:"text"`
	Annotations json.RawMessage `json:"annotations,omitempty"`
	Logprobs    json.RawMessage `json:"logprobs,omitempty"`
}

var emptyArray = json.RawMessage("[]")

func outputText(text string) ResponseContent {
	return ResponseContent{Type: "output_text", Text: text, Annotations: emptyArray, Logprobs: emptyArray}
}

// Response is the response object: what POST returns, GET reads and the stream's
// response.* events carry.
type Response struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	CompletedAt        *int64             `json:"completed_at"`
	Status             string             `json:"status"`
	Background         bool               `json:"background"`
	Error              *ResponseError     `json:"error"`
	IncompleteDetails  *IncompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	MaxOutputTokens    *int64             `json:"max_output_tokens"`
	Model              string             `json:"model"`
	Output             []ResponseItem     `json:"output"`
	OutputText         string             `json:"output_text"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Reasoning          json.RawMessage    `json:"reasoning"`
	Store              bool               `json:"store"`
	Temperature        float64            `json:"temperature"`
	TopP               float64            `json:"top_p"`
	Text               json.RawMessage    `json:"text"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              []json.RawMessage  `json:"tools"`
	Truncation         string             `json:"truncation"`
	Usage              *ResponseUsage     `json:"usage"`
	User               *string            `json:"user"`
	Metadata           map[string]string  `json:"metadata"`
}

// ResponseError is a failed response's error.
type ResponseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// IncompleteDetails says why a response is incomplete ("max_output_tokens").
type IncompleteDetails struct {
	Reason string `json:"reason"`
}

// ResponseUsage is the Responses API's usage object.
type ResponseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// Statuses of a Response (and of its items: in_progress, completed, incomplete).
const (
	StatusQueued     = "queued"
	StatusInProgress = "in_progress"
	StatusCompleted  = "completed"
	StatusIncomplete = "incomplete"
	StatusFailed     = "failed"
	StatusCancelled  = "cancelled"
)

// ResponseEvent is one event of a streamed response; each type uses some members.
type ResponseEvent struct {
	Type           string           `json:"type"`
	SequenceNumber int              `json:"sequence_number"`
	Response       *Response        `json:"response,omitempty"`
	OutputIndex    *int             `json:"output_index,omitempty"`
	ContentIndex   *int             `json:"content_index,omitempty"`
	ItemID         string           `json:"item_id,omitempty"`
	Item           *ResponseItem    `json:"item,omitempty"`
	Part           *ResponseContent `json:"part,omitempty"`
	Delta          *string          `json:"delta,omitempty"`
	Text           *string          `json:"text,omitempty"`
	Arguments      *string          `json:"arguments,omitempty"`
	Name           string           `json:"name,omitempty"`
	Logprobs       json.RawMessage  `json:"logprobs,omitempty"`
	// The error event's members.
	Code    *string `json:"code,omitempty"`
	Message string  `json:"message,omitempty"`
	Param   *string `json:"param,omitempty"`
}

// ItemList is a page of /v1/responses/{id}/input_items.
type ItemList struct {
	Object  string         `json:"object"`
	Data    []ResponseItem `json:"data"`
	FirstID *string        `json:"first_id"`
	LastID  *string        `json:"last_id"`
	HasMore bool           `json:"has_more"`
}

// ResponseDeleted is DELETE /v1/responses/{id}'s answer.
type ResponseDeleted struct {
	Deleted bool   `json:"deleted"`
	ID      string `json:"id"`
	Object  string `json:"object"`
}
