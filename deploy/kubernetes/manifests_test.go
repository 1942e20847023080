package kubernetes

import (
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/conveyor-llm/conveyor/api"
)

// The names the manifests give their objects.
const (
	poolName      = "conveyor"
	conveyorName  = "conveyor"
	eppName       = "conveyor-epp"
	eppConfigKey  = "conveyor-plugins.yaml"
	inferenceMod  = "sigs.k8s.io/gateway-api-inference-extension"
	eppImageRepo  = "registry.k8s.io/gateway-api-inference-extension/epp"
	inferenceGrp  = "inference.networking.k8s.io"
	extractorType = "core-metrics-extractor"
)

// engineStopSeconds is how long `conveyor serve` gives the engine to stop after the drain
// (the 5 s context in serve() of cmd/conveyor/serve.go).
const engineStopSeconds = 5

// selects reports whether selector (matchLabels) selects a pod with labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// containerPort resolves a probe's or Service's port (a number or a port name) in c.
func containerPort(t *testing.T, c *corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, p.StrVal)
	return 0
}

// TestManifestsReferToEachOther follows every reference between the objects: route to
// gateway and pool, pool to pods and picker, Services to pods, RBAC to the picker.
func TestManifestsReferToEachOther(t *testing.T) {
	m := loadBase(t)
	k := readKustomization(t, baseDir)
	pool := find[inferencev1.InferencePool](t, m, poolName)
	dep := find[appsv1.Deployment](t, m, conveyorName)
	pod := &dep.Spec.Template
	server := container(t, &pod.Spec, "conveyor")
	port := resolveServe(t, server).int(t, "port")

	if !selects(dep.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("Deployment %s does not select its own pods", dep.Name)
	}
	sel := map[string]string{}
	for k, v := range pool.Spec.Selector.MatchLabels {
		sel[string(k)] = string(v)
	}
	if !selects(sel, pod.Labels) {
		t.Errorf("InferencePool %s selects %v; the Conveyor pods are labelled %v", pool.Name, sel, pod.Labels)
	}
	if len(pool.Spec.TargetPorts) != 1 || int(pool.Spec.TargetPorts[0].Number) != port {
		t.Errorf("InferencePool targetPorts %v, want [%d] (the port conveyor serve is given)", pool.Spec.TargetPorts, port)
	}
	if got := containerPort(t, server, intstr.FromString("http")); int(got) != port {
		t.Errorf("container port http is %d, conveyor serve listens on %d", got, port)
	}

	// The pool's endpoint picker: a Service port that reaches the picker's ext_proc port.
	ref := pool.Spec.EndpointPickerRef
	if (ref.Kind != "" && ref.Kind != "Service") || (ref.Group != nil && *ref.Group != "") || ref.Port == nil {
		t.Fatalf("endpointPickerRef %+v: want a core Service with a port", ref)
	}
	eppSvc := find[corev1.Service](t, m, string(ref.Name))
	eppDep := find[appsv1.Deployment](t, m, eppName)
	epp := container(t, &eppDep.Spec.Template.Spec, "epp")
	args := eppArgs(t, epp)
	grpcPort := int32(9002) // the picker's --grpc-port default
	if v, ok := args["grpc-port"]; ok {
		n, _ := strconv.Atoi(v)
		grpcPort = int32(n)
	}
	var reached bool
	for _, sp := range eppSvc.Spec.Ports {
		if sp.Port == int32(ref.Port.Number) {
			tp := sp.TargetPort
			if tp.Type == intstr.Int && tp.IntVal == 0 {
				tp = intstr.FromInt32(sp.Port)
			}
			reached = containerPort(t, epp, tp) == grpcPort
		}
	}
	if !reached {
		t.Errorf("endpointPickerRef %s:%d does not reach the picker's ext_proc port %d", ref.Name, ref.Port.Number, grpcPort)
	}
	if !selects(eppSvc.Spec.Selector, eppDep.Spec.Template.Labels) {
		t.Errorf("Service %s does not select the picker's pods", eppSvc.Name)
	}
	if args["pool-name"] != pool.Name {
		t.Errorf("picker --pool-name=%s, the pool is %s", args["pool-name"], pool.Name)
	}
	if g, ok := args["pool-group"]; ok && g != inferenceGrp {
		t.Errorf("picker --pool-group=%s, want %s (InferencePool v1)", g, inferenceGrp)
	}

	// The plain Service and the disruption budget cover the Conveyor pods.
	svc := find[corev1.Service](t, m, conveyorName)
	if !selects(svc.Spec.Selector, pod.Labels) {
		t.Errorf("Service %s does not select the Conveyor pods", svc.Name)
	}
	for _, sp := range svc.Spec.Ports {
		if got := containerPort(t, server, sp.TargetPort); int(got) != port {
			t.Errorf("Service %s port %d targets %d, conveyor serve listens on %d", svc.Name, sp.Port, got, port)
		}
	}
	pdb := find[policyv1.PodDisruptionBudget](t, m, conveyorName)
	if !selects(pdb.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("PodDisruptionBudget %s does not select the Conveyor pods", pdb.Name)
	}

	// The route goes from a Gateway here to the pool.
	for _, route := range all[gatewayv1.HTTPRoute](m) {
		for _, p := range route.Spec.ParentRefs {
			if (p.Kind != nil && *p.Kind != "Gateway") || p.Namespace != nil {
				t.Errorf("HTTPRoute %s: parentRef %+v: want a Gateway in its namespace", route.Name, p)
				continue
			}
			gw := find[gatewayv1.Gateway](t, m, string(p.Name))
			if len(gw.Spec.Listeners) == 0 {
				t.Errorf("Gateway %s has no listener", gw.Name)
			}
		}
		if len(route.Spec.Rules) == 0 {
			t.Errorf("HTTPRoute %s has no rule", route.Name)
		}
		for _, rule := range route.Spec.Rules {
			for _, b := range rule.BackendRefs {
				if b.Group == nil || string(*b.Group) != inferenceGrp || b.Kind == nil || *b.Kind != "InferencePool" || string(b.Name) != pool.Name {
					t.Errorf("HTTPRoute %s: backendRef %s is not InferencePool %s", route.Name, b.Name, pool.Name)
				}
			}
		}
	}

	// RBAC: what the picker's service account is granted.
	sa := eppDep.Spec.Template.Spec.ServiceAccountName
	find[corev1.ServiceAccount](t, m, sa)
	var rules []rbacv1.PolicyRule
	bound := func(subjects []rbacv1.Subject) bool {
		for _, s := range subjects {
			if s.Kind == "ServiceAccount" && s.Name == sa {
				// Empty: kustomize fills in its namespace (a written one it would keep).
				if s.Namespace != "" && s.Namespace != k.Namespace {
					t.Errorf("subject %s is in namespace %q, the manifests in %q", s.Name, s.Namespace, k.Namespace)
				}
				return true
			}
		}
		return false
	}
	for _, rb := range all[rbacv1.RoleBinding](m) {
		if bound(rb.Subjects) {
			if rb.RoleRef.Kind != "Role" {
				t.Errorf("RoleBinding %s binds a %s", rb.Name, rb.RoleRef.Kind)
				continue
			}
			rules = append(rules, find[rbacv1.Role](t, m, rb.RoleRef.Name).Rules...)
		}
	}
	for _, crb := range all[rbacv1.ClusterRoleBinding](m) {
		if bound(crb.Subjects) {
			rules = append(rules, find[rbacv1.ClusterRole](t, m, crb.RoleRef.Name).Rules...)
		}
	}
	for _, need := range []struct {
		group, resource string
		verbs           []string
	}{
		{"", "pods", []string{"get", "list", "watch"}},
		{inferenceGrp, "inferencepools", []string{"get", "list", "watch"}},
		{"inference.networking.x-k8s.io", "inferenceobjectives", []string{"get", "list", "watch"}},
		{"inference.networking.x-k8s.io", "inferencemodelrewrites", []string{"get", "list", "watch"}},
		{"authentication.k8s.io", "tokenreviews", []string{"create"}},
		{"authorization.k8s.io", "subjectaccessreviews", []string{"create"}},
	} {
		for _, verb := range need.verbs {
			if !granted(rules, need.group, need.resource, verb) {
				t.Errorf("the picker's service account %s may not %s %s.%s", sa, verb, need.resource, need.group)
			}
		}
	}
}

