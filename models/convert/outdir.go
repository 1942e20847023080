package convert

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// A build never writes into the directory it was asked for. It writes into a fresh
// directory beside it (.NAME.build-PID-N, on the same file system), which takes the
// directory's place when the build has succeeded: an interrupted or failed build leaves
// the old directory as it was (or none), never a mix of two builds or a half-built one
// that loads and then fails. Replacing an existing directory takes two renames (the old
// one aside to .NAME.old-PID-N, the new one in) and then the old one's removal; between
// the renames the name is briefly absent, as close to atomic as rename(2) allows for a
// directory.
//
// For as long as it runs, a build holds an flock(2) on .NAME.build-PID-N.lock, a file
// beside its directory (not in it: the directory moves into place whole). The kernel
// drops the lock when the process ends however it ends (an error, Ctrl-C, SIGKILL, a
// crash), so a build directory whose lock can be taken is an abandoned one: the next
// build of the same name (or, in the build cache, of any name) removes it, and its
// .old- directory, at once. A build directory that is locked is another live build's
// and is left alone, however old. Only the directories a sweep cannot judge, those
// without a lock file (an earlier release's .NAME.build-* names, or a file system where
// flock fails, where a build goes unlocked), are kept until staleBuildAge old. The PID
// in the name is for the people reading a directory listing; the lock decides.

// staleBuildAge is the age after which a .NAME.build-* or .NAME.old-* directory without
// a lock to judge it by is taken to be a crashed build's and removed. No build runs that
// long.
const staleBuildAge = 24 * time.Hour

// buildLockSuffix ends the name of the lock file beside a build directory.
const buildLockSuffix = ".lock"

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
	defer tmp.release() // removes a failed build's files; the lock last
	if err := build(tmp.path); err != nil {
		return err
	}
	return replaceDir(tmp.path, out)
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

// stagingDir is a build's directory beside its out, and the lock that marks it in use.
type stagingDir struct {
	path string
	lock *os.File // the flocked path+buildLockSuffix; nil where the file system has no flock
}

// release removes the build directory (nothing once it has been renamed into place) and
// then its lock file, and drops the lock.
func (d *stagingDir) release() {
	os.RemoveAll(d.path)
	unlockBuild(d.lock)
}

// unlockBuild removes the lock file of lock and then drops the lock (nil: none).
func unlockBuild(lock *os.File) {
	if lock != nil {
		os.Remove(lock.Name())
		lock.Close()
	}
}

// newBuildDir makes an empty directory beside out for a build to write into,
// .NAME.build-PID-N, locked for as long as the build runs (see the comment at the top of
// this file), after removing what earlier builds of out left (see sweepStaleBuilds). The
// caller releases it.
func newBuildDir(out string) (*stagingDir, error) {
	parent, name := filepath.Dir(out), filepath.Base(out)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	sweepStaleBuilds(parent, name)
	for range 100 {
		path := filepath.Join(parent, fmt.Sprintf(".%s.build-%d-%d", name, os.Getpid(), rand.Uint32()))
		lock, err := lockNewBuild(path + buildLockSuffix)
		if errors.Is(err, fs.ErrExist) {
			continue // the name is taken, or a sweep holds the lock file: another name
		}
		if err != nil {
			return nil, fmt.Errorf("models: %w", err)
		}
		if err := os.Mkdir(path, 0o755); err != nil {
			unlockBuild(lock)
			if errors.Is(err, fs.ErrExist) {
				continue
			}
			return nil, fmt.Errorf("models: %w", err)
		}
		d := &stagingDir{path: path, lock: lock}
		if err := os.Chmod(path, 0o755); err != nil { // the umask's mode would stay the model's
			d.release()
			return nil, fmt.Errorf("models: %w", err)
		}
		return d, nil
	}
	return nil, fmt.Errorf("models: no free build directory name beside %s", out)
}

// lockNewBuild creates the lock file path and takes its lock. It returns a nil file and
// no error where the file system has no flock (the build goes unlocked, and its
// directory is judged by its age), and an error wrapping fs.ErrExist when path is taken
// or a sweep holds it (the caller tries another name).
func lockNewBuild(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	held, err := tryLock(f)
	if err != nil { // no flock on this file system
		f.Close()
		os.Remove(path)
		return nil, nil
	}
	if !held { // a sweep has it this instant and will remove it, there being no directory
		f.Close()
		return nil, fs.ErrExist
	}
	// A sweep may have taken the lock in the instant before ours, found no directory and
	// removed the file: a lock on a removed file guards nothing.
	if a, errA := f.Stat(); errA == nil {
		if b, errB := os.Stat(path); errB != nil || !os.SameFile(a, b) {
			f.Close()
			return nil, fs.ErrExist
		}
	}
	fmt.Fprintf(f, "%d\n", os.Getpid()) // for people; the lock is what counts
	return f, nil
}

// lockState is what a sweep makes of a build directory's lock file.
type lockState int

const (
	lockUnknown   lockState = iota // no lock file, or no flock: judged by age
	lockHeld                       // a live build holds it
	lockAbandoned                  // its build is gone: the caller holds the lock now
)

