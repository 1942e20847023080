package kubernetes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The directories the tests read, relative to this package.
const (
	baseDir     = "."
	overlaysDir = "../overlays"
	repoRoot    = "../.."
)

// kustomization is the part of kustomize's Kustomization (kustomize.config.k8s.io/v1beta1,
// sigs.k8s.io/kustomize/api/types) the manifests use. It is declared here rather than
// imported, to keep kustomize's module graph out of go.mod; decoding is as strict as for
// the other kinds, so a field the manifests start using must be added here.
type kustomization struct {
	metav1.TypeMeta `json:",inline"`
	Namespace       string   `json:"namespace,omitempty"`
	Resources       []string `json:"resources,omitempty"`
	Patches         []struct {
		Path string `json:"path"`
	} `json:"patches,omitempty"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images,omitempty"`
}

// kinds maps "apiVersion kind" to a new object of the upstream Go type it decodes into.
// A document whose apiVersion and kind are not here fails the tests.
var kinds = map[string]func() any{
	"v1 Namespace":                                    func() any { return &corev1.Namespace{} },
	"v1 Service":                                      func() any { return &corev1.Service{} },
	"v1 ServiceAccount":                               func() any { return &corev1.ServiceAccount{} },
	"v1 ConfigMap":                                    func() any { return &corev1.ConfigMap{} },
	"v1 PersistentVolumeClaim":                        func() any { return &corev1.PersistentVolumeClaim{} },
	"apps/v1 Deployment":                              func() any { return &appsv1.Deployment{} },
	"autoscaling/v2 HorizontalPodAutoscaler":          func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"batch/v1 Job":                                    func() any { return &batchv1.Job{} },
	"policy/v1 PodDisruptionBudget":                   func() any { return &policyv1.PodDisruptionBudget{} },
	"rbac.authorization.k8s.io/v1 Role":               func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1 RoleBinding":        func() any { return &rbacv1.RoleBinding{} },
	"rbac.authorization.k8s.io/v1 ClusterRole":        func() any { return &rbacv1.ClusterRole{} },
	"rbac.authorization.k8s.io/v1 ClusterRoleBinding": func() any { return &rbacv1.ClusterRoleBinding{} },
	"gateway.networking.k8s.io/v1 Gateway":            func() any { return &gatewayv1.Gateway{} },
	"gateway.networking.k8s.io/v1 HTTPRoute":          func() any { return &gatewayv1.HTTPRoute{} },
	"inference.networking.k8s.io/v1 InferencePool":    func() any { return &inferencev1.InferencePool{} },
	"kustomize.config.k8s.io/v1beta1 Kustomization":   func() any { return &kustomization{} },
}

// decodeStrict decodes one YAML document into v the way the API server decodes a
// request: duplicate keys, unknown fields and field names that differ in case are errors.
func decodeStrict(doc []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// object is one decoded document.
type object struct {
	source string // file:document, or the kustomization rendered
	key    string // "apiVersion kind"
	obj    any    // a pointer to the upstream type
}

// name is the object's metadata.name.
func (o object) name() string {
	if m, ok := o.obj.(metav1.Object); ok {
		return m.GetName()
	}
	return ""
}

// splitDocuments returns the YAML documents in data, skipping empty ones.
func splitDocuments(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, err
		}
		if s := strings.TrimSpace(string(j)); s == "null" || s == "{}" {
			continue // only comments
		}
		docs = append(docs, doc)
	}
}

// decodeAll decodes every document of data (named source) into its upstream type.
func decodeAll(source string, data []byte) ([]object, error) {
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	var objs []object
	for i, doc := range docs {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", source, i, err)
		}
		key := tm.APIVersion + " " + tm.Kind
		newObj, ok := kinds[key]
		if !ok {
			return nil, fmt.Errorf("%s:%d: no Go type known for apiVersion %q kind %q", source, i, tm.APIVersion, tm.Kind)
		}
		obj := newObj()
		if err := decodeStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("%s:%d (%s): %w", source, i, key, err)
		}
		objs = append(objs, object{source: fmt.Sprintf("%s:%d", source, i), key: key, obj: obj})
	}
	return objs, nil
}

// decodeFile decodes every document of the YAML file at path.
func decodeFile(path string) ([]object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return decodeAll(path, data)
}

