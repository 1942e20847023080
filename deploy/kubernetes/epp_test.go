package kubernetes

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	configv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
)

// eppFlags are the flags the endpoint picker of v1.5.0 defines (pkg/epp/server/options.go,
// pkg/common/observability/logging/options.go and controller-runtime's zap flags).
var eppFlags = []string{
	"grpc-port", "ha-enable-leader-election", "pool-group", "pool-namespace", "pool-name",
	"endpoint-selector", "endpoint-target-ports", "disable-endpoint-subset-filter",
	"model-server-metrics-scheme", "model-server-metrics-path", "model-server-metrics-port",
	"model-server-metrics-https-insecure-skip-verify", "refresh-metrics-interval",
	"refresh-prometheus-metrics-interval", "metrics-staleness-threshold",
	"total-queued-requests-metric", "total-running-requests-metric",
	"kv-cache-usage-percentage-metric", "lora-info-metric", "cache-info-metric",
	"v", "zap-devel", "zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding",
	"tracing", "health-checking", "metrics-port", "grpc-health-port", "enable-pprof",
	"cert-path", "enable-cert-reload", "secure-serving", "metrics-endpoint-auth",
	"config-file", "config-text",
}

// eppMetricFlags are the metric-name flags v1.5.0 still defines but refuses: its Validate
// returns "flag ... is deprecated and cannot be used; configure metrics via engineConfigs
// in EndpointPickerConfig instead", and the picker exits.
var eppMetricFlags = []string{
	"total-queued-requests-metric", "total-running-requests-metric",
	"kv-cache-usage-percentage-metric", "lora-info-metric", "cache-info-metric",
}

// engineConfig and extractorParams mirror the core-metrics-extractor plugin's parameters
// in v1.5.0 (engineConfigParams and modelServerExtractorParams, unexported, in
// pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go). The picker itself
// decodes them leniently, so a misspelt field there would be silently ignored; here it
// fails.
type engineConfig struct {
	Name                    string `json:"name"`
	QueuedRequestsSpec      string `json:"queuedRequestsSpec"`
	RunningRequestsSpec     string `json:"runningRequestsSpec"`
	KVUsageSpec             string `json:"kvUsageSpec"`
	LoRASpec                string `json:"loraSpec"`
	CacheInfoSpec           string `json:"cacheInfoSpec"`
	CacheBlockSizeLabelName string `json:"cacheBlockSizeLabelName,omitempty"`
	CacheNumBlocksLabelName string `json:"cacheNumBlocksLabelName,omitempty"`
	CacheBlockSizeSpec      string `json:"cacheBlockSizeSpec,omitempty"`
	CacheNumBlocksSpec      string `json:"cacheNumBlocksSpec,omitempty"`
}

type extractorParams struct {
	EngineLabelKey string         `json:"engineLabelKey"`
	DefaultEngine  string         `json:"defaultEngine"`
	EngineConfigs  []engineConfig `json:"engineConfigs"`
}

// dataSourceParams mirrors the metrics-data-source plugin's parameters in v1.5.0
// (metricsDatasourceParams, pkg/epp/framework/plugins/datalayer/source/metrics/datasource.go).
type dataSourceParams struct {
	Scheme             string `json:"scheme"`
	Path               string `json:"path"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify"`
}

// eppArgs parses the picker container's args, all --name=value, into a map, and fails on
// a flag v1.5.0 does not define or refuses.
func eppArgs(t *testing.T, c *corev1.Container) map[string]string {
	t.Helper()
	args := map[string]string{}
	for _, a := range c.Args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Errorf("picker arg %q: write flags as --name=value", a)
			continue
		}
		switch {
		case slices.Contains(eppMetricFlags, name):
			t.Errorf("picker arg %q: v1.5.0 refuses the metric-name flags and exits; set the names in the EndpointPickerConfig's engineConfigs", a)
		case !slices.Contains(eppFlags, name):
			t.Errorf("picker arg %q: not a flag of the v1.5.0 endpoint picker", a)
		}
		args[name] = value
	}
	return args
}

