package engine

import (
	"fmt"

	"github.com/conveyor-llm/conveyor/kvcache"
	"github.com/conveyor-llm/conveyor/models"
)

// kvDType maps the model's K/V element type onto the cache's.
func kvDType(d models.DType) (kvcache.DType, error) {
	switch d {
	case models.Float32:
		return kvcache.Float32, nil
	case models.Float16:
		return kvcache.Float16, nil
	}
	return 0, fmt.Errorf("%w: unsupported K/V dtype %v", ErrInvalidConfig, d)
}