// yamlFiles lists the .yaml and .yml files directly in dir.
func yamlFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			files = append(files, e.Name())
		}
	}
	sort.Strings(files)
	return files
}

// kustomizationDirs is the base and every overlay.
func kustomizationDirs(t *testing.T) []string {
	t.Helper()
	dirs := []string{baseDir}
	entries, err := os.ReadDir(overlaysDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(overlaysDir, e.Name()))
		}
	}
	return dirs
}

// readKustomization decodes dir/kustomization.yaml.
func readKustomization(t *testing.T, dir string) *kustomization {
	t.Helper()
	objs, err := decodeFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 {
		t.Fatalf("%s/kustomization.yaml: %d documents, want 1", dir, len(objs))
	}
	k, ok := objs[0].obj.(*kustomization)
	if !ok {
		t.Fatalf("%s/kustomization.yaml is a %s", dir, objs[0].key)
	}
	return k
}

// manifests is the base's objects: every document of every file its kustomization lists.
type manifests []object

// loadBase decodes the base kustomization's resources.
func loadBase(t *testing.T) manifests {
	t.Helper()
	var m manifests
	for _, r := range readKustomization(t, baseDir).Resources {
		objs, err := decodeFile(filepath.Join(baseDir, r))
		if err != nil {
			t.Fatal(err)
		}
		m = append(m, objs...)
	}
	return m
}

