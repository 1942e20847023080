package ort

import (
	"fmt"
	"slices"

	onnxruntime "github.com/yalue/onnxruntime_go"
)

// TensorInfo describes one input or output of a graph.
type TensorInfo struct {
	Name string
	// Type is the tensor's element type; 0 for a value that is not a tensor (a
	// sequence, a map).
	Type ElemType
	// Shape holds the tensor's dimensions, -1 where one is symbolic (a batch, a
	// sequence length).
	Shape []int64
}

// ModelIO reads the inputs and outputs of the ONNX model at modelPath, in the graph's
// order, through onnxruntime_go. It loads the model once without graph optimisation on
// one thread, which is cheap next to a session that optimises it, so a caller can check
// a graph before it opens one.
func ModelIO(modelPath string) (inputs, outputs []TensorInfo, err error) {
	if err := needInit("ModelIO"); err != nil {
		return nil, nil, err
	}
	so, err := onnxruntime.NewSessionOptions()
	if err != nil {
		return nil, nil, fmt.Errorf("ort: session options: %s", oneLine(err.Error()))
	}
	defer so.Destroy()
	if err := so.SetGraphOptimizationLevel(onnxruntime.GraphOptimizationLevelDisableAll); err != nil {
		return nil, nil, fmt.Errorf("ort: session options: %s", oneLine(err.Error()))
	}
	if err := so.SetIntraOpNumThreads(1); err != nil {
		return nil, nil, fmt.Errorf("ort: session options: %s", oneLine(err.Error()))
	}
	ins, outs, err := onnxruntime.GetInputOutputInfoWithOptions(modelPath, so)
	if err != nil {
		return nil, nil, fmt.Errorf("ort: cannot load %s: %s", modelPath, oneLine(err.Error()))
	}
	return tensorInfos(ins), tensorInfos(outs), nil
}

// tensorInfos converts onnxruntime_go's descriptions, whose element types carry ONNX's
// numbers as ElemType does.
func tensorInfos(values []onnxruntime.InputOutputInfo) []TensorInfo {
	infos := make([]TensorInfo, len(values))
	for i, v := range values {
		infos[i].Name = v.Name
		if v.OrtValueType == onnxruntime.ONNXTypeTensor {
			infos[i].Type, infos[i].Shape = ElemType(v.DataType), slices.Clone([]int64(v.Dimensions))
		}
	}
	return infos
}
