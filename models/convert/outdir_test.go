package convert

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conveyor-llm/conveyor/models/modeldir"
)

// writeTinyConfig writes tiny-llama's config.json with fields changed into a fresh
// directory (tokenizer files copied next to it) and returns its path.
func writeTinyConfig(t *testing.T, fields map[string]any) string {
	t.Helper()
	src := filepath.Join("..", "testdata", "tiny-llama")
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	for k, v := range fields {
		obj[k] = v
	}
	dir := t.TempDir()
	for _, name := range modelDirSideFiles {
		if b, err := os.ReadFile(filepath.Join(src, name)); err == nil {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	b, _ := json.Marshal(obj)
	path := filepath.Join(dir, "config.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// treeSums maps every file under dir (relative path) to its content's hash.
func treeSums(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	sums := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		sums[rel] = sha256.Sum256(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return sums
}

// leftovers lists the entries of dir a build leaves only when it fails to clean up.
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		if strings.Contains(e.Name(), ".build-") || strings.Contains(e.Name(), ".old-") {
			left = append(left, e.Name())
		}
	}
	return left
}

// TestBuildFailureLeavesOutDir fails builds after they have written both graphs (a
// side file that cannot be read, a directory named tokenizer_config.json, is copied
// last): an existing directory is left byte for byte as it was, a new one is not made,
// and no build directory stays behind. A build that succeeds replaces the old one whole.
func TestBuildFailureLeavesOutDir(t *testing.T) {
	parent := t.TempDir()
	out := filepath.Join(parent, "model")
	eight := writeTinyConfig(t, map[string]any{"num_hidden_layers": 8})
	if _, err := BuildRandom(eight, out, 1, Options{}); err != nil {
		t.Fatal(err)
	}
	before := treeSums(t, out)
	broken := writeTinyConfig(t, map[string]any{"num_hidden_layers": 4})
	side := filepath.Join(filepath.Dir(broken), "tokenizer_config.json")
	if err := os.Remove(side); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	if err := os.Mkdir(side, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := BuildRandom(broken, out, 1, Options{}); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("the broken build: %v, want the side file's copy to fail", err)
	}
	if after := treeSums(t, out); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a failed build changed %s: %d files, had %d", out, len(after), len(before))
	}
	fresh := filepath.Join(parent, "fresh")
	if _, err := BuildRandom(broken, fresh, 1, Options{}); err == nil {
		t.Fatal("the broken build succeeded")
	}
	if _, err := os.Stat(fresh); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a failed fresh build left %s: %v", fresh, err)
	}
	if left := leftovers(t, parent); len(left) > 0 {
		t.Errorf("failed builds left %v", left)
	}

	four := writeTinyConfig(t, map[string]any{"num_hidden_layers": 4})
	res, err := BuildRandom(four, out, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	man, err := modeldir.LoadStep(out)
	if err != nil || man.NumLayers != 4 {
		t.Fatalf("the rebuilt step graph: %+v, %v; want 4 layers", man, err)
	}
	cfg, err := LoadConfig(out)
	if err != nil || cfg.NumHiddenLayers != 4 {
		t.Fatalf("the rebuilt config.json: %v", err)
	}
	for _, f := range res.Files {
		if filepath.Dir(f) != out {
			t.Errorf("the result names %s, not a file of %s", f, out)
		}
		if _, err := os.Stat(f); err != nil {
			t.Error(err)
		}
	}
	if left := leftovers(t, parent); len(left) > 0 {
		t.Errorf("the rebuild left %v", left)
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("the built directory's mode: %v %v, want 0755", st.Mode(), err)
	}
}

// TestBuildRefusesForeignDir: a directory holding files no build writes (a checkpoint
// built in place, a directory given by mistake) is not replaced, and nothing is
// deleted.
func TestBuildRefusesForeignDir(t *testing.T) {
	out := t.TempDir()
	notes := filepath.Join(out, "notes.txt")
	if err := os.WriteFile(notes, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join("..", "testdata", "tiny-llama", "config.json")
	_, err := BuildRandom(cfg, out, 1, Options{})
	if err == nil || !strings.Contains(err.Error(), out+" holds notes.txt") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("build into a foreign directory: %v", err)
	}
	if b, err := os.ReadFile(notes); err != nil || string(b) != "keep me" {
		t.Fatalf("notes.txt: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(out, "model.onnx")); err == nil {
		t.Error("model.onnx was written into the foreign directory")
	}
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	if _, err := WriteRandomCheckpoint(cfg, file, 1); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("build onto a file: %v", err)
	}
}

// TestStaleBuildDirsSwept: the next build of a name removes the build directories a
// killed build of it left over a day ago, and leaves a recent one (a build running now)
// and other names' alone; the cache sweeps every name's.
func TestStaleBuildDirsSwept(t *testing.T) {
	parent := t.TempDir()
	old := time.Now().Add(-2 * staleBuildAge)
	mk := func(name string, mtime time.Time) string {
		p := filepath.Join(parent, name)
		if err := os.MkdirAll(filepath.Join(p, modeldir.StepDir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stale := []string{mk(".m.build-1", old), mk(".m.old-2", old)}
	kept := []string{mk(".m.build-3", time.Now()), mk(".other.build-4", old), mk(".m[x].build-5", old)}
	cfg := filepath.Join("..", "testdata", "tiny-llama", "config.json")
	if _, err := BuildRandom(cfg, filepath.Join(parent, "m"), 1, Options{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range stale {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("stale %s was not removed", p)
		}
	}
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
	sweepStaleBuilds(parent, "*")
	left := leftovers(t, parent)
	if !slices.Equal(left, []string{".m.build-3"}) {
		t.Errorf("after sweeping every name: %v, want only the recent build", left)
	}
}

// TestBuildSizeRefusals: sizes that would have the build allocate more than any machine
// has are refused by name, or by the memory they need, before anything is allocated.
func TestBuildSizeRefusals(t *testing.T) {
	for _, tc := range []struct {
		fields map[string]any
		want   string
	}{
		{map[string]any{"vocab_size": int64(1e12)}, "vocab_size 1000000000000 is above 16777216"},
		{map[string]any{"hidden_size": int64(1) << 40}, "hidden_size 1099511627776 is above 16777216"},
		{map[string]any{"max_position_embeddings": int64(1)<<31 - 1}, "max_position_embeddings 2147483647 is above 16777216"},
		{map[string]any{"num_hidden_layers": 1 << 20}, "num_hidden_layers 1048576 is above 4096"},
		{map[string]any{"num_key_value_heads": int64(1) << 30}, "num_key_value_heads 1073741824 is above 16777216"},
	} {
		cfg := writeTinyConfig(t, tc.fields)
		out := filepath.Join(t.TempDir(), "m")
		_, err := BuildRandom(cfg, out, 1, Options{})
		if err == nil || !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.fields, err, tc.want)
		}
		if _, err := WriteRandomCheckpoint(cfg, out, 1); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("checkpoint of %v: %v, want %q", tc.fields, err, tc.want)
		}
	}

	// Within the bounds, but 44 TiB of weights: refused by what the machine has.
	huge := writeTinyConfig(t, map[string]any{"hidden_size": 1 << 20, "intermediate_size": 1 << 20, "num_attention_heads": 1 << 10})
	defer func(f func() (int64, bool)) { availableMemory = f }(availableMemory)
	availableMemory = func() (int64, bool) { return 22 << 30, true }
	out := filepath.Join(t.TempDir(), "m")
	want := "the model needs 44.0 TiB of memory to build; this machine has 22.0 GiB available"
	if _, err := BuildRandom(huge, out, 1, Options{}); err == nil || !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), want) {
		t.Errorf("huge model: %v, want %q", err, want)
	}
	if _, err := WriteRandomCheckpoint(huge, out, 1); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("huge checkpoint: %v, want %q", err, want)
	}
	if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused build made %s", out)
	}
	// The rotary tables count: a long context of a small model.
	long := writeTinyConfig(t, map[string]any{"max_position_embeddings": 1 << 24, "hidden_size": 4096, "num_attention_heads": 4, "num_key_value_heads": 4})
	availableMemory = func() (int64, bool) { return 1 << 30, true }
	if _, err := BuildRandom(long, out, 1, Options{}); err == nil || !errors.Is(err, ErrTooLarge) {
		t.Errorf("a 16M-position context with 1 GiB available: %v", err)
	}
	availableMemory = func() (int64, bool) { return 0, false } // no meminfo: nothing to check against
	if err := checkBuildMemory("x", &Config{VocabSize: 1 << 20, HiddenSize: 1 << 20, IntermediateSize: 1, NumHiddenLayers: 1, NumAttentionHeads: 1}); err != nil {
		t.Errorf("without meminfo: %v", err)
	}
}

