package kubernetes

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
)

// serveFlag is one flag of `conveyor serve` as cmd/conveyor/serve.go defines it.
type serveFlag struct {
	kind string // the flag.FlagSet method: StringVar, IntVar, BoolVar, DurationVar, Var
	def  string // the default as written when it is a literal, else ""
}

// serveFlags reads the flags `conveyor serve` defines from the fs.XxxVar(&o.field, "name",
// default, usage) calls in cmd/conveyor/serve.go: its own (serveFlags) and those it
// shares with run-batch (modelFlags). The command lives in package main, so
// its flag set cannot be imported; reading its source keeps one definition of the flags.
func serveFlags(t *testing.T) map[string]serveFlag {
	t.Helper()
	path := filepath.Join(repoRoot, "cmd", "conveyor", "serve.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]serveFlag{}
	ast.Inspect(f, func(n ast.Node) bool {
		fn, ok := n.(*ast.FuncDecl)
		if !ok || (fn.Name.Name != "serveFlags" && fn.Name.Name != "modelFlags") {
			return true
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 3 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !strings.HasSuffix(sel.Sel.Name, "Var") {
				return true
			}
			name, ok := call.Args[1].(*ast.BasicLit)
			if !ok || name.Kind != token.STRING {
				return true
			}
			n2, _ := strconv.Unquote(name.Value)
			fl := serveFlag{kind: sel.Sel.Name}
			if sel.Sel.Name != "Var" {
				if lit, ok := call.Args[2].(*ast.BasicLit); ok {
					fl.def = lit.Value
					if lit.Kind == token.STRING {
						fl.def, _ = strconv.Unquote(lit.Value)
					}
				} else if id, ok := call.Args[2].(*ast.Ident); ok && (id.Name == "true" || id.Name == "false") {
					fl.def = id.Name
				}
			}
			flags[n2] = fl
			return true
		})
		return false
	})
	// A sanity floor: the flags the manifests rely on must have been found.
	for _, want := range []string{"model", "host", "port", "kv-cache-memory", "shutdown-timeout", "threads", "no-webui"} {
		if _, ok := flags[want]; !ok {
			t.Fatalf("%s: no flag %q found; has serveFlags changed shape?", path, want)
		}
	}
	return flags
}

// envName is a flag's environment variable, as serve.go's envName spells it.
func envName(flag string) string {
	return "CONVEYOR_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// serveSettings is what `conveyor serve` would run with: each flag's value from the
// container's args (which win), else its environment, else the default.
type serveSettings struct {
	values map[string]string
	flags  map[string]serveFlag
}

// resolveServe reads the serve flags of container c. Its args must be "serve" followed by
// flags; its env must name only serve flags, CONVEYOR_ORT_LIB and CONVEYOR_CACHE_DIR.
func resolveServe(t *testing.T, c *corev1.Container) serveSettings {
	t.Helper()
	flags := serveFlags(t)
	s := serveSettings{values: map[string]string{}, flags: flags}
	for name, fl := range flags {
		s.values[name] = fl.def
	}
	byEnv := map[string]string{}
	for name := range flags {
		byEnv[envName(name)] = name
	}
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "CONVEYOR_") {
			continue
		}
		if e.ValueFrom != nil {
			t.Errorf("container %s: %s comes from valueFrom; the test can only check literal values", c.Name, e.Name)
			continue
		}
		switch name, ok := byEnv[e.Name]; {
		case e.Name == models.ORTLibEnv || e.Name == convert.CacheDirEnv:
		case !ok:
			t.Errorf("container %s: %s is not the variable of any `conveyor serve` flag", c.Name, e.Name)
		default:
			if err := checkValue(flags[name], e.Value); err != nil {
				t.Errorf("container %s: %s=%q: %v", c.Name, e.Name, e.Value, err)
			}
			s.values[name] = e.Value
		}
	}
	args := append(slices.Clone(c.Command), c.Args...)
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("container %s: args %q do not start with the serve command", c.Name, args)
	}
	for i := 1; i < len(args); i++ {
		a := strings.TrimLeft(args[i], "-")
		if !strings.HasPrefix(args[i], "-") {
			t.Fatalf("container %s: unexpected argument %q", c.Name, args[i])
		}
		name, value, hasValue := strings.Cut(a, "=")
		fl, ok := flags[name]
		if !ok {
			t.Fatalf("container %s: %q is not a `conveyor serve` flag", c.Name, args[i])
		}
		if !hasValue {
			if fl.kind == "BoolVar" {
				value = "true"
			} else if i+1 < len(args) {
				i++
				value = args[i]
			}
		}
		if err := checkValue(fl, value); err != nil {
			t.Errorf("container %s: --%s %q: %v", c.Name, name, value, err)
		}
		s.values[name] = value
	}
	return s
}

// checkValue reports whether value parses as the flag's type would parse it.
func checkValue(fl serveFlag, value string) error {
	var err error
	switch fl.kind {
	case "BoolVar":
		_, err = strconv.ParseBool(value)
	case "IntVar":
		_, err = strconv.Atoi(value)
	case "DurationVar":
		_, err = time.ParseDuration(value)
	case "Var": // byteSize, the only Var flag of serve
		_, err = parseSize(value)
	}
	return err
}

// int is the flag's integer value.
func (s serveSettings) int(t *testing.T, name string) int {
	t.Helper()
	v, err := strconv.Atoi(s.values[name])
	if err != nil {
		t.Fatalf("--%s %q: %v", name, s.values[name], err)
	}
	return v
}

// parseSize reads a byte size as written in the manifests: a number of bytes, or with
// KiB, MiB or GiB. (serve's own parser takes more suffixes; this one is only for the
// test's arithmetic and refuses what it does not know.)
func parseSize(s string) (int64, error) {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			return v * u.mult, err
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: write bytes, KiB, MiB or GiB", s)
	}
	return v, nil
}
