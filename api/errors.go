package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/conveyor-llm/conveyor/engine"
)

// Errors of the HTTP layer itself. Together with the engine's sentinel errors they are
// mapped to a status, an OpenAI error type and a code by statusTable, the one place
// that decides what a failure looks like on the wire.
var (
	errNotFound         = errors.New("not found")
	errMethodNotAllowed = errors.New("method not allowed")
	errModelNotFound    = errors.New("model not found")
	errUnauthorized     = errors.New("unauthorized")
	errBodyTooLarge     = errors.New("request body too large")
	errContentEncoding  = errors.New("unsupported content encoding")
	errUnsupported      = errors.New("unsupported parameter")
	errUnsupportedValue = errors.New("unsupported value")
	errNotReady         = errors.New("server not ready")
)

// statusEntry is one row of the error table.
type statusEntry struct {
	target error
	status int
	typ    string
	code   string
}

// statusTable maps errors (matched with errors.Is, first match wins) to HTTP statuses.
var statusTable = []statusEntry{
	{engine.ErrPromptTooLong, http.StatusBadRequest, "invalid_request_error", "context_length_exceeded"},
	{engine.ErrInvalidRequest, http.StatusBadRequest, "invalid_request_error", "invalid_value"},
	{errUnsupported, http.StatusBadRequest, "invalid_request_error", "unsupported_parameter"},
	{errUnsupportedValue, http.StatusBadRequest, "invalid_request_error", "unsupported_value"},
	{errUnauthorized, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key"},
	{errModelNotFound, http.StatusNotFound, "invalid_request_error", "model_not_found"},
	{errNotFound, http.StatusNotFound, "invalid_request_error", "not_found"},
	{errMethodNotAllowed, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed"},
	{errBodyTooLarge, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large"},
	{errContentEncoding, http.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_content_encoding"},
	{engine.ErrOverloaded, http.StatusTooManyRequests, "rate_limit_error", "overloaded"},
	{engine.ErrClosed, http.StatusServiceUnavailable, "server_error", "unavailable"},
	{errNotReady, http.StatusServiceUnavailable, "server_error", "unavailable"},
	{engine.ErrModel, http.StatusInternalServerError, "server_error", "model_error"},
	{engine.ErrInternal, http.StatusInternalServerError, "server_error", "internal_error"},
}

// wrappedErr carries a message and a sentinel to classify.
type wrappedErr struct {
	msg  string
	kind error
}

func (e *wrappedErr) Error() string { return e.msg }
func (e *wrappedErr) Unwrap() error { return e.kind }

// errorf is an error of the given kind (one of the sentinels statusTable knows).
func errorf(kind error, format string, args ...any) error {
	return &wrappedErr{msg: fmt.Sprintf(format, args...), kind: kind}
}

// paramError is a bad request field: it names the parameter and wraps the kind of failure
// (engine.ErrInvalidRequest, errUnsupported, errUnsupportedValue, engine.ErrPromptTooLong).
type paramError struct {
	param string
	msg   string
	kind  error
}

func (e *paramError) Error() string { return e.msg }
func (e *paramError) Unwrap() error { return e.kind }

// invalidParam reports a malformed or out-of-range field (HTTP 400).
func invalidParam(param, format string, args ...any) error {
	return &paramError{param: param, msg: fmt.Sprintf(format, args...), kind: engine.ErrInvalidRequest}
}

// unsupportedParam reports a field the server understands but does not implement (HTTP 400).
func unsupportedParam(param, format string, args ...any) error {
	return &paramError{param: param, msg: fmt.Sprintf(format, args...), kind: errUnsupported}
}

// unsupportedValue reports a value of a field that the server does not implement, where
// other values of it are accepted (HTTP 400).
func unsupportedValue(param, format string, args ...any) error {
	return &paramError{param: param, msg: fmt.Sprintf(format, args...), kind: errUnsupportedValue}
}

// errorBody is the OpenAI error object: {"error":{"message","type","param","code"}}.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// classify maps err to its status and wire error object.
func classify(err error) (int, errorBody) {
	status, typ, code := http.StatusInternalServerError, "server_error", "internal_error"
	for _, e := range statusTable {
		if errors.Is(err, e.target) {
			status, typ, code = e.status, e.typ, e.code
			break
		}
	}
	body := errorBody{Error: errorDetail{Message: err.Error(), Type: typ}}
	if code != "" {
		body.Error.Code = &code
	}
	var pe *paramError
	var ep *engine.ParamError
	switch {
	case errors.As(err, &pe) && pe.param != "":
		p := pe.param
		body.Error.Param = &p
	case errors.As(err, &ep):
		p := ep.Param
		body.Error.Param = &p
	}
	return status, body
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
