package models

import (
	"strings"

	"github.com/conveyor-llm/conveyor/models/ort"
)

// Package ort (models/ort) owns ONNX Runtime: the library, its environment and shared
// pool, Conveyor's operators, devices. The names below are its, kept here for the
// packages that load ONNX Runtime through models.

// ORTLibEnv is the environment variable that names the ONNX Runtime shared library
// when no explicit path is given (ort.LibEnv).
const ORTLibEnv = ort.LibEnv

// DefaultORTLib is where `make ort` puts the ONNX Runtime shared library, relative to
// the working directory (ort.DefaultLib).
const DefaultORTLib = ort.DefaultLib

// ErrORT means the ONNX Runtime shared library could not be found, loaded or
// initialised (ort.ErrUnavailable).
var ErrORT = ort.ErrUnavailable

// InitORT loads the ONNX Runtime shared library and creates the process's environment
// with its shared pool of all cores (ort.Init).
func InitORT(libPath string) error { return ort.Init(libPath) }

// ORTVersion returns the loaded ONNX Runtime's version string, or "" before InitORT
// (ort.Version).
func ORTVersion() string { return ort.Version() }

// oneLine collapses a multi-line message (ONNX Runtime's often span lines) onto one line.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}