// probeLock tries the lock file path without waiting. With lockAbandoned it returns the
// open file, whose lock the caller drops by closing it.
func probeLock(path string) (lockState, *os.File) {
	f, err := os.Open(path)
	if err != nil {
		return lockUnknown, nil
	}
	held, err := tryLock(f)
	switch {
	case err != nil:
		f.Close()
		return lockUnknown, nil
	case !held:
		f.Close()
		return lockHeld, nil
	}
	return lockAbandoned, f
}

// sweepStaleBuilds removes the .NAME.build-* and .NAME.old-* directories under parent
// that no build is using any more (see the comment at the top of this file): at once
// those whose lock can be taken, and those without a lock to judge them by once
// staleBuildAge old. name "*" sweeps every name's (the build cache's, whose names are all
// builds'). An abandoned .NAME.old-* directory is the old model a build moved aside, and
// is removed at once only when NAME is there again (else it may be the only copy, and
// waits out the age). Errors are ignored: a directory that cannot be removed now is
// tried again next time.
func sweepStaleBuilds(parent, name string) {
	build, old := "."+escapeGlob(name)+".build-*", "."+escapeGlob(name)+".old-*"
	patterns := []string{build, old}
	if name == "*" {
		patterns = append(patterns, ".build-*") // the cache's build directories' earlier name
	}
	for _, p := range patterns {
		matches, _ := filepath.Glob(filepath.Join(parent, p))
		for _, m := range matches {
			st, err := os.Lstat(m)
			if err != nil || !st.IsDir() {
				continue // a lock file: below
			}
			lockPath, out := buildLockOf(m)
			state, lock := lockUnknown, (*os.File)(nil)
			if lockPath != "" {
				state, lock = probeLock(lockPath)
			}
			switch {
			case state == lockHeld:
			case state == lockAbandoned && (out == "" || exists(out)):
				os.RemoveAll(m)
			case time.Since(st.ModTime()) > staleBuildAge:
				os.RemoveAll(m)
			}
			if lock != nil {
				lock.Close()
			}
		}
	}
	// The lock files no directory goes with any more: an abandoned build's, once its
	// directories are gone, or one killed before it made its directory.
	locks, _ := filepath.Glob(filepath.Join(parent, build+buildLockSuffix))
	for _, l := range locks {
		st, err := os.Lstat(l)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		dir := strings.TrimSuffix(l, buildLockSuffix)
		if exists(dir) || exists(oldDirOf(dir)) {
			continue
		}
		state, lock := probeLock(l)
		if state == lockAbandoned || state == lockUnknown && time.Since(st.ModTime()) > staleBuildAge {
			os.Remove(l)
		}
		if lock != nil {
			lock.Close()
		}
	}
}

// buildLockOf returns the lock file that judges the build directory or .old- directory
// dir ("" when its name says of none), and for an .old- directory the directory it was
// moved aside from (out, which it must not outlive unreplaced).
func buildLockOf(dir string) (lock, out string) {
	parent, base := filepath.Split(dir)
	if token, ok := buildToken(base, ".old-"); ok {
		i := len(base) - len(token) - len(".old-")
		return filepath.Join(parent, base[:i]+".build-"+token+buildLockSuffix), filepath.Join(parent, base[1:i])
	}
	return dir + buildLockSuffix, ""
}

// oldDirOf returns the .NAME.old- directory of the build directory .NAME.build-TOKEN
// (see replaceDir), "" when its name is not one newBuildDir gives.
func oldDirOf(buildDir string) string {
	parent, base := filepath.Split(buildDir)
	token, ok := buildToken(base, ".build-")
	if !ok {
		return ""
	}
	return filepath.Join(parent, base[:len(base)-len(token)-len(".build-")]+".old-"+token)
}

// buildToken returns the PID-N after the last sep in base, when base is .NAME+sep+PID-N
// with both numbers decimal.
func buildToken(base, sep string) (string, bool) {
	i := strings.LastIndex(base, sep)
	if i < 1 || !strings.HasPrefix(base, ".") {
		return "", false
	}
	token := base[i+len(sep):]
	pid, n, ok := strings.Cut(token, "-")
	isNum := func(s string) bool {
		return s != "" && strings.Trim(s, "0123456789") == ""
	}
	if !ok || !isNum(pid) || !isNum(n) {
		return "", false
	}
	return token, true
}

// exists reports whether path names anything ("" names nothing).
func exists(path string) bool {
	if path == "" {
		return false
	}
	_, err := os.Lstat(path)
	return err == nil
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
	// The build's own .old- name, which its lock judges (see sweepStaleBuilds).
	aside := oldDirOf(tmp)
	if aside == "" || exists(aside) {
		d, err := os.MkdirTemp(filepath.Dir(out), "."+filepath.Base(out)+".old-")
		if err != nil {
			return fmt.Errorf("models: %w", err)
		}
		// A free name: not every file system renames a directory over an empty one.
		os.Remove(d)
		aside = d
	}
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
