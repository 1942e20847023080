package kubernetes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
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
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The directories the tests read, relative to this package.
const (
	baseDir     = "."
	overlaysDir = "../overlays"
	repoRoot    = "../.."
)

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
	"kustomize.config.k8s.io/v1beta1 Kustomization":   func() any { return &kusttypes.Kustomization{} },
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
func readKustomization(t *testing.T, dir string) *kusttypes.Kustomization {
	t.Helper()
	objs, err := decodeFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 {
		t.Fatalf("%s/kustomization.yaml: %d documents, want 1", dir, len(objs))
	}
	k, ok := objs[0].obj.(*kusttypes.Kustomization)
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

// render builds dir with kustomize's Go API (sigs.k8s.io/kustomize/api/krusty, the library
// `kubectl kustomize` and `kubectl apply -k` embed, with their default options: no plugins,
// files only from under the kustomization's root) and decodes what would be applied.
func render(dir string) ([]object, error) {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	out, err := resources.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return decodeAll("kustomize build "+dir, out)
}

// mustRender is render, failing the test on an error.
func mustRender(t *testing.T, dir string) []object {
	t.Helper()
	objs, err := render(dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// overlayOf writes, in a new temporary directory, a kustomization whose one resource is
// base (named by a relative path: kustomize loads a base from anywhere, other files only
// from under the root), with the further fields given as YAML lines and one patch per
// entry of patches (file name to content). It returns the directory.
func overlayOf(t *testing.T, base, fields string, patches map[string]string) string {
	t.Helper()
	tmp := t.TempDir()
	abs, err := filepath.Abs(base)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(tmp, abs)
	if err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + filepath.ToSlash(rel) + "\n" + fields
	if len(patches) > 0 {
		k += "patches:\n"
	}
	for _, name := range slices.Sorted(maps.Keys(patches)) {
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(patches[name]), 0o644); err != nil {
			t.Fatal(err)
		}
		k += "  - path: " + name + "\n"
	}
	if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return tmp
}

// checkRendered checks what a kustomization renders to, as a whole: every object is in
// namespace ns (checkNamespaces), every image is a registry reference (checkImages) and
// every port named rather than numbered exists (checkPorts).
func checkRendered(objs []object, ns string) error {
	return errors.Join(checkNamespaces(objs, ns), checkImages(objs), checkPorts(objs))
}

// checkNamespaces requires every namespaced object in objs to be in namespace ns, the
// Namespace object (if any) to be ns, and every ServiceAccount subject of a binding to
// name ns.
func checkNamespaces(objs []object, ns string) error {
	var errs []error
	for _, o := range objs {
		m, ok := o.obj.(metav1.Object)
		if !ok {
			continue
		}
		switch {
		case o.key == "v1 Namespace":
			if m.GetName() != ns {
				errs = append(errs, fmt.Errorf("Namespace %s, want %s", m.GetName(), ns))
			}
		case strings.HasPrefix(o.key, "rbac.authorization.k8s.io/v1 Cluster"):
		case m.GetNamespace() != ns:
			errs = append(errs, fmt.Errorf("%s %s is in namespace %q, want %q", o.key, m.GetName(), m.GetNamespace(), ns))
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
			errs = append(errs, fmt.Errorf("binding subject ServiceAccount %s is in namespace %q, want %q", s.Name, s.Namespace, ns))
		}
	}
	return errors.Join(errs...)
}

// checkImages requires every container's image to be a registry reference. The base
// names its image "conveyor" and lets kustomize's images setting say where it was pushed;
// a bare name left over means a kustomization forgot that setting.
func checkImages(objs []object) error {
	var errs []error
	for _, p := range podTemplates(objs) {
		for _, c := range allContainers(p.spec) {
			if !strings.Contains(c.Image, "/") || !strings.Contains(c.Image, ":") {
				errs = append(errs, fmt.Errorf("%s, container %s: image %q is not a registry reference", p.owner, c.Name, c.Image))
			}
		}
	}
	return errors.Join(errs...)
}

// checkPorts requires every port given by name to be a container port where Kubernetes
// looks the name up. Nothing rejects a wrong name when it is applied: a Service whose
// targetPort names no port of a pod just gets no endpoint in it, and a probe on a missing
// port fails until the pod is restarted. So every Service must select a pod template
// here, and its named targetPorts be a container port of each one it selects; a probe's
// named httpGet or tcpSocket port must be a port of the probe's own container.
func checkPorts(objs []object) error {
	var errs []error
	pods := podTemplates(objs)
	for _, svc := range all[corev1.Service](objs) {
		var selected []podTemplate
		for _, p := range pods {
			if selects(svc.Spec.Selector, p.labels) {
				selected = append(selected, p)
			}
		}
		if len(selected) == 0 {
			errs = append(errs, fmt.Errorf("Service %s selects none of the pods (selector %v)", svc.Name, svc.Spec.Selector))
		}
		for _, sp := range svc.Spec.Ports {
			if sp.TargetPort.Type != intstr.String {
				continue
			}
			for _, p := range selected {
				if !slices.ContainsFunc(p.spec.Containers, func(c corev1.Container) bool { return hasPort(&c, sp.TargetPort.StrVal) }) {
					errs = append(errs, fmt.Errorf("Service %s port %s: targetPort %q is no container port of %s", svc.Name, sp.Name, sp.TargetPort.StrVal, p.owner))
				}
			}
		}
	}
	for _, p := range pods {
		for _, c := range allContainers(p.spec) {
			for _, probe := range []struct {
				what string
				p    *corev1.Probe
			}{{"startupProbe", c.StartupProbe}, {"readinessProbe", c.ReadinessProbe}, {"livenessProbe", c.LivenessProbe}} {
				if probe.p == nil {
					continue
				}
				for _, port := range []*intstr.IntOrString{httpGetPort(probe.p), tcpSocketPort(probe.p)} {
					if port != nil && port.Type == intstr.String && !hasPort(&c, port.StrVal) {
						errs = append(errs, fmt.Errorf("%s, container %s: %s port %q is no port of the container", p.owner, c.Name, probe.what, port.StrVal))
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// hasPort reports whether c has a port named name.
func hasPort(c *corev1.Container, name string) bool {
	return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == name })
}

// httpGetPort is p's httpGet port, or nil.
func httpGetPort(p *corev1.Probe) *intstr.IntOrString {
	if p.HTTPGet == nil {
		return nil
	}
	return &p.HTTPGet.Port
}

// tcpSocketPort is p's tcpSocket port, or nil.
func tcpSocketPort(p *corev1.Probe) *intstr.IntOrString {
	if p.TCPSocket == nil {
		return nil
	}
	return &p.TCPSocket.Port
}

// TestRenderedKustomizationsDecodeStrictly renders the base and each overlay with
// kustomize, decodes what would be applied and checks it (checkRendered); and renders the
// base into another namespace, which must move everything.
func TestRenderedKustomizationsDecodeStrictly(t *testing.T) {
	ns := readKustomization(t, baseDir).Namespace
	for _, dir := range kustomizationDirs(t) {
		t.Run(filepath.Base(filepath.Clean(dir)), func(t *testing.T) {
			objs := mustRender(t, dir)
			if err := checkRendered(objs, ns); err != nil {
				t.Error(err)
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
		objs := mustRender(t, overlayOf(t, baseDir, "namespace: llm-serving\n", nil))
		if err := checkNamespaces(objs, "llm-serving"); err != nil {
			t.Error(err)
		}
	})
}

// TestCheckRenderedCatchesBrokenOverlays shows that checkRendered can fail. Each case
// patches a real overlay the way an edit of it could go wrong; the result still renders
// and decodes, since the API server would accept it too, but a port name no longer
// resolves.
func TestCheckRenderedCatchesBrokenOverlays(t *testing.T) {
	ns := readKustomization(t, baseDir).Namespace
	for name, c := range map[string]struct {
		overlay, patch, want string
	}{
		"wrong Service targetPort": {
			overlay: "model-pvc",
			patch:   "apiVersion: v1\nkind: Service\nmetadata: {name: conveyor}\nspec:\n  ports:\n    - {port: 8000, protocol: TCP, targetPort: htp}\n",
			want:    `Service conveyor port http: targetPort "htp" is no container port of Deployment conveyor`,
		},
		"container port renamed": {
			overlay: "model-image",
			patch:   "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: conveyor}\nspec:\n  template:\n    spec:\n      containers:\n        - name: conveyor\n          ports:\n            - {containerPort: 8000, protocol: TCP, name: web}\n",
			want:    `Deployment conveyor, container conveyor: readinessProbe port "http" is no port of the container`,
		},
		"wrong probe port": {
			overlay: "model-image",
			patch:   "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: conveyor}\nspec:\n  template:\n    spec:\n      containers:\n        - name: conveyor\n          startupProbe:\n            httpGet: {port: htp}\n",
			want:    `Deployment conveyor, container conveyor: startupProbe port "htp" is no port of the container`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := overlayOf(t, filepath.Join(overlaysDir, c.overlay), "", map[string]string{"broken.yaml": c.patch})
			err := checkRendered(mustRender(t, dir), ns)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("checkRendered = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// podTemplate is the pod template of a Deployment or a Job.
type podTemplate struct {
	owner  string // "Deployment conveyor"
	labels map[string]string
	spec   *corev1.PodSpec
}

// podTemplates returns the pod templates of the Deployments and Jobs in objs.
func podTemplates(objs []object) []podTemplate {
	var pods []podTemplate
	for _, d := range all[appsv1.Deployment](objs) {
		pods = append(pods, podTemplate{"Deployment " + d.Name, d.Spec.Template.Labels, &d.Spec.Template.Spec})
	}
	for _, j := range all[batchv1.Job](objs) {
		pods = append(pods, podTemplate{"Job " + j.Name, j.Spec.Template.Labels, &j.Spec.Template.Spec})
	}
	return pods
}

// podSpecs returns the pod specs of the Deployments and Jobs in objs.
func podSpecs(objs []object) []*corev1.PodSpec {
	var specs []*corev1.PodSpec
	for _, p := range podTemplates(objs) {
		specs = append(specs, p.spec)
	}
	return specs
}

// allContainers returns spec's init containers and containers.
func allContainers(spec *corev1.PodSpec) []corev1.Container {
	return append(slices.Clone(spec.InitContainers), spec.Containers...)
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
