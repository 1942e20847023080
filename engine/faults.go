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
	// acceptProposal, when it returns true, makes verification take the proposal as the
	// row's token without sampling: a broken acceptance rule, which the statistical test of
	// speculative decoding must detect.
	acceptProposal func(proposal int32, logits []float32) bool
}

// accept calls acceptProposal.
func (f *faultHooks) accept(proposal int32, logits []float32) bool {
	return f != nil && f.acceptProposal != nil && f.acceptProposal(proposal, logits)
}

// sample calls beforeSample.
func (f *faultHooks) sample(id string) {
	if f != nil && f.beforeSample != nil {
		f.beforeSample(id)
	}
}