func TestMeminfoAvailable(t *testing.T) {
	p := filepath.Join(t.TempDir(), "meminfo")
	os.WriteFile(p, []byte("MemTotal:       8000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n"), 0o644)
	if n, ok := meminfoAvailable(p); !ok || n != 2048<<10 {
		t.Errorf("meminfoAvailable: %d %v", n, ok)
	}
	if _, ok := meminfoAvailable(filepath.Join(t.TempDir(), "none")); ok {
		t.Error("a missing meminfo read as available memory")
	}
	for _, tc := range []struct {
		b    float64
		want string
	}{{512, "512 bytes"}, {1536, "1.5 KiB"}, {22.4 * (1 << 30), "22.4 GiB"}, {3.7 * (1 << 40), "3.7 TiB"}} {
		if got := formatSize(tc.b); got != tc.want {
			t.Errorf("formatSize(%g) = %q, want %q", tc.b, got, tc.want)
		}
	}
}

// writeTinyGGUF writes a one-layer llama GGUF file (version 3, float32) whose
// llama.context_length is contextLength, with a 4-token vocabulary and only the
// embedding's data: enough for its config and tokenizer to be read.
func writeTinyGGUF(t *testing.T, path string, contextLength uint32) {
	t.Helper()
	var kv []byte
	le := binary.LittleEndian
	str := func(b []byte, s string) []byte { return append(le.AppendUint64(b, uint64(len(s))), s...) }
	n := 0
	add := func(key string, v any) {
		n++
		kv = str(kv, key)
		switch v := v.(type) {
		case string:
			kv = str(le.AppendUint32(kv, 8), v)
		case uint32:
			kv = le.AppendUint32(le.AppendUint32(kv, 4), v)
		case []string:
			kv = le.AppendUint64(le.AppendUint32(le.AppendUint32(kv, 9), 8), uint64(len(v)))
			for _, s := range v {
				kv = str(kv, s)
			}
		}
	}
	add("general.architecture", "llama")
	for k, v := range map[string]uint32{"context_length": contextLength, "embedding_length": 16, "block_count": 1,
		"feed_forward_length": 32, "attention.head_count": 2, "attention.head_count_kv": 1} {
		add("llama."+k, v)
	}
	add("tokenizer.ggml.model", "gpt2")
	add("tokenizer.ggml.tokens", []string{"a", "b", "c", "d"})
	add("tokenizer.ggml.merges", []string{})
	b := append([]byte("GGUF"), le.AppendUint32(nil, 3)...)
	b = le.AppendUint64(b, 1)
	b = le.AppendUint64(b, uint64(n))
	b = append(b, kv...)
	b = str(b, "token_embd.weight")
	b = le.AppendUint32(b, 2)
	b = le.AppendUint64(le.AppendUint64(b, 16), 4)
	b = le.AppendUint32(b, 0) // float32
	b = le.AppendUint64(b, 0) // offset
	b = append(b, make([]byte, (32-len(b)%32)%32)...)
	b = append(b, make([]byte, 16*4*4)...)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestGGUFSizeRefusals: a GGUF file whose context would make a rotary table of 2^31
// rows, or whose weights need more memory than there is, is refused in one line before
// its weights are read, by build-model's path and by Prepare's (generate's and serve's).
func TestGGUFSizeRefusals(t *testing.T) {
	tmp := t.TempDir()
	long := filepath.Join(tmp, "long.gguf")
	writeTinyGGUF(t, long, 1<<31-1)
	want := "max_position_embeddings 2147483647 is above 16777216"
	if _, err := BuildFromGGUF(long, filepath.Join(tmp, "m"), Options{}); err == nil || !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Errorf("BuildFromGGUF: %v, want one line with %q", err, want)
	}
	cache := filepath.Join(tmp, "cache")
	if _, _, err := Prepare(long, cache, Options{}); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Prepare: %v, want %q", err, want)
	}
	if left := leftovers(t, cache); len(left) > 0 {
		t.Errorf("the refused build left %v in the cache", left)
	}
	if _, err := os.Stat(filepath.Join(tmp, "m")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused build made its directory: %v", err)
	}

	small := filepath.Join(tmp, "small.gguf")
	writeTinyGGUF(t, small, 64)
	defer func(f func() (int64, bool)) { availableMemory = f }(availableMemory)
	availableMemory = func() (int64, bool) { return 1024, true }
	if _, err := BuildFromGGUF(small, filepath.Join(tmp, "m"), Options{}); err == nil || !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "small.gguf: the model needs ") || !strings.Contains(err.Error(), "this machine has 1.0 KiB available") {
		t.Errorf("BuildFromGGUF with 1 KiB available: %v", err)
	}
}

