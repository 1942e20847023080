// Package modeldir describes the files of a model directory that both the graph
// builder (models/build) and the runtime (models) read: the id lists of config.json
// (an integer, a list or null) and generation_config.json with its sampling defaults.
// It imports no other package of Conveyor, so the builder and the runtime stay
// independent of each other.
//
// Example:
//
//	g, err := modeldir.LoadGenerationConfig(dir) // a missing file is a zero config
//	if err != nil {
//		return err
//	}
//	eos := modeldir.MergeEOS(configEOS, g)
package modeldir
