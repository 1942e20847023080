package kubernetes

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	configv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"

	"github.com/conveyor-llm/conveyor/engine"
)

// pickerFactories are the factories of the picker's data-layer plugins, under the type
// names v1.5.0 registers them with (cmd/epp/runner/runner.go).
var pickerFactories = map[string]fwkplugin.FactoryFunc{
	sourcemetrics.MetricsDataSourceType:   sourcemetrics.MetricsDataSourceFactory,
	extractormetrics.MetricsExtractorType: extractormetrics.CoreMetricsExtractorFactory,
}

// pickerScraper is the endpoint picker's own metrics path, built from an
// EndpointPickerConfig: the metrics-data-source plugin fetches and parses a model
// server's /metrics, and the core-metrics-extractor plugin reads queue depth, running
// requests, KV-cache usage and the cache layout out of it with its engine configs.
type pickerScraper struct {
	source    fwkdl.PollingDataSource
	extractor fwkdl.Extractor
}

// newPickerScraper makes the two plugins of cfg with the release's own factories, handing
// each its parameters as the config writes them, as the picker does at start-up.
func newPickerScraper(cfg *configv1alpha1.EndpointPickerConfig) (*pickerScraper, error) {
	var p pickerScraper
	for _, spec := range cfg.Plugins {
		factory, ok := pickerFactories[spec.Type]
		if !ok {
			continue
		}
		name := spec.Name
		if name == "" {
			name = spec.Type
		}
		plugin, err := factory(name, spec.Parameters, nil)
		if err != nil {
			return nil, fmt.Errorf("plugin %s: %w", name, err)
		}
		switch plugin := plugin.(type) {
		case fwkdl.PollingDataSource:
			p.source = plugin
		case fwkdl.Extractor:
			p.extractor = plugin
		}
	}
	if p.source == nil || p.extractor == nil {
		return nil, fmt.Errorf("the config lacks a %s or a %s plugin", sourcemetrics.MetricsDataSourceType, extractormetrics.MetricsExtractorType)
	}
	return &p, nil
}

// scrape polls ep once, as the picker's collector does on every refresh: fetch, then
// extract into ep's metrics. It returns ep's metrics and the error the picker would log,
// if any (a metric it could not read leaves that field as it was).
func (p *pickerScraper) scrape(ctx context.Context, ep fwkdl.Endpoint) (*fwkdl.Metrics, error) {
	ctx = logr.NewContext(ctx, logr.Discard()) // the plugins log through controller-runtime
	data, err := p.source.Poll(ctx, ep)
	if err == nil {
		err = p.extractor.Extract(ctx, data, ep)
	}
	return ep.GetMetrics(), err
}

// withPickerConfig returns a copy of m whose picker configuration (the text of the
// picker's ConfigMap key) is edit's result.
func withPickerConfig(m manifests, edit func(string) string) manifests {
	out := slices.Clone(m)
	for i, o := range out {
		if cm, ok := o.obj.(*corev1.ConfigMap); ok && cm.Name == eppName {
			cm = cm.DeepCopy()
			cm.Data[eppConfigKey] = edit(cm.Data[eppConfigKey])
			out[i].obj = cm
		}
	}
	return out
}

// streamCompletion sends a streaming /v1/completions request that generates maxTokens
// tokens and reads the stream to its end.
func streamCompletion(base string, maxTokens int) error {
	body := fmt.Sprintf(`{"model":"tiny","prompt":"Once upon a time","max_tokens":%d,"ignore_eos":true,"stream":true}`, maxTokens)
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /v1/completions: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the stream ended without data: [DONE]")
}