// eppConfig returns the picker's EndpointPickerConfig (decoded strictly into the
// extension's own type) and its Conveyor engine config.
func eppConfig(t *testing.T, m manifests) (*configv1alpha1.EndpointPickerConfig, engineConfig, extractorParams) {
	t.Helper()
	cm := find[corev1.ConfigMap](t, m, eppName)
	text, ok := cm.Data[eppConfigKey]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", cm.Name, eppConfigKey)
	}
	var cfg configv1alpha1.EndpointPickerConfig
	if err := decodeStrict([]byte(text), &cfg); err != nil {
		t.Fatalf("ConfigMap %s, %s: %v", cm.Name, eppConfigKey, err)
	}
	if cfg.APIVersion != "inference.networking.x-k8s.io/v1alpha1" || cfg.Kind != "EndpointPickerConfig" {
		t.Errorf("picker config is %s %s, want inference.networking.x-k8s.io/v1alpha1 EndpointPickerConfig", cfg.APIVersion, cfg.Kind)
	}
	var params *extractorParams
	for _, p := range cfg.Plugins {
		switch p.Type {
		case extractorType:
			params = &extractorParams{}
			if err := decodeStrict(p.Parameters, params); err != nil {
				t.Fatalf("%s parameters: %v", p.Type, err)
			}
		case "metrics-data-source":
			var ds dataSourceParams
			if err := decodeStrict(p.Parameters, &ds); err != nil {
				t.Fatalf("%s parameters: %v", p.Type, err)
			}
			if ds.Scheme != "http" || ds.Path != "/metrics" {
				t.Errorf("metrics-data-source scrapes %s://...%s; conveyor serve answers http on /metrics", ds.Scheme, ds.Path)
			}
		default:
			if len(p.Parameters) > 0 {
				t.Errorf("plugin %s has parameters the test does not check", p.Type)
			}
		}
	}
	if params == nil {
		t.Fatalf("picker config has no %s plugin: the picker would read vLLM's metric names", extractorType)
	}
	for _, ec := range params.EngineConfigs {
		if ec.Name == params.DefaultEngine {
			return &cfg, ec, *params
		}
	}
	t.Fatalf("defaultEngine %q is not among the engineConfigs", params.DefaultEngine)
	return nil, engineConfig{}, extractorParams{}
}

// moduleVersion is the version of module path that go.mod requires. (A test binary
// carries no dependency list in its build info, so go.mod is read.)
func moduleVersion(t *testing.T, path string) string {
	t.Helper()
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(path) + `\s+(v\S+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatalf("go.mod does not require %s", path)
	}
	return string(m[1])
}

// TestEndpointPickerConfig checks the picker's image, flags and configuration: the image
// is the release of the InferencePool API go.mod pins, its flags are ones that release
// accepts, and its metric names come from an engine config the Conveyor pods select.
func TestEndpointPickerConfig(t *testing.T) {
	m := loadBase(t)
	dep := find[appsv1.Deployment](t, m, eppName)
	c := container(t, &dep.Spec.Template.Spec, "epp")
	if want := eppImageRepo + ":" + moduleVersion(t, inferenceMod); c.Image != want {
		t.Errorf("picker image %s, want %s: the picker and the InferencePool types the tests decode must be one release", c.Image, want)
	}
	args := eppArgs(t, c)

	// --config-file names a key of the picker's ConfigMap, mounted where the flag points.
	file := args["config-file"]
	var mounted bool
	for _, vm := range c.VolumeMounts {
		if path.Dir(file) != path.Clean(vm.MountPath) {
			continue
		}
		v := volume(t, &dep.Spec.Template.Spec, vm.Name)
		mounted = v.ConfigMap != nil && v.ConfigMap.Name == eppName && path.Base(file) == eppConfigKey
	}
	if !mounted {
		t.Errorf("--config-file=%s is not the %s key of ConfigMap %s mounted in the picker", file, eppConfigKey, eppName)
	}

	cfg, conveyor, params := eppConfig(t, m)
	for _, spec := range []struct{ what, spec string }{
		{"queuedRequestsSpec", conveyor.QueuedRequestsSpec},
		{"runningRequestsSpec", conveyor.RunningRequestsSpec},
		{"kvUsageSpec", conveyor.KVUsageSpec},
		{"cacheInfoSpec", conveyor.CacheInfoSpec},
	} {
		if spec.spec == "" {
			t.Errorf("engine %s: %s is empty", conveyor.Name, spec.what)
		}
	}
	if conveyor.LoRASpec != "" {
		t.Errorf("engine %s: loraSpec %q; Conveyor serves no LoRA adapters, so it must be \"\"", conveyor.Name, conveyor.LoRASpec)
	}
	// Each scheduling profile's plugins are defined.
	defined := map[string]bool{}
	for _, p := range cfg.Plugins {
		if p.Name != "" {
			defined[p.Name] = true // a named plugin is referred to by its name
		} else {
			defined[p.Type] = true // an unnamed one by its type
		}
	}
	for _, prof := range cfg.SchedulingProfiles {
		for _, p := range prof.Plugins {
			if !defined[p.PluginRef] {
				t.Errorf("profile %s: pluginRef %s names no plugin", prof.Name, p.PluginRef)
			}
		}
	}

	// The Conveyor pods carry the engine-type label that selects this engine config (or
	// no label, which selects the default engine).
	pods := find[appsv1.Deployment](t, m, conveyorName).Spec.Template.Labels
	if label, ok := pods[params.EngineLabelKey]; ok && label != conveyor.Name {
		t.Errorf("Conveyor pods are labelled %s=%s, but the Conveyor engine config is %q", params.EngineLabelKey, label, conveyor.Name)
	}

	// The picker finds its pool's namespace in NAMESPACE unless --pool-namespace is given.
	if _, ok := args["pool-namespace"]; !ok {
		var ok bool
		for _, e := range c.Env {
			ok = ok || e.Name == "NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace"
		}
		if !ok {
			t.Error("picker has neither --pool-namespace nor NAMESPACE from metadata.namespace (it would look in \"default\")")
		}
	}
}
