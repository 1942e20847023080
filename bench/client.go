package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/r3labs/sse/v2"
)

// maxEventBytes bounds one SSE event; a completion chunk is far smaller.
const maxEventBytes = 1 << 20

// Target is an OpenAI-compatible server.
type Target struct {
	BaseURL string // e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)
	Model   string
	APIKey  string // sent as a Bearer token when set
	Client  *http.Client
	// ResponseFormat, when set, is sent as every request's response_format (structured
	// output), e.g. {"type":"json_object"}.
	ResponseFormat json.RawMessage
	// Temperature and TopP are every request's sampling: 0 and 0 (or 1) are greedy
	// decoding, as the zero Target sends.
	Temperature, TopP float64
}

func (t Target) completionsURL() string {
	base := strings.TrimRight(t.BaseURL, "/")
	base = strings.TrimSuffix(base, "/v1")
	return base + "/v1/completions"
}

type completionRequest struct {
	Model         string         `json:"model"`
	Prompt        []int32        `json:"prompt"`
	MaxTokens     int            `json:"max_tokens"`
	Temperature   float64        `json:"temperature"`
	TopP          float64        `json:"top_p,omitempty"`
	Stream        bool           `json:"stream"`
	StreamOptions map[string]any `json:"stream_options"`
	IgnoreEOS     bool           `json:"ignore_eos"`
	// ResponseFormat: a constrained reply ends when its value does, ignore_eos or not.
	ResponseFormat json.RawMessage `json:"response_format,omitempty"`
}

type completionChunk struct {
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// Send streams one completion and measures it at the client. A failure is reported in
// Result.Err, never dropped.
func (t Target) Send(ctx context.Context, it Item) Result {
	res := Result{PromptTokens: len(it.Prompt)}
	body, err := json.Marshal(completionRequest{
		Model: t.Model, Prompt: it.Prompt, MaxTokens: it.MaxTokens, Stream: true, Temperature: t.Temperature, TopP: t.TopP,
		StreamOptions: map[string]any{"include_usage": true}, IgnoreEOS: true, ResponseFormat: t.ResponseFormat,
	})
	if err != nil {
		res.Err = err.Error()
		return res
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.completionsURL(), bytes.NewReader(body))
	if err != nil {
		res.Err = err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if t.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+t.APIKey)
	}
	client := t.Client
	if client == nil {
		client = http.DefaultClient
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		res.Err = errorText(err)
		return res
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		res.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, apiErrorMessage(msg))
		return res
	}
	reader := sse.NewEventStreamReader(resp.Body, maxEventBytes)
	var last time.Time
	chunks, usageTokens, done := 0, -1, false
	for {
		ev, err := reader.ReadEvent()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			res.Err = "stream broken: " + errorText(err)
			return res
		}
		data, ok := eventData(ev)
		if !ok {
			continue // comment or keep-alive
		}
		if string(data) == "[DONE]" {
			done = true
			break
		}
		var c completionChunk
		if err := json.Unmarshal(data, &c); err != nil {
			res.Err = "malformed chunk: " + err.Error()
			return res
		}
		if c.Error != nil {
			res.Err = "stream error: " + c.Error.Message
			return res
		}
		if c.Usage != nil {
			usageTokens = c.Usage.CompletionTokens
		}
		for _, ch := range c.Choices {
			if ch.Text == "" {
				continue
			}
			now := time.Now()
			if chunks == 0 {
				res.TTFT = now.Sub(start)
			} else {
				res.ITL = append(res.ITL, now.Sub(last))
			}
			last = now
			chunks++
		}
	}
	if !done {
		res.Err = "stream ended without [DONE]"
		return res
	}
	res.E2E = time.Since(start)
	res.OutputTokens = chunks
	if usageTokens >= 0 {
		res.OutputTokens = usageTokens
	}
	if chunks == 0 {
		res.TTFT = res.E2E
	}
	return res
}

// eventData joins an event's data lines; ok is false for events without data (comments).
func eventData(ev []byte) ([]byte, bool) {
	var out [][]byte
	for _, line := range bytes.FieldsFunc(ev, func(r rune) bool { return r == '\n' || r == '\r' }) {
		if rest, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			out = append(out, bytes.TrimPrefix(rest, []byte(" ")))
		}
	}
	if out == nil {
		return nil, false
	}
	return bytes.Join(out, []byte("\n")), true
}

func apiErrorMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return strings.TrimSpace(string(body))
}

// errorText drops the method and URL that net/http puts around transport errors, so
// identical failures group together.
func errorText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// FirstModel asks the server's /v1/models for the id of its first model.
func FirstModel(ctx context.Context, t Target) (string, error) {
	base := strings.TrimSuffix(strings.TrimRight(t.BaseURL, "/"), "/v1")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	if t.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+t.APIKey)
	}
	client := t.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("list models at %s: %s", base, errorText(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("list models at %s: HTTP %d: %s", base, resp.StatusCode, apiErrorMessage(body))
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil || len(list.Data) == 0 {
		return "", fmt.Errorf("list models at %s: no model in the answer; pass --model", base)
	}
	return list.Data[0].ID, nil
}