// find returns the object of type T named name; it fails the test if there is none or
// more than one.
func find[T any](t *testing.T, m []object, name string) *T {
	t.Helper()
	var found []*T
	for _, o := range m {
		if v, ok := o.obj.(*T); ok && o.name() == name {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want exactly one %T named %q, found %d", zero, name, len(found))
	}
	return found[0]
}

// all returns every object of type T.
func all[T any](m []object) []*T {
	var out []*T
	for _, o := range m {
		if v, ok := o.obj.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}

// container returns the container (or init container) named name of spec.
func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for _, list := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

// TestEveryManifestDecodesStrictly decodes every YAML document in the base and the overlays
// into its upstream type, and requires each directory's kustomization to list exactly the
// manifests next to it (a file it does not list would never be applied).
func TestEveryManifestDecodesStrictly(t *testing.T) {
	for _, dir := range kustomizationDirs(t) {
		k := readKustomization(t, dir)
		listed := []string{"kustomization.yaml"}
		for _, r := range k.Resources {
			if st, err := os.Stat(filepath.Join(dir, r)); err != nil {
				t.Errorf("%s: resource %q: %v", dir, r, err)
			} else if !st.IsDir() {
				listed = append(listed, r)
			}
		}
		for _, p := range k.Patches {
			listed = append(listed, p.Path)
		}
		for _, f := range yamlFiles(t, dir) {
			objs, err := decodeFile(filepath.Join(dir, f))
			if err != nil {
				t.Error(err)
				continue
			}
			if len(objs) == 0 {
				t.Errorf("%s/%s holds no document", dir, f)
			}
			if !slices.Contains(listed, f) {
				t.Errorf("%s/%s is not listed in its kustomization.yaml", dir, f)
			}
		}
		for _, f := range listed {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Errorf("%s: kustomization.yaml lists %q: %v", dir, f, err)
			}
		}
	}
}

// TestDecodeRejectsWhatTheAPIServerWould shows that the decoding above can fail: an unknown
// field, a field name in the wrong case, a duplicate key and an unknown kind are errors.
func TestDecodeRejectsWhatTheAPIServerWould(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":   "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selektor: {a: b}}\n",
		"case mismatch":   "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {Selector: {a: b}}\n",
		"duplicate key":   "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nmetadata: {name: y}\n",
		"unknown kind":    "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
		"unknown version": "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferencePool\nmetadata: {name: x}\n",
		"pool typo":       "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: x}\nspec: {targetPort: [{number: 8000}]}\n",
	} {
		if _, err := decodeAll(name, []byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// render runs kubectl's built-in kustomize on dir and decodes what it would apply.
func render(t *testing.T, kubectl, dir string) []object {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	objs, err := decodeAll("kubectl kustomize "+dir, out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// checkNamespaces requires every namespaced object in objs to be in namespace ns, the
// Namespace object (if any) to be ns, and every ServiceAccount subject of a binding to
// name ns.
func checkNamespaces(t *testing.T, objs []object, ns string) {
	t.Helper()
	for _, o := range objs {
		m, ok := o.obj.(metav1.Object)
		if !ok {
			continue
		}
		switch {
		case o.key == "v1 Namespace":
			if m.GetName() != ns {
				t.Errorf("Namespace %s, want %s", m.GetName(), ns)
			}
		case strings.HasPrefix(o.key, "rbac.authorization.k8s.io/v1 Cluster"):
		case m.GetNamespace() != ns:
			t.Errorf("%s %s is in namespace %q, want %q", o.key, m.GetName(), m.GetNamespace(), ns)
		}
	}
	var subjects []rbacv1.Subject
	for _, rb := range all[rbacv1.RoleBinding](objs) {
		subjects = append(subjects, rb.Subjects...)
	}
	for _, crb := range all[rbacv1.ClusterRoleBinding](objs) {
		subjects = append(subjects, crb.Subjects...)
	}
	for _, s := range subjects {
		if s.Kind == "ServiceAccount" && s.Namespace != ns {
			t.Errorf("binding subject ServiceAccount %s is in namespace %q, want %q", s.Name, s.Namespace, ns)
		}
	}
}

// TestRenderedKustomizationsDecodeStrictly renders the base and each overlay with kubectl's
// built-in kustomize (skipped without kubectl) and decodes what would be applied; and
// renders the base into another namespace, which must move everything.
func TestRenderedKustomizationsDecodeStrictly(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not on PATH; the rendered output is not checked")
	}
	for _, dir := range kustomizationDirs(t) {
		t.Run(filepath.Base(filepath.Clean(dir)), func(t *testing.T) {
			objs := render(t, kubectl, dir)
			checkNamespaces(t, objs, readKustomization(t, baseDir).Namespace)
			for _, spec := range podSpecs(objs) {
				for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
					// The base names its image "conveyor" and lets kustomize's images
					// setting say where it was pushed; a bare name left over means a
					// kustomization forgot that setting.
					if !strings.Contains(c.Image, "/") || !strings.Contains(c.Image, ":") {
						t.Errorf("container %s: image %q is not a registry reference", c.Name, c.Image)
					}
				}
			}
			dep := find[appsv1.Deployment](t, objs, "conveyor")
			model := volume(t, &dep.Spec.Template.Spec, "model")
			switch filepath.Base(dir) {
			case ".":
				if model.EmptyDir == nil || len(dep.Spec.Template.Spec.InitContainers) != 1 {
					t.Errorf("base: want the model emptyDir filled by one initContainer")
				}
			case "model-pvc":
				if model.PersistentVolumeClaim == nil || model.EmptyDir != nil || len(dep.Spec.Template.Spec.InitContainers) != 0 {
					t.Errorf("model-pvc: want the model volume a claim, no emptyDir, no initContainer")
				} else {
					find[corev1.PersistentVolumeClaim](t, objs, model.PersistentVolumeClaim.ClaimName)
				}
			case "model-image":
				if model.Image == nil || model.EmptyDir != nil || len(dep.Spec.Template.Spec.InitContainers) != 0 {
					t.Errorf("model-image: want the model volume an image, no emptyDir, no initContainer")
				}
			default:
				t.Errorf("overlay %s is not covered by this test", dir)
			}
		})
	}
	t.Run("another-namespace", func(t *testing.T) {
		tmp := t.TempDir()
		abs, err := filepath.Abs(baseDir)
		if err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(tmp, abs)
		if err != nil {
			t.Fatal(err)
		}
		k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: llm-serving\nresources:\n  - " + filepath.ToSlash(rel) + "\n"
		if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			t.Fatal(err)
		}
		checkNamespaces(t, render(t, kubectl, tmp), "llm-serving")
	})
}

// podSpecs returns the pod templates of the Deployments and Jobs in objs.
func podSpecs(objs []object) []*corev1.PodSpec {
	var specs []*corev1.PodSpec
	for _, d := range all[appsv1.Deployment](objs) {
		specs = append(specs, &d.Spec.Template.Spec)
	}
	for _, j := range all[batchv1.Job](objs) {
		specs = append(specs, &j.Spec.Template.Spec)
	}
	return specs
}

// volume returns the pod volume named name.
func volume(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Volume {
	t.Helper()
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	t.Fatalf("no volume %q", name)
	return nil
}
