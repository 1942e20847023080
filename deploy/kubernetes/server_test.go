package kubernetes

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"

	"github.com/conveyor-llm/conveyor/api"
	"github.com/conveyor-llm/conveyor/api/openai"
	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// ortLib finds ONNX Runtime: $CONVEYOR_ORT_LIB, else .ort/libonnxruntime.so.1 at the
// repository root (where `make ort` puts it).
func ortLib(t *testing.T) string {
	t.Helper()
	lib := os.Getenv(models.ORTLibEnv)
	if lib == "" {
		lib, _ = filepath.Abs(filepath.Join(repoRoot, models.DefaultORTLib))
	}
	if _, err := os.Stat(lib); err != nil {
		t.Fatalf("ONNX Runtime library %q is missing: run `make ort` (or set %s)", lib, models.ORTLibEnv)
	}
	return lib
}

// metricSpec is a metric specification as the picker writes it: a name, optionally with
// label matchers, e.g. conveyor_num_requests_waiting or name{label=value}.
var metricSpec = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?$`)

// specName returns a specification's metric name, failing on any it cannot read.
func specName(t *testing.T, spec string) string {
	t.Helper()
	m := metricSpec.FindStringSubmatch(spec)
	if m == nil {
		t.Fatalf("metric specification %q is not a name or name{labels}", spec)
	}
	if m[2] != "" {
		t.Fatalf("metric specification %q has label matchers; Conveyor's gauges carry none", spec)
	}
	return m[1]
}

// get returns the status of GET base+path.
func get(t *testing.T, base, path string) int {
	t.Helper()
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// testServer is the real API server on a free local port.
type testServer struct {
	*api.Server
	metrics *api.Metrics // the server's Config.Metrics
	base    string       // http://127.0.0.1:port
	served  chan error
	drained bool
}

// startServer starts the real API server on a free local port without a model, as
// `conveyor serve` listens while the model loads. The test's cleanup drains it unless the
// test did.
func startServer(t *testing.T) *testServer {
	t.Helper()
	acfg := api.DefaultConfig()
	acfg.ModelName = "tiny"
	acfg.Metrics = api.NewMetrics()
	acfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := api.New(acfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{Server: srv, metrics: acfg.Metrics, base: "http://" + ln.Addr().String(), served: make(chan error, 1)}
	go func() { s.served <- srv.Serve(ln) }()
	t.Cleanup(func() { _ = s.drain() })
	return s
}

// drain shuts the server down as SIGTERM does, waits for Serve to return and returns the
// errors of both; after the first call it does nothing.
func (s *testServer) drain() error {
	if s.drained {
		return nil
	}
	s.drained = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.Shutdown(ctx)
	return errors.Join(err, <-s.served)
}

// loadTiny builds the tiny test model with random weights, starts the real engine on it
// with ecfg (its steps feeding the server's metrics) and hands it to the server, as serve
// does once the model is loaded. The test's cleanup stops the engine.
func (s *testServer) loadTiny(t *testing.T, ecfg engine.Config) *engine.Engine {
	t.Helper()
	lib := ortLib(t)
	if err := models.InitORT(lib); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := convert.BuildRandom(filepath.Join(repoRoot, "models", "testdata", "tiny-llama", "config.json"), dir, 7, convert.Options{}); err != nil {
		t.Fatal(err)
	}
	runner, err := models.Open(dir, models.RunnerOptions{ORTLib: lib, IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = runner.Close() })
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ecfg.OnStep = s.metrics.OnStep
	eng, err := engine.New(ecfg, runner, tok)
	if err != nil {
		t.Fatal(err)
	}
	eng.Start(context.Background())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Shutdown(ctx)
	})
	s.SetBackend(api.Backend{Engine: eng, Tokenizer: openai.NewTokenizer(tok), MaxModelLen: eng.MaxModelLen()})
	return eng
}

// TestEndpointPickerMetricsOnRealServer starts the real API server and engine on the tiny
// test model, as `conveyor serve` wires them, and checks it against the manifests: the
// probe paths answer as the probes need while loading, serving and draining, and every
// metric the picker's engine config names is a gauge in /metrics.
func TestEndpointPickerMetricsOnRealServer(t *testing.T) {
	m := loadBase(t)
	c := container(t, &find[appsv1.Deployment](t, m, conveyorName).Spec.Template.Spec, "conveyor")
	readyPath, startupPath, livePath := c.ReadinessProbe.HTTPGet.Path, c.StartupProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path
	_, conveyor, _ := eppConfig(t, m)

	srv := startServer(t)
	base := srv.base

	// Loading (the server listens before the model is ready, as serve does): readiness
	// and startup fail, liveness passes.
	for _, p := range []string{readyPath, startupPath} {
		if got := get(t, base, p); got != http.StatusServiceUnavailable {
			t.Errorf("while loading, GET %s = %d, want 503", p, got)
		}
	}
	if got := get(t, base, livePath); got != http.StatusOK {
		t.Errorf("while loading, liveness GET %s = %d, want 200 (the pod would be restarted mid-load)", livePath, got)
	}

	ecfg := engine.DefaultConfig()
	ecfg.BlockSizeTokens = 16
	ecfg.KVCacheBytes = 8 << 20
	eng := srv.loadTiny(t, ecfg)

	// Serving: every probe passes.
	for _, p := range []string{readyPath, startupPath, livePath} {
		if got := get(t, base, p); got != http.StatusOK {
			t.Errorf("when ready, GET %s = %d, want 200", p, got)
		}
	}

	// /metrics as the picker's metrics-data-source reads it.
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	gauge := func(spec, what string) *dto.Metric {
		t.Helper()
		name := specName(t, spec)
		f, ok := families[name]
		switch {
		case !ok:
			t.Errorf("%s %s: no such metric in /metrics", what, name)
			return nil
		case f.GetType() != dto.MetricType_GAUGE:
			t.Errorf("%s %s is a %v, want a gauge", what, name, f.GetType())
			return nil
		case len(f.GetMetric()) != 1:
			t.Errorf("%s %s has %d series, want 1", what, name, len(f.GetMetric()))
			return nil
		}
		return f.GetMetric()[0]
	}
	for _, s := range []struct{ spec, what string }{
		{conveyor.QueuedRequestsSpec, "queuedRequestsSpec"},
		{conveyor.RunningRequestsSpec, "runningRequestsSpec"},
	} {
		if g := gauge(s.spec, s.what); g != nil && g.GetGauge().GetValue() != 0 {
			t.Errorf("%s %s = %v on an idle server", s.what, s.spec, g.GetGauge().GetValue())
		}
	}
	// The metrics docs/deploy.md's autoscaler example scales on are per-pod gauges too.
	for _, hpa := range all[autoscalingv2.HorizontalPodAutoscaler](docsObjects(t)) {
		for _, name := range docsHPAMetrics(t, hpa) {
			gauge(name, "docs/deploy.md autoscaler metric")
		}
	}
	if g := gauge(conveyor.KVUsageSpec, "kvUsageSpec"); g != nil {
		if v := g.GetGauge().GetValue(); v < 0 || v > 1 {
			t.Errorf("kvUsageSpec %s = %v, want a 0..1 fraction", conveyor.KVUsageSpec, v)
		}
	}
	if g := gauge(conveyor.CacheInfoSpec, "cacheInfoSpec"); g != nil {
		labels := map[string]string{}
		for _, l := range g.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for label, want := range map[string]int{
			conveyor.CacheBlockSizeLabelName: ecfg.BlockSizeTokens,
			conveyor.CacheNumBlocksLabelName: eng.NumKVBlocks(),
		} {
			if got, err := strconv.Atoi(labels[label]); err != nil || got != want {
				t.Errorf("cacheInfoSpec %s{%s} = %q, want %d", conveyor.CacheInfoSpec, label, labels[label], want)
			}
		}
	}

	// Draining (what SIGTERM starts): readiness fails. The listener is closed by then, so
	// ask the handler directly.
	if err := srv.drain(); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, readyPath, nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("while draining, GET %s = %d, want 503", readyPath, rec.Code)
	}
	if _, err := http.Get(base + readyPath); err == nil {
		t.Errorf("after the drain began, %s still accepted a connection", base)
	}
}
