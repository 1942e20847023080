package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
)

// statusEntry is one row of the error table.
type statusEntry struct {
	target error
	status int
	typ    string
	code   string
}

// statusTable maps errors (matched with errors.Is, first match wins) to HTTP statuses: the
// engine's sentinel errors and the kinds of failure package openai names. It is the one
// place that decides what a failure looks like on the wire.
var statusTable = []statusEntry{
	{engine.ErrPromptTooLong, http.StatusBadRequest, "invalid_request_error", "context_length_exceeded"},
	{engine.ErrInvalidRequest, http.StatusBadRequest, "invalid_request_error", "invalid_value"},
	{openai.ErrUnsupported, http.StatusBadRequest, "invalid_request_error", "unsupported_parameter"},
	{openai.ErrUnsupportedValue, http.StatusBadRequest, "invalid_request_error", "unsupported_value"},
	{openai.ErrUnauthorized, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key"},
	{openai.ErrModelNotFound, http.StatusNotFound, "invalid_request_error", "model_not_found"},
	{openai.ErrNotFound, http.StatusNotFound, "invalid_request_error", "not_found"},
	{openai.ErrMethodNotAllowed, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed"},
	{openai.ErrBodyTooLarge, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large"},
	{openai.ErrContentEncoding, http.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_content_encoding"},
	{engine.ErrOverloaded, http.StatusTooManyRequests, "rate_limit_error", "overloaded"},
	{engine.ErrClosed, http.StatusServiceUnavailable, "server_error", "unavailable"},
	{openai.ErrNotReady, http.StatusServiceUnavailable, "server_error", "unavailable"},
	{engine.ErrModel, http.StatusInternalServerError, "server_error", "model_error"},
	{engine.ErrInternal, http.StatusInternalServerError, "server_error", "internal_error"},
}

// classify maps err to its status and wire error object.
func classify(err error) (int, openai.ErrorBody) {
	status, typ, code := http.StatusInternalServerError, "server_error", "internal_error"
	for _, e := range statusTable {
		if errors.Is(err, e.target) {
			status, typ, code = e.status, e.typ, e.code
			break
		}
	}
	body := openai.ErrorBody{Error: openai.ErrorDetail{Message: err.Error(), Type: typ}}
	if code != "" {
		body.Error.Code = &code
	}
	var pe *openai.ParamError
	var ep *engine.ParamError
	switch {
	case errors.As(err, &pe) && pe.Param != "":
		p := pe.Param
		body.Error.Param = &p
	case errors.As(err, &ep):
		p := ep.Param
		body.Error.Param = &p
	}
	return status, body
}

// errorCode is the error object's code of err ("server_error" when it has none), as a
// failed response of the Responses API reports it.
func errorCode(err error) string {
	if _, body := classify(err); body.Error.Code != nil {
		return *body.Error.Code
	}
	return "server_error"
}

// writeError writes err as an OpenAI error response with the status from statusTable.
func writeError(w http.ResponseWriter, err error) {
	status, body := classify(err)
	switch status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
	case http.StatusRequestEntityTooLarge:
		// The rest of the body is not read (limitBody discards a bounded amount of it), so
		// the connection cannot carry another request.
		w.Header().Set("Connection", "close")
	}
	writeJSON(w, status, body)
}

// writeJSON writes v as a JSON response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"response encoding failed","type":"server_error","param":null,"code":"internal_error"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
