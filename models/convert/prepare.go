package convert

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/conveyor-llm/conveyor/models/modeldir"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// CacheDirEnv names the environment variable the commands read for Prepare's cacheDir:
// where the ONNX graphs it builds are kept (default: the user's cache directory, then
// conveyor/models). This package reads no environment; cmd passes the value.
const CacheDirEnv = "CONVEYOR_CACHE_DIR"

// ErrNotCheckpoint means a directory Prepare was given holds neither a built model
// (model.onnx) nor a Hugging Face checkpoint (config.json and *.safetensors).
var ErrNotCheckpoint = errors.New("convert: neither a model nor a checkpoint directory")

// Prepare returns a directory OpenDense can load for dir. A directory with a
// model.onnx is returned as it is. A Hugging Face checkpoint (config.json and
// *.safetensors, no model.onnx), or a GGUF file (BuildFromGGUF; keyed by its name, size
// and modification time), is built once into a directory under
// cacheDir ("" = the user's cache directory + conveyor/models) keyed by the
// checkpoint's files (names, sizes, modification times and config.json's content), and
// later calls reuse it; built reports whether this call built it. A checkpoint without
// tokenizer.json is refused before anything is built (see CheckTokenizer). Any other
// directory is an error wrapping ErrNotCheckpoint. o are the build's options: a directory that is
// already built is served as it is, so quantizing it is an error unless it was built
// that way.
func Prepare(dir, cacheDir string, o Options) (out string, built bool, err error) {
	if IsGGUF(dir) {
		key, err := ggufKey(dir, o)
		if err != nil {
			return "", false, err
		}
		return buildCached(dir, cacheDir, key, func(tmp string) error {
			_, err := buildFromGGUF(dir, tmp, o)
			return err
		})
	}
	if err := notGGUF(dir); err != nil {
		return "", false, err
	}
	if st, err := os.Stat(filepath.Join(dir, "model.onnx")); err == nil && !st.IsDir() {
		if o.Quantize.Bits != 0 {
			if got := BuiltQuantization(dir); got != o.Quantize.String() {
				return "", false, fmt.Errorf("%w: %s is a built model directory (quantization %s); --quantize %s applies to Hugging Face checkpoints (or rebuild it with `conveyor build-model --quantize %s`)",
					ErrNotCheckpoint, dir, got, o.Quantize, o.Quantize)
			}
		}
		return dir, false, nil
	}
	key, err := checkpointKey(dir, o)
	if err != nil {
		return "", false, err
	}
	// Refused before its cached build is served, or built: a model without a tokenizer
	// would be built (or found, an earlier release having built it) and then fail to
	// load, naming the cache rather than the checkpoint.
	if err := CheckTokenizer(dir); err != nil {
		return "", false, err
	}
	return buildCached(dir, cacheDir, key, func(tmp string) error {
		_, err := buildFromHF(dir, tmp, o)
		return err
	})
}

// ErrNoTokenizer marks a Hugging Face checkpoint directory without the tokenizer.json
// a model needs to be served.
var ErrNoTokenizer = errors.New("convert: no tokenizer")

// CheckTokenizer refuses, in one line naming the directory and the file, a Hugging Face
// checkpoint directory dir without tokenizer.json: the file the tokenizer package reads
// (tokenizer_config.json, with the chat template and special tokens, is optional).
// Without it a model builds, then cannot be loaded to serve. A GGUF file carries its
// tokenizer in its metadata and passes. Prepare calls it before building a checkpoint;
// BuildFromHF does not (a model directory built for its graphs alone, as tests do, needs
// no tokenizer), so a command building one to serve calls it first. Errors wrap
// ErrNoTokenizer.
func CheckTokenizer(dir string) error {
	if IsGGUF(dir) {
		return nil
	}
	path := filepath.Join(dir, "tokenizer.json")
	st, err := os.Stat(path)
	switch {
	case err == nil && st.Mode().IsRegular():
		return nil
	case err == nil:
		return fmt.Errorf("%w: %s is not a file", ErrNoTokenizer, path)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", ErrNoTokenizer, err)
	}
	why := "copy the checkpoint's tokenizer.json (and tokenizer_config.json) into it"
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.model")); err == nil {
		why = "its tokenizer.model (SentencePiece's) is not read; take tokenizer.json from a release of the checkpoint that has one"
	}
	return fmt.Errorf("%w: the checkpoint %s has no tokenizer.json: %s", ErrNoTokenizer, dir, why)
}