// TestEndpointPickerReadsConveyor runs the endpoint picker's own metrics code (v1.5.0's
// metrics-data-source and core-metrics-extractor plugins, made from the deploy's
// EndpointPickerConfig) against a real Conveyor server on the tiny test model, as the
// picker would scrape a Conveyor pod: idle, it reads no queue, no running requests and
// no KV usage, and the server's KV block size and count; under more concurrent requests
// than the engine runs at once, it reads requests queued and running and KV blocks in use;
// after they finish, zeros again. A config with one metric renamed makes the extractor
// fail on that metric.
func TestEndpointPickerReadsConveyor(t *testing.T) {
	m := loadBase(t)
	cfg, conveyor, _ := eppConfig(t, m)
	picker, err := newPickerScraper(cfg)
	if err != nil {
		t.Fatal(err)
	}

	const maxNumSeqs, requests = 2, 8
	srv := startServer(t)
	ecfg := engine.DefaultConfig()
	ecfg.BlockSizeTokens = 16
	ecfg.KVCacheBytes = 8 << 20
	ecfg.MaxNumSeqs = maxNumSeqs
	eng := srv.loadTiny(t, ecfg)

	// The endpoint the picker would make of a Conveyor pod: its labels (which choose the
	// engine config) and where its metrics are served.
	pod := find[appsv1.Deployment](t, m, conveyorName).Spec.Template
	ep := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{
		NamespacedName: types.NamespacedName{Namespace: readKustomization(t, baseDir).Namespace, Name: conveyorName + "-0"},
		MetricsHost:    strings.TrimPrefix(srv.base, "http://"),
		Labels:         pod.Labels,
	}, nil)
	ctx := context.Background()

	// idle checks that the picker reads an idle server: nothing queued or running, no KV
	// block in use, and the cache layout. Right after a load, the engine may publish its
	// idle state a moment after the last response ends, so it is polled for a while.
	idle := func(when string) {
		t.Helper()
		var got *fwkdl.Metrics
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			got, err = picker.scrape(ctx, ep)
			if err == nil && got.WaitingQueueSize == 0 && got.RunningRequestsSize == 0 && got.KVCacheUsagePercent == 0 {
				break
			}
		}
		if err != nil {
			t.Fatalf("%s: the picker cannot read Conveyor's metrics: %v", when, err)
		}
		if got.WaitingQueueSize != 0 || got.RunningRequestsSize != 0 || got.KVCacheUsagePercent != 0 {
			t.Errorf("%s: the picker reads %d queued, %d running, KV usage %v; want zeros", when, got.WaitingQueueSize, got.RunningRequestsSize, got.KVCacheUsagePercent)
		}
		if got.CacheBlockSize != ecfg.BlockSizeTokens || got.CacheNumBlocks != eng.NumKVBlocks() {
			t.Errorf("%s: the picker reads KV blocks of %d tokens, %d of them; the engine has %d of %d tokens", when, got.CacheBlockSize, got.CacheNumBlocks, eng.NumKVBlocks(), ecfg.BlockSizeTokens)
		}
	}
	idle("before any request")

	// Load: more requests than the engine runs at once, each long enough to be seen.
	maxTokens := eng.MaxModelLen() - 32 // the prompt takes a few
	errs := make(chan error, requests)
	var wg sync.WaitGroup
	for range requests {
		wg.Go(func() { errs <- streamCompletion(srv.base, maxTokens) })
	}
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	var loaded *fwkdl.Metrics
	for loaded == nil {
		select {
		case <-finished:
			t.Fatalf("all %d requests finished before the picker saw requests queued, running and KV blocks in use at once", requests)
		default:
		}
		got, err := picker.scrape(ctx, ep)
		if err != nil {
			t.Fatalf("under load: the picker cannot read Conveyor's metrics: %v", err)
		}
		if got.RunningRequestsSize > maxNumSeqs {
			t.Fatalf("under load: the picker reads %d running requests; the engine runs %d at most", got.RunningRequestsSize, maxNumSeqs)
		}
		if got.WaitingQueueSize > 0 && got.RunningRequestsSize > 0 && got.KVCacheUsagePercent > 0 {
			loaded = got
		}
	}
	if loaded.KVCacheUsagePercent > 1 {
		t.Errorf("under load: the picker reads KV usage %v; its kv-cache-utilization-scorer wants a 0..1 fraction", loaded.KVCacheUsagePercent)
	}
	<-finished
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	idle("after the load")

	// A config whose engine config names a metric Conveyor does not serve: the picker's
	// extractor reports that metric missing.
	for _, spec := range []string{conveyor.QueuedRequestsSpec, conveyor.RunningRequestsSpec, conveyor.KVUsageSpec} {
		renamed := spec + "_renamed"
		broken, _, _ := eppConfig(t, withPickerConfig(m, func(text string) string { return strings.ReplaceAll(text, spec, renamed) }))
		p, err := newPickerScraper(broken)
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.scrape(ctx, fwkdl.NewEndpoint(ep.GetMetadata(), nil))
		if want := fmt.Sprintf("metric family %q not found", renamed); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("with %s renamed %s, the picker's extractor returns %v; want an error containing %q", spec, renamed, err, want)
		}
	}
}