// granted reports whether rules allow verb on resource of group.
func granted(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

// TestConveyorContainerMatchesServe checks the Conveyor container against `conveyor serve`:
// its environment names serve's flags with values of their types, it listens where its
// probes and port point, and its grace period, threads and memory fit its settings.
func TestConveyorContainerMatchesServe(t *testing.T) {
	m := loadBase(t)
	dep := find[appsv1.Deployment](t, m, conveyorName)
	spec := &dep.Spec.Template.Spec
	c := container(t, spec, "conveyor")
	s := resolveServe(t, c)

	// Probes come from the kubelet, and traffic from the gateway, to the pod IP.
	if h := s.values["host"]; h != "0.0.0.0" && h != "::" && h != "" {
		t.Errorf("conveyor serve listens on %q; probes and the gateway reach the pod IP, so it must be 0.0.0.0", h)
	}
	port := s.int(t, "port")
	probes := map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe}
	for what, p := range probes {
		if p == nil || p.HTTPGet == nil {
			t.Fatalf("%s probe: want an httpGet probe", what)
		}
		if got := containerPort(t, c, p.HTTPGet.Port); int(got) != port {
			t.Errorf("%s probe port %d, conveyor serve listens on %d", what, got, port)
		}
	}
	for _, what := range []string{"startup", "readiness"} {
		if p := probes[what].HTTPGet.Path; p != "/health" {
			t.Errorf("%s probe path %s, want /health (503 while loading and draining)", what, p)
		}
	}
	// A model load may take minutes; the startup probe holds liveness off meanwhile.
	if budget := time.Duration(c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold) * time.Second; budget < 5*time.Minute {
		t.Errorf("the startup probe allows a load %v; a large model needs minutes", budget)
	}
	// After SIGTERM, readiness must fail fast so the picker stops choosing the pod.
	if r := c.ReadinessProbe; time.Duration(r.PeriodSeconds*r.FailureThreshold)*time.Second > 5*time.Second {
		t.Errorf("readiness takes %ds of failures to turn a draining pod unready", r.PeriodSeconds*r.FailureThreshold)
	}

	// Stopping: preStop sleep, then the drain, the abort grace and the engine's stop must
	// end before the kubelet's SIGKILL.
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Fatal("want a preStop sleep action (the image has no shell)")
	}
	if spec.TerminationGracePeriodSeconds == nil {
		t.Fatal("terminationGracePeriodSeconds is unset (the default 30 s is shorter than the drain)")
	}
	pre := c.Lifecycle.PreStop
	drain, err := time.ParseDuration(s.values["shutdown-timeout"])
	if err != nil {
		t.Fatal(err)
	}
	// The lame-duck period must outlast the readiness probe's failures, so the picker
	// drops the pod before its listener closes.
	delay, err := time.ParseDuration(s.values["shutdown-delay"])
	if err != nil {
		t.Fatalf("--shutdown-delay: %v", err)
	}
	if r := c.ReadinessProbe; delay <= time.Duration(r.PeriodSeconds*r.FailureThreshold)*time.Second {
		t.Errorf("--shutdown-delay %v ends before the readiness probe fails (%d x %ds)", delay, r.FailureThreshold, r.PeriodSeconds)
	}
	need := time.Duration(pre.Sleep.Seconds)*time.Second + delay + drain + api.DefaultConfig().AbortGrace + engineStopSeconds*time.Second
	if grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second; grace <= need {
		t.Errorf("terminationGracePeriodSeconds %v; preStop %ds + --shutdown-delay %v + --shutdown-timeout %v + abort grace + engine stop need more than %v",
			grace, pre.Sleep.Seconds, delay, drain, need)
	}

	// Threads: ONNX Runtime's "all cores" would count the node's cores.
	cpu := c.Resources.Limits.Cpu()
	if cpu.IsZero() || cpu.MilliValue()%1000 != 0 || !cpu.Equal(*c.Resources.Requests.Cpu()) {
		t.Errorf("CPU request %v, limit %v: want whole cores, request = limit", c.Resources.Requests.Cpu(), cpu)
	}
	if threads := s.int(t, "threads"); int64(threads) != cpu.Value() {
		t.Errorf("--threads %d, CPU limit %v: keep them equal", threads, cpu)
	}

	// Memory: at least the KV budget plus the headroom measured for the rest (weights,
	// activations, runtime: 237 MiB measured for the default model).
	kv, err := parseSize(s.values["kv-cache-memory"])
	if err != nil {
		t.Fatal(err)
	}
	req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
	if req.Value() < kv+256<<20 {
		t.Errorf("memory request %v < --kv-cache-memory %s + 256Mi", req, s.values["kv-cache-memory"])
	}
	if lim.Cmp(*req) < 0 {
		t.Errorf("memory limit %v < request %v", lim, req)
	}

	// The model directory is mounted; in the base an initContainer writes it there.
	model := s.values["model"]
	mv := mountFor(t, c, model)
	if mv == nil {
		t.Fatalf("--model %s is on no mounted volume", model)
	}
	if len(spec.InitContainers) > 0 {
		ic := container(t, spec, "build-model")
		out := flagValue(ic.Args, "--out")
		if out != model {
			t.Errorf("build-model --out %s, serve --model %s", out, model)
		}
		if iv := mountFor(t, ic, out); iv == nil || iv.Name != mv.Name || iv.ReadOnly {
			t.Errorf("build-model writes %s, which is not the server's %q volume mounted writable", out, mv.Name)
		}
	}
}

