package convert

import (
	"testing"

	"github.com/conveyor-llm/conveyor/models/kernels"
)

// TestOwnOpNames: the graphs name the operator the runtime registers.
func TestOwnOpNames(t *testing.T) {
	if convDomain != kernels.Int8Domain || convInt8Linear != kernels.Int8OpName {
		t.Fatalf("graphs use %s.%s, the runtime registers %s.%s", convDomain, convInt8Linear, kernels.Int8Domain, kernels.Int8OpName)
	}
}