// buildCached returns the model directory built from src under cacheDir for key, building
// it with build (into a fresh directory) when it is not there yet.
func buildCached(src, cacheDir, key string, build func(tmp string) error) (out string, built bool, err error) {
	root, err := cacheRoot(cacheDir)
	if err != nil {
		return "", false, err
	}
	abs, _ := filepath.Abs(src)
	out = filepath.Join(root, filepath.Base(abs)+"-"+key)
	if st, err := os.Stat(filepath.Join(out, "model.onnx")); err == nil && !st.IsDir() {
		return out, false, nil
	}
	// Build next to the final place and rename, so that an interrupted build leaves no
	// directory that looks complete (see buildInto, which replaces a directory; a cached
	// one is never replaced, as another process may be serving it). The cache's names are
	// all builds': every crashed build's directory is swept, whichever key it was for.
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", false, fmt.Errorf("models: %w", err)
	}
	sweepStaleBuilds(root, "*")
	tmp, err := newBuildDir(out)
	if err != nil {
		return "", false, err
	}
	defer tmp.release()
	if err := build(tmp.path); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp.path, out); err != nil {
		if st, statErr := os.Stat(filepath.Join(out, "model.onnx")); statErr == nil && !st.IsDir() {
			return out, false, nil // built meanwhile by another process
		}
		return "", false, fmt.Errorf("models: %w", err)
	}
	return out, true, nil
}

// builtLayout versions what BuildFromHF writes; a cached build of an older layout (before
// paged/ was written; 4: int8 segments through Int8Linear, weights packed; 5: the
// manifest's own_threads; 6: step/, and dense int8 weights as uint8; 7: RMSNorm as one node,
// the step graph's attention_metadata and its own rotary where PagedAttention's cannot; 8: a
// step graph's block table per layer group, and no paged/ segments) is built anew rather than served as it was.
const builtLayout = 8

// ggufKey identifies a GGUF file's content cheaply, as checkpointKey a checkpoint's: the
// layout, the options, and the file's name, size and modification time.
func ggufKey(path string, o Options) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("models: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "gguf layout %d\x00quantize %s/%d/%d/%t\x00step %s\x00", builtLayout, o.Quantize, o.Quantize.BlockSize, o.Quantize.AccuracyLevel, o.Quantize.WideInt8, o.StepDType)
	if o.StepKVDType != Float32 {
		fmt.Fprintf(h, "step kv %s\x00", o.StepKVDType)
	}
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00", filepath.Base(path), st.Size(), st.ModTime().UnixNano())
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// checkpointKey identifies a checkpoint's content cheaply: config.json's bytes and the
// name, size and modification time of every other file the build reads.
func checkpointKey(dir string, o Options) (string, error) {
	cfg, err := os.Open(filepath.Join(dir, "config.json"))
	if _, serr := os.Stat(dir); err != nil && errors.Is(serr, fs.ErrNotExist) {
		return "", fmt.Errorf("%w: %s does not exist", ErrNotCheckpoint, dir)
	}
	if err != nil {
		return "", fmt.Errorf("%w: %s has neither model.onnx nor config.json", ErrNotCheckpoint, dir)
	}
	defer cfg.Close()
	h := sha256.New()
	fmt.Fprintf(h, "layout %d\x00", builtLayout)
	if o.Quantize.Bits != 0 {
		fmt.Fprintf(h, "quantize %s/%d/%d\x00", o.Quantize, o.Quantize.BlockSize, o.Quantize.AccuracyLevel)
	}
	if o.StepDType != Float32 {
		fmt.Fprintf(h, "step %s\x00", o.StepDType)
	}
	if o.StepKVDType != Float32 {
		fmt.Fprintf(h, "step kv %s\x00", o.StepKVDType)
	}
	if _, err := io.Copy(h, cfg); err != nil {
		return "", fmt.Errorf("models: %w", err)
	}
	weights, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if len(weights) == 0 {
		return "", fmt.Errorf("%w: %s has neither model.onnx nor *.safetensors weights", ErrNotCheckpoint, dir)
	}
	files := append(weights, filepath.Join(dir, "model.safetensors.index.json"))
	for _, name := range modelDirSideFiles {
		files = append(files, filepath.Join(dir, name))
	}
	slices.Sort(files)
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			continue // optional file absent
		}
		fmt.Fprintf(h, "%s\x00%d\x00%d\x00", filepath.Base(f), st.Size(), st.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// BuiltQuantization returns how the model directory dir stores its linear weights, as
// its step graph's manifest records it: "none", "int8" or "int4".
func BuiltQuantization(dir string) string {
	man, err := modeldir.LoadStep(dir)
	if err != nil || man.Quantization == "" {
		return "none"
	}
	return man.Quantization
}

// cacheRoot is dir when it is not "", else the user's cache directory + conveyor/models.
func cacheRoot(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("%w: no cache directory for built models (set %s): %w", ErrNotCheckpoint, CacheDirEnv, err)
	}
	return filepath.Join(d, "conveyor", "models"), nil
}