// flagValue returns the value after flag in args ("" if absent).
func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// mountFor returns the volume mount of c under which file lies, or nil.
func mountFor(t *testing.T, c *corev1.Container, file string) *corev1.VolumeMount {
	t.Helper()
	var best *corev1.VolumeMount
	for i := range c.VolumeMounts {
		vm := &c.VolumeMounts[i]
		mp := path.Clean(vm.MountPath)
		if (file == mp || strings.HasPrefix(file, mp+"/")) && (best == nil || len(mp) > len(best.MountPath)) {
			best = vm
		}
	}
	return best
}

// TestPodsAreLockedDown requires every pod (the base's and the overlays') to run as a
// non-root user with the runtime's seccomp profile, and every container to have a
// read-only root filesystem, no privilege escalation and no capabilities, with its
// writable paths (/tmp, the build cache, a build's output) on volumes.
func TestPodsAreLockedDown(t *testing.T) {
	objs := []object(loadBase(t))
	for _, dir := range kustomizationDirs(t)[1:] {
		for _, f := range yamlFiles(t, dir) {
			o, err := decodeFile(dir + "/" + f)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range o {
				if x.key == "batch/v1 Job" {
					objs = append(objs, x)
				}
			}
		}
	}
	specs := podSpecs(objs)
	if len(specs) < 3 {
		t.Fatalf("found %d pod templates, want the server's, the picker's and the overlay's Job", len(specs))
	}
	for _, spec := range specs {
		psc := spec.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
			psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("pod with %s: want runAsNonRoot, a non-zero runAsUser and seccomp RuntimeDefault", spec.Containers[0].Name)
		}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			sc := c.SecurityContext
			switch {
			case sc == nil:
				t.Errorf("container %s: no securityContext", c.Name)
				continue
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("container %s: root filesystem is writable", c.Name)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("container %s: privilege escalation allowed", c.Name)
			case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
				t.Errorf("container %s: capabilities %+v, want drop [ALL] and nothing added", c.Name, sc.Capabilities)
			case sc.Privileged != nil && *sc.Privileged:
				t.Errorf("container %s: privileged", c.Name)
			}
			writable := []string{"/tmp"}
			for _, e := range c.Env {
				if e.Name == "CONVEYOR_CACHE_DIR" {
					writable = append(writable, e.Value)
				}
			}
			if out := flagValue(c.Args, "--out"); out != "" {
				writable = append(writable, out)
			}
			for _, w := range writable {
				vm := mountFor(t, &c, w)
				if vm == nil || vm.ReadOnly {
					t.Errorf("container %s writes %s, which is on no writable volume", c.Name, w)
				}
			}
		}
	}
	// The model servers need no Kubernetes API token.
	spec := &find[appsv1.Deployment](t, objs, conveyorName).Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the Conveyor pods mount a service account token they do not use")
	}
}