// TestNotAGGUFFile: a file that is not a GGUF file (a wrong magic, or empty) is refused
// as such by Prepare and BuildFromHF, not read as a checkpoint directory.
func TestNotAGGUFFile(t *testing.T) {
	for name, data := range map[string]string{"magic.gguf": "XXXXjunk", "empty.gguf": ""} {
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := Prepare(path, t.TempDir(), Options{})
		if !errors.Is(err, ErrNotCheckpoint) || !strings.Contains(err.Error(), "not a GGUF file") {
			t.Errorf("Prepare %s: %v", name, err)
		}
		if _, err := BuildFromHF(path, filepath.Join(t.TempDir(), "out"), Options{}); err == nil || !strings.Contains(err.Error(), "not a GGUF file") {
			t.Errorf("BuildFromHF %s: %v", name, err)
		}
	}
}

// TestAbandonedBuildDirsSwept: the build directories (and .old- directories, and lock
// files) of builds that are gone, their lock free, are removed by the next build of the
// name at once, however recent; those a live build holds locked are left, in this
// process as in another; an abandoned .old- directory whose name is not there again (the
// only copy of the model moved aside) and an earlier release's unlocked names wait out
// staleBuildAge; the cache's sweep of every name does the same for all names.
func TestAbandonedBuildDirsSwept(t *testing.T) {
	parent := t.TempDir()
	out := filepath.Join(parent, "m")
	cfg := filepath.Join("..", "testdata", "tiny-llama", "config.json")
	if _, err := BuildRandom(cfg, out, 1, Options{}); err != nil {
		t.Fatal(err)
	}
	live, err := newBuildDir(out)
	if err != nil {
		t.Fatal(err)
	}
	defer live.release()
	if ok, _ := filepath.Match(fmt.Sprintf(".m.build-%d-*", os.Getpid()), filepath.Base(live.path)); !ok {
		t.Errorf("the build directory %s does not carry the PID %d", live.path, os.Getpid())
	}
	if _, err := os.Stat(live.path + buildLockSuffix); err != nil || live.lock == nil {
		t.Fatalf("the live build has no lock file: %v", err)
	}
	if err := os.WriteFile(filepath.Join(live.path, "model.onnx"), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	liveOther, err := newBuildDir(filepath.Join(parent, "n"))
	if err != nil {
		t.Fatal(err)
	}
	defer liveOther.release()

	// What builds killed a moment ago leave: their directories, and their lock files with
	// no lock held.
	mk := func(names ...string) {
		for _, name := range names {
			p := filepath.Join(parent, name)
			var err error
			if strings.HasSuffix(name, buildLockSuffix) {
				err = os.WriteFile(p, []byte("4242\n"), 0o644)
			} else {
				err = os.MkdirAll(filepath.Join(p, modeldir.StepDir), 0o755)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	abandoned := []string{
		".m.build-4242-1", ".m.build-4242-1.lock", // killed while building
		".m.old-4242-2", ".m.build-4242-2.lock", // killed after moving the new build in
		".m.build-4242-3.lock", // killed before making its directory
	}
	otherName := []string{".n.build-4242-4", ".n.build-4242-4.lock"}
	waiting := []string{
		".gone.old-4242-5", ".gone.build-4242-5.lock", // killed between the two renames
		".m.build-7", // an earlier release's name, recent
	}
	mk(abandoned...)
	mk(otherName...)
	mk(waiting...)
	if _, err := BuildRandom(cfg, out, 1, Options{}); err != nil {
		t.Fatal(err)
	}
	gone := func(names []string) {
		t.Helper()
		for _, name := range names {
			if _, err := os.Lstat(filepath.Join(parent, name)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("abandoned %s was not removed: %v", name, err)
			}
		}
	}
	kept := func(paths ...string) {
		t.Helper()
		for _, p := range paths {
			if !filepath.IsAbs(p) {
				p = filepath.Join(parent, p)
			}
			if _, err := os.Lstat(p); err != nil {
				t.Errorf("%s was removed: %v", p, err)
			}
		}
	}
	gone(abandoned)
	kept(otherName...)
	kept(waiting...)
	kept(live.path, live.lock.Name(), filepath.Join(live.path, "model.onnx"), liveOther.path, liveOther.lock.Name())

	sweepStaleBuilds(parent, "*")
	gone(otherName)
	kept(waiting...)
	kept(live.path, live.lock.Name(), liveOther.path, liveOther.lock.Name())

	live.release()
	liveOther.release()
	if left := leftovers(t, parent); !slices.Equal(left, []string{".gone.build-4242-5.lock", ".gone.old-4242-5", ".m.build-7"}) {
		t.Errorf("after the live builds ended: %v", left)
	}
	if _, err := os.Stat(filepath.Join(parent, "gone")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	// Once its name is there again, the abandoned .old- directory goes, and its lock file.
	mk("gone")
	sweepStaleBuilds(parent, "gone")
	gone(waiting[:2])
}

// heldBuildEnv makes the test binary TestHeldBuildHelper: it makes the build directory
// of the model directory the variable names, prints its path, and waits to be killed.
const heldBuildEnv = "CONVEYOR_CONVERT_TEST_HELD_BUILD"

func TestHeldBuildHelper(t *testing.T) {
	out := os.Getenv(heldBuildEnv)
	if out == "" {
		t.Skip("the helper process of TestKilledBuildSwept")
	}
	d, err := newBuildDir(out)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(filepath.Join(d.path, "model.onnx.data"), make([]byte, 1<<16), 0o644); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(d.path)
	time.Sleep(time.Minute)
	os.Exit(3)
}

// TestKilledBuildSwept: a build in another process, killed with SIGKILL or interrupted
// (Ctrl-C) mid-build, leaves its build directory, which the next build of the name
// removes at once; while that process lives, builds and the cache's sweep leave it.
func TestKilledBuildSwept(t *testing.T) {
	cfg := filepath.Join("..", "testdata", "tiny-llama", "config.json")
	for _, sig := range []os.Signal{os.Kill, os.Interrupt} {
		parent := t.TempDir()
		out := filepath.Join(parent, "m")
		cmd := exec.Command(os.Args[0], "-test.run=^TestHeldBuildHelper$")
		cmd.Env = append(os.Environ(), heldBuildEnv+"="+out)
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line := make(chan string, 1)
		go func() {
			s := bufio.NewScanner(stdout)
			s.Scan()
			line <- s.Text()
			io.Copy(io.Discard, stdout)
		}()
		var held string
		select {
		case held = <-line:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			t.Fatal("the helper process printed nothing")
		}
		if !strings.HasPrefix(filepath.Base(held), fmt.Sprintf(".m.build-%d-", cmd.Process.Pid)) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the helper's build directory: %q, want one of .m.build-%d-*", held, cmd.Process.Pid)
		}
		if _, err := BuildRandom(cfg, out, 1, Options{}); err != nil {
			t.Fatal(err)
		}
		sweepStaleBuilds(parent, "*")
		if _, err := os.Stat(filepath.Join(held, "model.onnx.data")); err != nil {
			t.Errorf("a live build's directory was swept: %v", err)
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		if _, err := os.Stat(held); err != nil {
			t.Fatalf("%v: the killed build left nothing to sweep (%v): the test tests nothing", sig, err)
		}
		if _, err := BuildRandom(cfg, out, 1, Options{}); err != nil {
			t.Fatal(err)
		}
		if left := leftovers(t, parent); len(left) > 0 {
			t.Errorf("%v: the build after the killed one left %v", sig, left)
		}
	}
}

// TestConcurrentBuilds: builds of the same checkpoint into the same cache at once (two
// `conveyor serve` starting together), of another checkpoint, and of other model
// directories beside them, all succeed, none sweeping another's build directory, and
// leave no build directory behind.
func TestConcurrentBuilds(t *testing.T) {
	cache := t.TempDir()
	checkpoint := func(layers int) string {
		hf := t.TempDir()
		cfg := tinyTestConfig()
		cfg.NumHiddenLayers = layers
		writeConfig(t, cfg, hf)
		if err := WriteSafetensors(filepath.Join(hf, "model.safetensors"), RandomWeights(cfg, 1), Float32); err != nil {
			t.Fatal(err)
		}
		copyTinyTokenizer(t, hf)
		return hf
	}
	a, b := checkpoint(2), checkpoint(1)
	cfg := filepath.Join("..", "testdata", "tiny-llama", "config.json")
	var wg sync.WaitGroup
	outs := make([]string, 4)
	errs := make([]error, 6)
	for i, src := range []string{a, a, a, b} {
		wg.Go(func() { outs[i], _, errs[i] = Prepare(src, cache, Options{}) })
	}
	for i := range 2 {
		wg.Go(func() {
			_, errs[4+i] = BuildRandom(cfg, filepath.Join(cache, fmt.Sprintf("random%d", i)), 1, Options{})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("build %d: %v", i, err)
		}
	}
	if outs[0] != outs[1] || outs[0] != outs[2] || outs[3] == outs[0] {
		t.Errorf("built into %v: want the first three the same, the fourth apart", outs)
	}
	for _, out := range outs {
		if man, err := modeldir.LoadStep(out); err != nil || man.MaxPositions != 256 {
			t.Errorf("%s: %+v, %v", out, man, err)
		}
	}
	if left := leftovers(t, cache); len(left) > 0 {
		t.Errorf("the builds left %v", left)
	}
}
