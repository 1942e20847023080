package models

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// ortChildEnv makes the test binary a child process of TestORTLibraryErrors instead of
// running the tests: it opens a runner with the library the variable names, in a
// process that has loaded no other, and prints the error.
const ortChildEnv = "CONVEYOR_TEST_ORT_CHILD"

func TestMain(m *testing.M) {
	if path := os.Getenv(ortChildEnv); path != "" {
		os.Exit(ortLibraryChild(path))
	}
	os.Exit(m.Run())
}

// ortLibraryChild opens a runner with the ONNX Runtime library at path, which must fail
// with a one-line ErrORT; it prints "ORT-ERROR: " and the error, and returns the exit
// status.
func ortLibraryChild(path string) int {
	dir, err := os.MkdirTemp("", "ort-child-")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer os.RemoveAll(dir)
	_, err = OpenDense(dir, RunnerOptions{ORTLib: path})
	switch {
	case !errors.Is(err, ErrORT):
		fmt.Printf("OpenDense with library %s: err = %v, want ErrORT\n", path, err)
		return 1
	case strings.Contains(err.Error(), "\n"):
		fmt.Printf("error spans lines: %q\n", err)
		return 1
	}
	fmt.Printf("ORT-ERROR: %v\n", err)
	return 0
}
