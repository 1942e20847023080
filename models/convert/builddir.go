package convert

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// modelDirSideFiles are copied next to model.onnx when the source has them.
var modelDirSideFiles = []string{"generation_config.json", "tokenizer.json", "tokenizer_config.json"}

// BuildResult describes a model directory written by BuildFromHF or BuildRandom.
type BuildResult struct {
	// Params is the number of weights in the model.
	Params int64
	// Files lists the paths written, model.onnx first.
	Files []string
	// ContextCapped, when positive, is the context length the model was limited to,
	// below config.json's max_position_embeddings (longrope beyond its original context).
	ContextCapped int
}

// BuildFromHF converts a Hugging Face Llama-family checkpoint directory (config.json
// plus model.safetensors or sharded *.safetensors with model.safetensors.index.json)
// into a Conveyor model directory: outDir/model.onnx (+ model.onnx.data for models
// over ~2 GB) for the dense Optimum interface, outDir/step/ for the step graph,
// config.json, and generation_config.json, tokenizer.json and tokenizer_config.json when
// hfDir has them. o says how (the zero Options: float32 weights and step graph).
//
// outDir is replaced as a whole, and only once the build has succeeded: a failed or
// interrupted build leaves it as it was (see buildInto). An existing outDir must hold
// nothing but a build's files. A checkpoint without tokenizer.json builds a model
// directory without one, which serves only once it has one: CheckTokenizer refuses it
// first for a build meant to be served.
func BuildFromHF(hfDir, outDir string, o Options) (*BuildResult, error) {
	if err := notGGUF(hfDir); err != nil {
		return nil, err
	}
	return buildModelDir(outDir, func(dir string) (*BuildResult, error) { return buildFromHF(hfDir, dir, o) })
}

// buildFromHF is BuildFromHF writing straight into dir.
func buildFromHF(hfDir, dir string, o Options) (*BuildResult, error) {
	cfg, err := LoadConfig(hfDir)
	if err != nil {
		return nil, err
	}
	if err := checkBuildMemory(hfDir, cfg); err != nil {
		return nil, err
	}
	w, err := LoadSafetensorsDir(hfDir)
	if err != nil {
		return nil, err
	}
	return buildDir(cfg, textWeights(cfg, w), filepath.Join(hfDir, "config.json"), hfDir, dir, o, writeOptions{})
}

// Options are a build's choices beyond the checkpoint.
type Options struct {
	// Quantize stores the linear layers' weights quantized (see Quantization).
	Quantize Quantization
	// StepDType is the float type of the step graph (step/): Float32 (the default) runs
	// on CPUs with Conveyor's own PagedAttention, Float16 and BFloat16 on NVIDIA GPUs
	// with ONNX Runtime's.
	StepDType DType
	// StepKVDType is the KV cache's element type of a float32 step graph: Float32 (the
	// zero value) or Float16 (half the bytes per token; Conveyor's PagedAttention rounds
	// new keys and values as it stores them). A 16-bit step graph's cache is its own type.
	StepKVDType DType
}

// BuildRandom writes a model directory for the config.json at configPath with seeded
// random weights (see RandomWeights). Tokenizer and generation files found next to
// configPath are copied too, so a test model can be served with a real tokenizer. o is as
// BuildFromHF's, and outDir is replaced as BuildFromHF replaces it.
func BuildRandom(configPath, outDir string, seed int64, o Options) (*BuildResult, error) {
	cfg, err := loadRandomConfig(configPath)
	if err != nil {
		return nil, err
	}
	return buildModelDir(outDir, func(dir string) (*BuildResult, error) {
		return buildDir(cfg, RandomWeights(cfg, seed), configPath, filepath.Dir(configPath), dir, o, writeOptions{})
	})
}

