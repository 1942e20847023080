// Package modeldir describes the files of a model directory that both the graph
// builder (models/convert) and the runtime (models) read: the id lists of config.json
// (an integer, a list or null), generation_config.json with its sampling defaults, and
// paged/paged.json, the manifest of the paged-attention layout (PagedManifest: segment
// files, embedding table, each layer's attention.Params). Of Conveyor's packages it
// imports only models/attention (for those parameters), so the builder and the runtime
// stay independent of each other.
//
// Example:
//
//	g, err := modeldir.LoadGenerationConfig(dir) // a missing file is a zero config
//	if err != nil {
//		return err
//	}
//	eos := modeldir.MergeEOS(configEOS, g)
package modeldir
