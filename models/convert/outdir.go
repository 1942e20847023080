package convert

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// A build never writes into the directory it was asked for. It writes into a fresh
// directory beside it (.NAME.build-*, on the same file system), which takes the
// directory's place when the build has succeeded: an interrupted or failed build leaves
// the old directory as it was (or none), never a mix of two builds or a half-built one
// that loads and then fails. Replacing an existing directory takes two renames (the old
// one aside to .NAME.old-*, the new one in) and then the old one's removal; between the
// renames the name is briefly absent, as close to atomic as rename(2) allows for a
// directory. A build killed outright leaves its .NAME.build-* (or .NAME.old-*) behind:
// the next build of the same name removes those over staleBuildAge old.

// staleBuildAge is the age after which a .NAME.build-* or .NAME.old-* directory is taken
// to be a crashed build's and removed. No build runs that long.
const staleBuildAge = 24 * time.Hour

// builtModelFiles are the names a model directory build writes. An existing directory
// holding anything else is not replaced: it is not a model directory (a checkpoint's own
// directory, a home directory given by mistake), and replacing it would delete files no
// build wrote.
var builtModelFiles = append([]string{"model.onnx", "model.onnx.data", modeldir.StepDir, "config.json"}, modelDirSideFiles...)

// builtCheckpointFiles are the names WriteRandomCheckpoint writes.
var builtCheckpointFiles = append([]string{"model.safetensors", "config.json"}, modelDirSideFiles...)

// buildInto runs build on a fresh directory beside out and moves the result to out,
// replacing the directory there (see the comment at the top of this file). An existing
// out must be a directory holding only names in owned (or nothing). On any error out is
// as it was and the build directory is removed.
func buildInto(out string, owned []string, build func(dir string) error) error {
	if err := checkReplaceable(out, owned); err != nil {
		return err
	}
	tmp, err := newBuildDir(out)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // gone after the rename; removes a failed build's files
	if err := build(tmp); err != nil {
		return err
	}
	return replaceDir(tmp, out)
}

// checkReplaceable refuses an out that exists and is not a directory, or holds a name a
// build does not write.
func checkReplaceable(out string, owned []string) error {
	st, err := os.Stat(out)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("models: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("models: %s exists and is not a directory", out)
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		return fmt.Errorf("models: %w", err)
	}
	for _, e := range entries {
		if !slices.Contains(owned, e.Name()) {
			return fmt.Errorf("models: %s holds %s, which a build does not write: give a new or empty directory to build into, or remove it (a build replaces the whole directory)", out, e.Name())
		}
	}
	return nil
}

// newBuildDir makes an empty directory beside out for a build to write into, after
// removing the stale ones earlier builds of out left (see sweepStaleBuilds).
func newBuildDir(out string) (string, error) {
	parent, name := filepath.Dir(out), filepath.Base(out)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", fmt.Errorf("models: %w", err)
	}
	sweepStaleBuilds(parent, name)
	tmp, err := os.MkdirTemp(parent, "."+name+".build-")
	if err != nil {
		return "", fmt.Errorf("models: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // MkdirTemp's 0700 would stay the model's
		os.Remove(tmp)
		return "", fmt.Errorf("models: %w", err)
	}
	return tmp, nil
}

// sweepStaleBuilds removes the .NAME.build-* and .NAME.old-* directories under parent
// last changed over staleBuildAge ago: those of a build killed before it could clean
// up. name "*" sweeps every name's (the build cache's, whose names are all builds').
// Errors are ignored: a directory that cannot be removed now is tried again next time.
func sweepStaleBuilds(parent, name string) {
	patterns := []string{"." + escapeGlob(name) + ".build-*", "." + escapeGlob(name) + ".old-*"}
	if name == "*" {
		patterns = append(patterns, ".build-*") // the cache's build directories' earlier name
	}
	for _, p := range patterns {
		matches, _ := filepath.Glob(filepath.Join(parent, p))
		for _, m := range matches {
			if st, err := os.Lstat(m); err == nil && st.IsDir() && time.Since(st.ModTime()) > staleBuildAge {
				os.RemoveAll(m)
			}
		}
	}
}

// escapeGlob quotes filepath.Match's special characters in name, except a name of "*".
func escapeGlob(name string) string {
	if name == "*" {
		return name
	}
	var b strings.Builder
	for _, r := range name {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// replaceDir moves the directory tmp to out, replacing an existing out: the old one is
// renamed aside, tmp renamed in, and the old one removed. When tmp cannot take its place
// the old one is put back.
func replaceDir(tmp, out string) error {
	if _, err := os.Lstat(out); errors.Is(err, fs.ErrNotExist) {
		if err := os.Rename(tmp, out); err != nil {
			return fmt.Errorf("models: %w", err)
		}
		return nil
	}
	aside, err := os.MkdirTemp(filepath.Dir(out), "."+filepath.Base(out)+".old-")
	if err != nil {
		return fmt.Errorf("models: %w", err)
	}
	// A free name: not every file system renames a directory over an empty one.
	os.Remove(aside)
	if err := os.Rename(out, aside); err != nil {
		return fmt.Errorf("models: %w", err)
	}
	if err := os.Rename(tmp, out); err != nil {
		if backErr := os.Rename(aside, out); backErr != nil {
			return fmt.Errorf("models: %w; the old directory could not be put back and is at %s: %w", err, aside, backErr)
		}
		return fmt.Errorf("models: %w", err)
	}
	os.RemoveAll(aside) // what stays is swept as stale later
	return nil
}

// buildModelDir builds a model directory at out with build, which writes one into the
// directory it is given (see buildInto); the result's paths name out.
func buildModelDir(out string, build func(dir string) (*BuildResult, error)) (*BuildResult, error) {
	var res *BuildResult
	err := buildInto(out, builtModelFiles, func(dir string) error {
		var err error
		if res, err = build(dir); err != nil {
			return err
		}
		res.Files, err = movedPaths(res.Files, dir, out)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// movedPaths returns files, paths inside the directory from, as the same paths inside to.
func movedPaths(files []string, from, to string) ([]string, error) {
	moved := make([]string, len(files))
	for i, f := range files {
		rel, err := filepath.Rel(from, f)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return nil, fmt.Errorf("models: the build wrote %s, outside its directory %s", f, from)
		}
		moved[i] = filepath.Join(to, rel)
	}
	return moved, nil
}
