package openai

import (
	"errors"
	"fmt"

	"github.com/conveyor-llm/conveyor/engine"
)

// The kinds of failure the OpenAI error object reports besides the engine's sentinel
// errors: what the converters find wrong with a request, and what the server refuses
// before or around them. The HTTP layer's one table (api's statusTable) maps each to a
// status, an OpenAI error type and a code.
var (
	// ErrUnsupported is a parameter the server understands but does not implement.
	ErrUnsupported = errors.New("unsupported parameter")
	// ErrUnsupportedValue is a value of a parameter the server does not implement, where
	// other values of it are served.
	ErrUnsupportedValue = errors.New("unsupported value")
	// ErrModelNotFound is a model the server does not serve.
	ErrModelNotFound = errors.New("model not found")
	// ErrNotFound is anything else that does not exist: a route, a stored response.
	ErrNotFound = errors.New("not found")
	// ErrMethodNotAllowed is a route asked for with a method it does not answer.
	ErrMethodNotAllowed = errors.New("method not allowed")
	// ErrUnauthorized is a missing or wrong API key.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrBodyTooLarge is a request body over the server's limit.
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrContentEncoding is a compressed request body.
	ErrContentEncoding = errors.New("unsupported content encoding")
	// ErrNotReady is a server that cannot serve yet or any more: its model is loading, or
	// it is shutting down.
	ErrNotReady = errors.New("server not ready")
)

// kindError carries a message and a kind to classify.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// Errorf returns an error of the given kind (one of the sentinels the status table knows)
// whose message is the format's alone.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{msg: fmt.Sprintf(format, args...), kind: kind}
}

// ParamError is a bad request member: it names the parameter (the error object's
// "param"; empty for the body as a whole) and wraps the kind of failure
// (engine.ErrInvalidRequest, ErrUnsupported, ErrUnsupportedValue, ErrModelNotFound,
// engine.ErrPromptTooLong).
type ParamError struct {
	Param   string
	Message string
	Kind    error
}

func (e *ParamError) Error() string { return e.Message }
func (e *ParamError) Unwrap() error { return e.Kind }

// InvalidParam reports a malformed or out-of-range member (HTTP 400).
func InvalidParam(param, format string, args ...any) error {
	return &ParamError{Param: param, Message: fmt.Sprintf(format, args...), Kind: engine.ErrInvalidRequest}
}

// UnsupportedParam reports a member the server understands but does not implement (HTTP 400).
func UnsupportedParam(param, format string, args ...any) error {
	return &ParamError{Param: param, Message: fmt.Sprintf(format, args...), Kind: ErrUnsupported}
}

// UnsupportedValue reports a value of a member that the server does not implement, where
// other values of it are accepted (HTTP 400).
func UnsupportedValue(param, format string, args ...any) error {
	return &ParamError{Param: param, Message: fmt.Sprintf(format, args...), Kind: ErrUnsupportedValue}
}

// ModelNotFound is the error for a model this server does not serve (HTTP 404).
func ModelNotFound(name string) error {
	return &ParamError{Param: "model", Kind: ErrModelNotFound, Message: fmt.Sprintf("the model %q does not exist", name)}
}

// WireError is an engine rule's error as the endpoint reports it: the parameter named as
// the endpoint names it (names, Generation.Names), and the prompt it is about when the
// request has several.
func WireError(err error, names map[string]string, prompt int, several bool) error {
	var pe *engine.ParamError
	if !errors.As(err, &pe) {
		if !errors.Is(err, engine.ErrPromptTooLong) {
			return err
		}
		pe = &engine.ParamError{Param: "prompt", Problem: "does not fit: " + err.Error(), Kind: err}
	}
	param := pe.Param
	if name, ok := names[param]; ok {
		param = name
	}
	label := param
	if pe.Param == "prompt" && several {
		label = fmt.Sprintf("%s[%d]", param, prompt)
	}
	return &ParamError{Param: param, Message: pe.Named(label), Kind: pe.Kind}
}

// ErrorBody is the OpenAI error object: {"error":{"message","type","param","code"}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the error object's content; param and code are null when not set.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}
