package kubernetes

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"sigs.k8s.io/yaml"
)

// docsKinds are kinds docs/deploy.md shows whose Go types are outside this module's
// dependencies; their examples are not decoded.
var docsKinds = []string{"networking.istio.io/v1 DestinationRule"}

// docsObjects decodes the Kubernetes objects in docs/deploy.md's yaml code blocks. A block
// without apiVersion and kind (a tool's configuration) is skipped; one of a kind neither
// the tests nor docsKinds know fails the test.
func docsObjects(t *testing.T) []object {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	var objs []object
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(doc, -1)
	for i, b := range blocks {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(b[1], &head); err != nil {
			t.Errorf("docs/deploy.md yaml block %d: %v", i, err)
			continue
		}
		key := head.APIVersion + " " + head.Kind
		if head.Kind == "" || slices.Contains(docsKinds, key) {
			continue
		}
		o, err := decodeAll(fmt.Sprintf("docs/deploy.md yaml block %d", i), b[1])
		if err != nil {
			t.Error(err)
			continue
		}
		objs = append(objs, o...)
	}
	return objs
}

// TestDocsExamples decodes the objects docs/deploy.md shows and checks that its
// autoscaler scales the Conveyor Deployment in the manifests' namespace on per-pod metrics.
// (TestEndpointPickerMetricsOnRealServer checks that those metrics exist as gauges.)
func TestDocsExamples(t *testing.T) {
	objs := docsObjects(t)
	hpas := all[autoscalingv2.HorizontalPodAutoscaler](objs)
	if len(hpas) != 1 {
		t.Fatalf("docs/deploy.md shows %d HorizontalPodAutoscalers, want 1", len(hpas))
	}
	hpa := hpas[0]
	dep := find[appsv1.Deployment](t, loadBase(t), conveyorName)
	ref := hpa.Spec.ScaleTargetRef
	if ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || ref.Name != dep.Name {
		t.Errorf("the autoscaler scales %s %s, not Deployment %s", ref.Kind, ref.Name, dep.Name)
	}
	if ns := readKustomization(t, baseDir).Namespace; hpa.Namespace != ns {
		t.Errorf("the autoscaler is in namespace %q, the manifests in %q", hpa.Namespace, ns)
	}
	if len(docsHPAMetrics(t, hpa)) == 0 {
		t.Error("the autoscaler scales on no per-pod metric")
	}
}

// docsHPAMetrics returns the names of the per-pod metrics hpa scales on.
func docsHPAMetrics(t *testing.T, hpa *autoscalingv2.HorizontalPodAutoscaler) []string {
	t.Helper()
	var names []string
	for _, m := range hpa.Spec.Metrics {
		if m.Type != autoscalingv2.PodsMetricSourceType || m.Pods == nil {
			t.Errorf("autoscaler metric of type %s: the example uses per-pod metrics", m.Type)
			continue
		}
		names = append(names, m.Pods.Metric.Name)
	}
	return names
}
