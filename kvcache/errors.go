package kvcache

import "errors"

// Sentinel errors. Returned errors wrap one of these; test with errors.Is.
var (
	// ErrCorrupt means an internal invariant of the pool is broken (see Pool.CheckInvariants).
	ErrCorrupt = errors.New("kvcache: corrupt state")
	// ErrInvalid means an argument is out of range: an unknown sequence, a buffer of the wrong
	// size, a block id outside the pool, a configuration that cannot work.
	ErrInvalid = errors.New("kvcache: invalid argument")
)
