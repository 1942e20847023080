package engine

import (
	"fmt"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models"
)

// kvDType checks the model's K/V element type (the cache's enum: models.DType is
// kvcache.DType) and returns it.
func kvDType(d models.DType) (kvcache.DType, error) {
	if d.Size() == 0 {
		return 0, fmt.Errorf("%w: unsupported K/V dtype %v", ErrInvalidConfig, d)
	}
	return d, nil
}
