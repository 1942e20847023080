package engine

// faultHooks are the engine's fault-injection points. Only tests set them (an engine's
// faults field is unexported and nil unless a _test.go file of this package fills it
// in before Start), so the shipped binary has no way to turn them on; a nil hook, or a
// nil faultHooks, does nothing. The runner's own faults (a failing or slow forward
// pass) need no hook: tests wrap the Model.
type faultHooks struct {
	// beforeSample runs on the engine goroutine before a token of request id is sampled;
	// a test makes one request's sampling panic with it.
	beforeSample func(id string)
}

// sample calls beforeSample.
func (f *faultHooks) sample(id string) {
	if f != nil && f.beforeSample != nil {
		f.beforeSample(id)
	}
}
