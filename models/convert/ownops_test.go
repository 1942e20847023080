package convert

import (
	"testing"

	"github.com/conveyor-llm/conveyor/models/int8gemm"
)

// TestOwnOpNames: the graphs name the operator the runtime registers.
func TestOwnOpNames(t *testing.T) {
	if convDomain != int8gemm.Domain || convInt8Linear != int8gemm.OpName {
		t.Fatalf("graphs use %s.%s, the runtime registers %s.%s", convDomain, convInt8Linear, int8gemm.Domain, int8gemm.OpName)
	}
}
