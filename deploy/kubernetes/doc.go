// Package kubernetes holds Conveyor's Kubernetes manifests and the tests that keep them
// honest; it has no Go API. The manifests (kustomization.yaml lists them) run `conveyor
// serve` behind the Kubernetes Gateway API Inference Extension v1.5.0: a Deployment of
// model servers, an InferencePool over them, the extension's endpoint picker (EPP) with
// its RBAC and configuration, and an HTTPRoute from a Gateway to the pool.
// deploy/overlays/ holds kustomize overlays that mount a built model from a
// PersistentVolumeClaim or an OCI image instead of building it in an initContainer;
// docs/deploy.md walks through a deployment.
//
// The tests run offline, without a cluster:
//
//   - every YAML document here and in the overlays decodes strictly (unknown or
//     duplicate fields fail, field names match case-sensitively, as the API server
//     decodes) into its upstream Go type: k8s.io/api, sigs.k8s.io/gateway-api, the
//     extension's InferencePool and EndpointPickerConfig; a document of a kind the
//     tests do not know fails them, and so does a manifest kustomization.yaml does not
//     list. The base and each overlay are rendered with kustomize's Go API (the library
//     `kubectl apply -k` embeds) and what would be applied is decoded the same way; in
//     it, every port a Service or a probe gives by name is a port of the containers it
//     reaches.
//   - the objects refer to each other correctly: the pool selects the Conveyor pods on
//     the port they listen on, the pool's endpointPickerRef reaches the picker's
//     ext_proc port, the route reaches the pool from the Gateway, RBAC subjects and
//     roles exist.
//   - the Conveyor container's environment names real `conveyor serve` flags (read from
//     cmd/conveyor/serve.go), its probes use the port the server is given, the grace
//     period outlasts the preStop sleep plus the drain, threads match the CPU limit, and
//     every container runs non-root with a read-only root and no capabilities.
//   - the metric names the picker is configured with exist, as gauges, in /metrics of a
//     real server (the real engine on the tiny test model), and the probe paths answer
//     as the probes need: /health 503 while loading and draining and 200 when serving,
//     the liveness path 200 while loading.
//   - the picker's own metrics code (v1.5.0's metrics-data-source and
//     core-metrics-extractor plugins, made from the deploy's EndpointPickerConfig) reads
//     a real server's queue depth, running requests, KV-cache usage and KV block layout,
//     and sees them rise under load and fall back to zero after it.
//   - the Kubernetes objects docs/deploy.md shows decode the same way, and the metrics
//     its autoscaler example scales on are gauges of the real server.
//   - deploy/Dockerfile fetches the ONNX Runtime version and sha256 the Makefile pins and
//     builds with go.mod's Go version.
//
// Run them with the ONNX Runtime library the Makefile fetches:
//
//	CONVEYOR_ORT_LIB=$PWD/.ort/libonnxruntime.so.1 go test ./deploy/...
package kubernetes
