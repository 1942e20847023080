package api

import (
	"context"
	"errors"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
)

// TestE2EUnsupportedFeaturesAreRefused sends the SDK's own encodings of response_format
// and tools to the real server: {"type":"text"} is served, a structured format and a
// tool are refused with a 400 naming the parameter.
func TestE2EUnsupportedFeaturesAreRefused(t *testing.T) {
	e := startE2E(t, nil, nil)
	ctx := context.Background()
	base := openai.ChatCompletionNewParams{Model: e2eModel, MaxCompletionTokens: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")}}

	text := base
	text.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfText: &shared.ResponseFormatTextParam{}}
	text.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}
	if r, err := e.client.Chat.Completions.New(ctx, text); err != nil || len(r.Choices) != 1 {
		t.Fatalf("response_format text: %v", err)
	}

	for _, tc := range []struct {
		name, param, code string
		mod               func(*openai.ChatCompletionNewParams)
	}{
		{"json_object", "response_format", "unsupported_value", func(p *openai.ChatCompletionNewParams) {
			p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}
		}},
		{"tools", "tools", "unsupported_parameter", func(p *openai.ChatCompletionNewParams) {
			p.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "lookup"})}
		}},
	} {
		p := base
		tc.mod(&p)
		_, err := e.client.Chat.Completions.New(ctx, p)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != tc.param || apiErr.Code != tc.code {
			t.Errorf("%s: want a 400 naming %s (%s), got %v", tc.name, tc.param, tc.code, err)
		}
	}
}
