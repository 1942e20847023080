// Package modeldir describes the files of a model directory that both the graph
// builder (models/convert) and the runtime (models) read: the id lists of config.json
// (an integer, a list or null), generation_config.json with its sampling defaults, and
// step/step.json, the manifest of the step graph (StepManifest: the graph's file, its
// float and cache types, its PagedAttention domain, shapes, windows and layer groups,
// and the names of its inputs and outputs). It imports none of Conveyor's packages, so
// the builder and the runtime stay independent of each other.
//
// Example:
//
//	g, err := modeldir.LoadGenerationConfig(dir) // a missing file is a zero config
//	if err != nil {
//		return err
//	}
//	eos := modeldir.MergeEOS(configEOS, g)
package modeldir