// loadRandomConfig reads the config.json at configPath for random weights: valid, of a
// supported architecture, and small enough to make in this machine's memory.
func loadRandomConfig(configPath string) (*Config, error) {
	cfg, err := LoadConfigFile(configPath)
	if err != nil {
		return nil, err
	}
	if _, err := WeightShapes(cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", configPath, err)
	}
	if err := checkBuildMemory(configPath, cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// WriteRandomCheckpoint writes a Hugging Face checkpoint directory for the config.json
// at configPath with RandomWeights(seed): config.json, model.safetensors in the
// config's torch_dtype (float32 when it names none; float16 and bfloat16 as given),
// and the tokenizer and generation files found next to configPath. It returns the
// files written. BuildFromHF reads the result as it reads a downloaded checkpoint.
// outDir is replaced as BuildFromHF replaces a model directory.
func WriteRandomCheckpoint(configPath, outDir string, seed int64) ([]string, error) {
	cfg, err := loadRandomConfig(configPath)
	if err != nil {
		return nil, err
	}
	dt := Float32
	switch cfg.TorchDType {
	case "", "float32":
	case "float16":
		dt = Float16
	case "bfloat16":
		dt = BFloat16
	default:
		return nil, fmt.Errorf("%w: %s: torch_dtype %q (want float32, float16 or bfloat16)", ErrBadConfig, configPath, cfg.TorchDType)
	}
	var files []string
	err = buildInto(outDir, builtCheckpointFiles, func(dir string) error {
		if err := WriteSafetensors(filepath.Join(dir, "model.safetensors"), RandomWeights(cfg, seed), dt); err != nil {
			return err
		}
		files = []string{filepath.Join(outDir, "model.safetensors")}
		for _, name := range append([]string{"config.json"}, modelDirSideFiles...) {
			src := filepath.Join(filepath.Dir(configPath), name)
			if name == "config.json" {
				src = configPath
			} else if _, err := os.Stat(src); err != nil {
				continue
			}
			if err := copyFile(src, filepath.Join(dir, name)); err != nil {
				return err
			}
			files = append(files, filepath.Join(outDir, name))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return files, nil
}

// buildDir writes the model directory of cfg and w into outDir, which exists (a build
// directory: see buildInto).
func buildDir(cfg *Config, w Weights, configPath, sideDir, outDir string, o Options, opts writeOptions) (*BuildResult, error) {
	m, err := denseGraph(cfg, w, o.Quantize)
	if err != nil {
		return nil, err
	}
	if opts.scratch == nil {
		opts.scratch = new([]float32) // one buffer for every derived weight of both graphs
	}
	files, err := writeONNXModel(m, outDir, "model.onnx", opts)
	if err != nil {
		return nil, err
	}
	if err := buildStep(cfg, w, outDir, o.Quantize, o.StepDType, o.StepKVDType, opts); err != nil {
		return nil, err
	}
	files = append(files, filepath.Join(outDir, modeldir.StepDir))
	res := &BuildResult{Params: cfg.NumParams(), Files: files}
	copies := [][2]string{{configPath, filepath.Join(outDir, "config.json")}}
	for _, name := range modelDirSideFiles {
		copies = append(copies, [2]string{filepath.Join(sideDir, name), filepath.Join(outDir, name)})
	}
	for i, c := range copies {
		if _, err := os.Stat(c[0]); err != nil && i > 0 {
			continue // optional side file absent
		}
		if err := copyFile(c[0], c[1]); err != nil {
			return nil, err
		}
		res.Files = append(res.Files, c[1])
	}
	if cfg.wrapper != "" {
		// The runtime reads the sizes from the top level: write the text model's config.
		if err := writeTextConfig(filepath.Join(outDir, "config.json"), cfg); err != nil {
			return nil, err
		}
	}
	if a, err := archOf(cfg); err == nil && a.contextCap() > 0 && a.contextCap() < cfg.MaxPositionEmbeddings {
		// The dense runner reads the context length from config.json: cap it there too.
		if err := setConfigField(filepath.Join(outDir, "config.json"), "max_position_embeddings", a.contextCap()); err != nil {
			return nil, err
		}
		res.ContextCapped = a.contextCap()
	}
	if q := o.Quantize; q.Bits != 0 {
		// Recorded where Hugging Face records a checkpoint's quantization.
		qc := map[string]any{"quant_method": "conveyor_matmulnbits", "bits": q.Bits, "group_size": q.BlockSize,
			"sym": true, "accuracy_level": q.AccuracyLevel, "modules": "every linear layer and the output projection"}
		if q.Bits == 8 {
			qc = map[string]any{"quant_method": "conveyor_w8a8", "bits": 8, "weights": "per output channel, symmetric",
				"activations": "per token, dynamic, symmetric", "modules": "every linear layer and the output projection"}
		}
		if err := setConfigField(filepath.Join(outDir, "config.json"), "quantization_config", qc); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// writeTextConfig writes cfg, read from a multimodal wrapper's text_config with its
// defaults filled in, as a text model's config.json.
func writeTextConfig(path string, cfg *Config) error {
	obj := map[string]any{}
	for k, v := range cfg.raw {
		obj[k] = v
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("models: %w", err)
	}
	var resolved map[string]json.RawMessage
	if err := json.Unmarshal(b, &resolved); err != nil {
		return fmt.Errorf("models: %w", err)
	}
	for k, v := range resolved {
		if string(v) != "null" { // a null stays as config.json wrote it, an absent field absent
			obj[k] = v
		}
	}
	return writeJSONObject(path, obj)
}

// setConfigField rewrites one top-level field of the JSON object in path.
func setConfigField(path, field string, value any) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("models: %w", err)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadConfig, path, err)
	}
	v, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("models: %w", err)
	}
	obj[field] = v
	return writeJSONObject(path, obj)
}

// writeJSONObject writes obj to path, indented, atomically.
func writeJSONObject[V any](path string, obj map[string]V) error {
	out, err := json.MarshalIndent(obj, "", "  ")
	if err != nil {
		return fmt.Errorf("models: %w", err)
	}
	return writeFileAtomic(path, func(w io.Writer) error {
		_, err := w.Write(append(out, '\n'))
		return err
	})
}

// copyFile copies src to dst; copying a file onto itself does nothing.
func copyFile(src, dst string) error {
	if sa, errA := os.Stat(src); errA == nil {
		if sb, errB := os.Stat(dst); errB == nil && os.SameFile(sa, sb) {
			return nil
		}
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("models: %w", err)
	}
	defer in.Close()
	return writeFileAtomic(dst, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	})
}
