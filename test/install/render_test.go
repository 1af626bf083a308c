// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package install

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/poolpicker/poolpicker/extproc"
	"github.com/poolpicker/poolpicker/internal/deploytest"
	"github.com/poolpicker/poolpicker/internal/permissions"
)

// kustomizations are the directories of config/deploy, with the kinds each
// must render beyond the base's.
var kustomizations = []struct {
	dir   string
	extra []string
}{
	{"config/deploy/base", nil},
	{"config/deploy/overlays/servicemonitor", []string{"ServiceMonitor"}},
	{"config/deploy/overlays/networkpolicy", []string{"NetworkPolicy"}},
	{"config/deploy/overlays/peer-sync-key", nil},
}

// baseKinds: the picker's ClusterRole and binding, the token reviews'
// ClusterRole and binding, the metrics-reader ClusterRole, and the rest.
var baseKinds = []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "Deployment", "Namespace", "PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}

// chartVariants are values the chart is linted, rendered and dry-run with.
var chartVariants = []struct {
	name   string
	values string
	// kinds rendered (sorted, with repeats).
	kinds []string
}{
	{name: "defaults", kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}},
	{name: "everything", values: `
image: {repository: registry.example/poolpicker, tag: v9.9.9, pullPolicy: Always}
imagePullSecrets: [regcred]
replicas: 3
watchNamespaces: [install-team-a, install-team-b]
poolSelector: "shard=a"
eppServiceNames: [epp]
tls:
  enabled: true
  secretName: poolpicker-tls
  reload: true
  minVersion: VersionTLS12
  cipherSuites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
  clientCA: {configMapName: gateway-ca, key: root-cert.pem}
metrics: {serviceMonitor: {enabled: true, interval: 30s, labels: {release: prom}}, pprof: {enabled: true}}
networkPolicy: {enabled: true}
peerSync: {port: 9010, hashKey: {secretName: shard-a-peer-key, key: hash-key}}
pickerName: shard-a
drainGracePeriod: 3s
drainTimeout: 20s
terminationGracePeriodSeconds: 40
podDisruptionBudget: {enabled: true, minAvailable: 2}
serviceAccount: {create: true, name: picker, annotations: {team: platform}}
crds: {install: true}
logVerbosity: 2
extraArgs: ["--scheduler-max-endpoints=2"]
podAnnotations: {prometheus.io/scrape: "false"}
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]
`, kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "CustomResourceDefinition", "CustomResourceDefinition", "CustomResourceDefinition", "CustomResourceDefinition", "CustomResourceDefinition", "Deployment", "NetworkPolicy",
		"PodDisruptionBudget", "Role", "RoleBinding", "RoleBinding", "RoleBinding", "Secret", "Service", "ServiceAccount", "ServiceAccount", "ServiceMonitor", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}},
	{name: "single pool, plaintext, no PDB", values: `
poolName: chat
poolNamespace: install-team-a
tls: {enabled: false}
podDisruptionBudget: {enabled: false}
`, kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "RoleBinding", "Secret", "Service", "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}},
	{name: "leader election, provisioning and peer sync off", values: `
leaderElection: {enabled: false}
provisionPickerServices: {enabled: false}
peerSync: {enabled: false}
`, kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"}},
	{name: "peer sync only, one replica", values: `
replicas: 1
leaderElection: {enabled: false}
provisionPickerServices: {enabled: false}
networkPolicy: {enabled: true}
`, kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount"}},
	{name: "metrics endpoint auth off", values: `
metrics: {serviceMonitor: {enabled: true}, endpointAuth: {enabled: false}}
`, kinds: []string{"ClusterRole", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount", "ServiceMonitor", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}},
	{name: "metrics endpoint auth with a reader", values: `
metrics:
  serviceMonitor: {enabled: true}
  endpointAuth: {readers: [{name: prometheus-k8s, namespace: monitoring}]}
`, kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "ClusterRoleBinding", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Secret", "Service", "ServiceAccount", "ServiceAccount", "ServiceMonitor", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}},
	{name: "monitoring, scheduler config, tracing, JSON logs", values: `
metrics: {serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}, dashboards: {enabled: true}}
scheduler: {config: "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"}
tracing: {enabled: true, otlpEndpoint: "http://otel-collector.monitoring:4317"}
logFormat: json
logVerbosity: 0
podAntiAffinity: soft
env: [{name: GOMEMLIMIT, value: 1200MiB}]
extraVolumes: [{name: scratch, emptyDir: {}}]
extraVolumeMounts: [{name: scratch, mountPath: /scratch}]
`, kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "ClusterRoleBinding", "ConfigMap", "ConfigMap", "ConfigMap", "Deployment", "PodDisruptionBudget", "PrometheusRule", "Role", "RoleBinding", "Secret", "Secret", "Service", "ServiceAccount", "ServiceAccount", "ServiceMonitor", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}},
	{name: "leader election only", values: `
provisionPickerServices: {enabled: false}
peerSync: {enabled: false}
`, kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount"}},
	{name: "client CA from a Secret", values: `
tls: {clientCA: {secretName: gateway-ca}, minVersion: VersionTLS13}
`, kinds: []string{"ClusterRole", "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}},
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func kinds(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind())
	}
	sort.Strings(out)
	return out
}

func TestKustomizationsRender(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	for _, k := range kustomizations {
		t.Run(k.dir, func(t *testing.T) {
			objs, err := tool.Kustomize(ctx, k.dir)
			if err != nil {
				t.Fatal(err)
			}
			want := append(append([]string(nil), baseKinds...), k.extra...)
			sort.Strings(want)
			if got := kinds(objs); !slices.Equal(got, want) {
				t.Fatalf("kinds %v, want %v", got, want)
			}
			for _, o := range objs {
				if o.GetKind() != "Namespace" && o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" && o.GetNamespace() != "poolpicker-system" {
					t.Errorf("%s %s is in namespace %q, want poolpicker-system", o.GetKind(), o.GetName(), o.GetNamespace())
				}
			}
			deploy := deploytest.Find(objs, "Deployment", "poolpicker")
			checkDeployment(t, deploy)
			checkNoConformanceBehaviors(t, deploy)
			checkRBAC(t, objs, deploy)
			checkMetricsAuth(t, objs, deploy)
			checkPeerSync(t, objs, deploy)
			if deploytest.Find(objs, "NetworkPolicy", "poolpicker") != nil {
				checkNetworkPolicy(t, objs)
			}
		})
	}
}

func TestChartLintsAndRenders(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	for _, v := range chartVariants {
		t.Run(v.name, func(t *testing.T) {
			if out, err := tool.LintChart(ctx, deploytest.ChartOptions{Values: v.values}); err != nil {
				t.Fatalf("lint: %v\n%s", err, out)
			}
			objs, err := tool.Chart(ctx, deploytest.ChartOptions{Values: v.values})
			if err != nil {
				t.Fatal(err)
			}
			if got := kinds(objs); !slices.Equal(got, v.kinds) {
				t.Fatalf("kinds %v, want %v", got, v.kinds)
			}
			var deploy *unstructured.Unstructured
			for _, o := range objs {
				if o.GetKind() == "Deployment" {
					deploy = o
				}
			}
			checkDeployment(t, deploy)
			checkNoConformanceBehaviors(t, deploy)
			checkRBAC(t, objs, deploy)
			checkMetricsAuth(t, objs, deploy)
			checkPeerSync(t, objs, deploy)
			for _, o := range objs {
				if o.GetKind() == "NetworkPolicy" {
					checkNetworkPolicy(t, objs)
				}
			}
		})
	}
}

// checkNoConformanceBehaviors: outside the conformance overlay and values,
// no install lets a client choose its endpoint.
func checkNoConformanceBehaviors(t *testing.T, deploy *unstructured.Unstructured) {
	t.Helper()
	for _, a := range containerArgs(deploy) {
		if strings.HasPrefix(a, "--enable-conformance-test-behaviors") && a != "--enable-conformance-test-behaviors=false" {
			t.Errorf("args turn the conformance-test behaviours on (%s): only config/deploy/overlays/conformance and values-conformance.yaml may", a)
		}
	}
}

// TestChartMatchesKustomize: with default values the chart renders the
// base's objects with the same names, RBAC rules, Deployment spec (image
// and labels aside), Service ports and PodDisruptionBudget; the peer-sync
// key is mounted alike from a Secret of the same name, which the chart
// creates with a random key and a kustomize user creates first (kustomize
// cannot make a random one); overlays/peer-sync-key is the base.
func TestChartMatchesKustomize(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	base, err := tool.Kustomize(ctx, "config/deploy/base")
	if err != nil {
		t.Fatal(err)
	}
	keyed, err := tool.Kustomize(ctx, "config/deploy/overlays/peer-sync-key")
	if err != nil {
		t.Fatal(err)
	}
	chart, err := tool.Chart(ctx, deploytest.ChartOptions{Values: "image: {tag: v0.1.0}\n"})
	if err != nil {
		t.Fatal(err)
	}
	chartKey := withoutPeerSyncKey(t, deploytest.Find(chart, "Deployment", "poolpicker"))
	if chartKey.arg == "" {
		t.Fatal("the chart's default Deployment has no --peer-sync-key-file")
	}
	if baseKey := withoutPeerSyncKey(t, deploytest.Find(base, "Deployment", "poolpicker")); fmt.Sprint(baseKey) != fmt.Sprint(chartKey) {
		t.Errorf("the kustomize base wires the key as\n%+v\nthe chart as\n%+v (peer sync runs only with a shared key)", baseKey, chartKey)
	}
	if overlayKey := withoutPeerSyncKey(t, deploytest.Find(keyed, "Deployment", "poolpicker")); fmt.Sprint(overlayKey) != fmt.Sprint(chartKey) {
		t.Errorf("overlays/peer-sync-key wires the key as\n%+v\nthe chart as\n%+v", overlayKey, chartKey)
	}
	for _, kustomize := range []struct {
		name string
		objs []*unstructured.Unstructured
	}{{"base", base}, {"overlays/peer-sync-key", keyed}} {
		for _, b := range kustomize.objs {
			if b.GetKind() == "Namespace" {
				continue // helm install --create-namespace makes it
			}
			c := deploytest.Find(chart, b.GetKind(), b.GetName())
			if c == nil {
				t.Errorf("chart renders no %s %s", b.GetKind(), b.GetName())
				continue
			}
			// kustomize does not know the admission policy's kinds to be
			// cluster-scoped and gives them its namespace, which the API
			// server drops.
			clusterScoped := strings.HasPrefix(b.GetKind(), "ValidatingAdmissionPolicy")
			if c.GetNamespace() != b.GetNamespace() && !clusterScoped {
				t.Errorf("%s %s: namespace %q in the chart, %q in kustomize %s", b.GetKind(), b.GetName(), c.GetNamespace(), b.GetNamespace(), kustomize.name)
			}
			for _, field := range [][]string{{"rules"}, {"roleRef"}, {"subjects"}, {"spec", "ports"}, {"spec", "minAvailable"},
				{"spec", "replicas"}, {"spec", "template", "spec", "containers"}, {"spec", "template", "spec", "securityContext"},
				{"spec", "template", "spec", "terminationGracePeriodSeconds"}, {"spec", "template", "spec", "serviceAccountName"},
				{"spec", "matchConstraints"}, {"spec", "matchConditions"}, {"spec", "validations"}, {"spec", "validationActions"}} {
				bv, bok, _ := unstructured.NestedFieldNoCopy(b.Object, field...)
				cv, cok, _ := unstructured.NestedFieldNoCopy(c.Object, field...)
				if bok != cok || fmt.Sprint(bv) != fmt.Sprint(cv) {
					t.Errorf("%s %s .%s differs:\nkustomize %s: %v\nchart:     %v", b.GetKind(), b.GetName(), strings.Join(field, "."), kustomize.name, bv, cv)
				}
			}
		}
	}
}

// checkRBAC: the ClusterRole grants exactly the PoolNamespaces rules of
// permissions.Rules that the Deployment's flags need, and the Role (present
// only when a feature needs it) exactly the OwnNamespace ones: what
// poolpicker's start-up check asks for with those flags.
func checkRBAC(t *testing.T, objs []*unstructured.Unstructured, deploy *unstructured.Unstructured) {
	t.Helper()
	args := containerArgs(deploy)
	needed := permissions.Needed(permissions.Rules, func(feature string) bool { return slices.Contains(args, "--"+feature) })
	want := map[string]map[string]bool{"ClusterRole": {}, "Role": {}}
	for _, r := range needed {
		kind := "ClusterRole"
		if r.Scope == permissions.OwnNamespace {
			kind = "Role"
		}
		for _, v := range r.Verbs {
			want[kind][r.Group+"|"+r.Resource+"|"+v] = true
		}
	}
	authWant := map[string]bool{}
	for _, r := range permissions.MetricsAuthRules {
		for _, v := range r.Verbs {
			authWant[r.Group+"|"+r.Resource+"|"+v] = true
		}
	}
	seen := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
			continue
		}
		wanted := want[o.GetKind()]
		switch name := o.GetName(); {
		case strings.HasSuffix(name, "-metrics-reader"):
			continue // a scraper's role, checked by checkMetricsAuth
		case strings.HasSuffix(name, "-metrics-auth"):
			wanted = authWant
		default:
			seen[o.GetKind()] = true
		}
		got := map[string]bool{}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			m := r.(map[string]any)
			groups, _, _ := unstructured.NestedStringSlice(m, "apiGroups")
			resources, _, _ := unstructured.NestedStringSlice(m, "resources")
			verbs, _, _ := unstructured.NestedStringSlice(m, "verbs")
			for _, g := range groups {
				for _, res := range resources {
					for _, v := range verbs {
						if g == "*" || res == "*" || v == "*" {
							t.Errorf("%s %s grants a wildcard: %v", o.GetKind(), o.GetName(), m)
						}
						got[g+"|"+res+"|"+v] = true
					}
				}
			}
		}
		for k := range wanted {
			if !got[k] {
				t.Errorf("%s %s lacks %s, which poolpicker needs with args %v", o.GetKind(), o.GetName(), k, args)
			}
		}
		for k := range got {
			if !wanted[k] {
				t.Errorf("%s %s grants %s, which poolpicker does not need with args %v (internal/permissions.Rules lists each rule with its scope and feature)", o.GetKind(), o.GetName(), k, args)
			}
		}
	}
	if len(want["Role"]) > 0 && !seen["Role"] {
		t.Errorf("no Role rendered, but args %v need %v in the deployment's namespace", args, want["Role"])
	}
}

// metricsAuthOn tells whether args leave --metrics-endpoint-auth on (its
// default); the last occurrence wins, as in flag parsing.
func metricsAuthOn(args []string) bool {
	on := true
	for _, a := range args {
		switch a {
		case "--metrics-endpoint-auth", "--metrics-endpoint-auth=true":
			on = true
		case "--metrics-endpoint-auth=false":
			on = false
		}
	}
	return on
}

// checkMetricsAuth: with --metrics-endpoint-auth on, the token reviews'
// ClusterRole is bound to the Deployment's service account, a
// metrics-reader ClusterRole grants get on /metrics, and every
// ServiceMonitor sends a bearer token (the chart's through authorization,
// the kustomize overlay's from Prometheus' own account); with it off, none
// of these.
func checkMetricsAuth(t *testing.T, objs []*unstructured.Unstructured, deploy *unstructured.Unstructured) {
	t.Helper()
	on := metricsAuthOn(containerArgs(deploy))
	sa, _, _ := unstructured.NestedString(deploy.Object, "spec", "template", "spec", "serviceAccountName")
	var authRole, reader, bound bool
	for _, o := range objs {
		switch {
		case o.GetKind() == "ClusterRole" && strings.HasSuffix(o.GetName(), "-metrics-auth"):
			authRole = true
		case o.GetKind() == "ClusterRole" && strings.HasSuffix(o.GetName(), "-metrics-reader"):
			reader = true
			if got := fmt.Sprint(o.Object["rules"]); got != "[map[nonResourceURLs:[/metrics] verbs:[get]]]" {
				t.Errorf("ClusterRole %s rules %s, want get on /metrics only", o.GetName(), got)
			}
		case o.GetKind() == "ClusterRoleBinding" && strings.HasSuffix(o.GetName(), "-metrics-auth"):
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				if s.(map[string]any)["name"] == sa && s.(map[string]any)["namespace"] == deploy.GetNamespace() {
					bound = true
				}
			}
		case o.GetKind() == "ServiceMonitor":
			endpoints, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
			for _, e := range endpoints {
				_, file := e.(map[string]any)["bearerTokenFile"]
				_, auth := e.(map[string]any)["authorization"]
				if token := file || auth; token != on {
					t.Errorf("ServiceMonitor %s: bearer token %v with --metrics-endpoint-auth %v", o.GetName(), token, on)
				}
			}
		}
	}
	if authRole != on || reader != on || bound != on {
		t.Errorf("--metrics-endpoint-auth %v, but token review ClusterRole %v, bound to %s/%s %v, metrics-reader ClusterRole %v",
			on, authRole, deploy.GetNamespace(), sa, bound, reader)
	}
}

// containerArgs are the args of the Deployment's container.
func containerArgs(d *unstructured.Unstructured) []string {
	if d == nil {
		return nil
	}
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if len(containers) == 0 {
		return nil
	}
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	return args
}

// checkDeployment: the pod is hardened, probed on the health server's real
// service names, sized, and given time to drain.
func checkDeployment(t *testing.T, d *unstructured.Unstructured) {
	t.Helper()
	if d == nil {
		t.Fatal("no Deployment rendered")
	}
	pod, _, _ := unstructured.NestedMap(d.Object, "spec", "template", "spec")
	str := func(m map[string]any, path ...string) string {
		v, _, _ := unstructured.NestedFieldNoCopy(m, path...)
		return fmt.Sprint(v)
	}
	for path, want := range map[string]string{"securityContext.runAsNonRoot": "true", "securityContext.runAsUser": "65532", "securityContext.seccompProfile.type": "RuntimeDefault"} {
		if got := str(pod, strings.Split(path, ".")...); got != want {
			t.Errorf("pod %s = %s, want %s", path, got, want)
		}
	}
	containers, _, _ := unstructured.NestedSlice(pod, "containers")
	if len(containers) != 1 {
		t.Fatalf("%d containers, want 1", len(containers))
	}
	c := containers[0].(map[string]any)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	arg := func(name string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		return ""
	}
	for path, want := range map[string]string{
		"securityContext.readOnlyRootFilesystem":   "true",
		"securityContext.allowPrivilegeEscalation": "false",
		"securityContext.capabilities.drop":        "[ALL]",
		"livenessProbe.grpc.port":                  arg("grpc-health-port"),
		"livenessProbe.grpc.service":               extproc.HealthLiveness,
		"readinessProbe.grpc.port":                 arg("grpc-health-port"),
		"readinessProbe.grpc.service":              extproc.HealthReadiness,
	} {
		if got := str(c, strings.Split(path, ".")...); got != want || want == "" {
			t.Errorf("container %s = %q, want %q", path, got, want)
		}
	}
	for _, r := range []string{"cpu", "memory"} {
		if str(c, "resources", "requests", r) == "<nil>" {
			t.Errorf("no %s request", r)
		}
	}
	drain, err := time.ParseDuration(arg("drain-timeout"))
	if err != nil {
		t.Fatalf("--drain-timeout: %v", err)
	}
	drainGrace, err := time.ParseDuration(arg("drain-grace-period"))
	if err != nil {
		t.Fatalf("--drain-grace-period: %v", err)
	}
	grace, err := time.ParseDuration(str(pod, "terminationGracePeriodSeconds") + "s")
	if err != nil {
		t.Fatalf("terminationGracePeriodSeconds: %v", err)
	}
	if grace < drainGrace+drain+10*time.Second {
		t.Errorf("terminationGracePeriodSeconds %s does not cover --drain-grace-period %s, --drain-timeout %s and 10s of shutdown", grace, drainGrace, drain)
	}
	// Leader election, provisioning and peer sync find the Lease and the
	// replicas' pods in POD_NAMESPACE, and the replicas by their picker
	// label.
	if slices.Contains(args, "--ha-enable-leader-election") || slices.Contains(args, "--provision-picker-services") || slices.Contains(args, "--peer-sync") {
		if got := str(c, "env"); !strings.Contains(got, "name:POD_NAMESPACE") || !strings.Contains(got, "fieldPath:metadata.namespace") {
			t.Errorf("container env %s lacks POD_NAMESPACE from metadata.namespace", got)
		}
		if got, want := str(d.Object, "spec", "template", "metadata", "labels", "poolpicker.io/picker"), arg("picker-name"); got != want || want == "" {
			t.Errorf("pod label poolpicker.io/picker %q, want --picker-name %q", got, want)
		}
	}
}

// TestDryRunEveryObject creates every object the kustomizations and the
// chart variants render with a server-side dry-run: the API server's
// validation (schemas, the ServiceMonitor CRD's, RBAC's escalation check)
// accepts all of them.
func TestDryRunEveryObject(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	type source struct {
		name string
		objs func() ([]*unstructured.Unstructured, error)
	}
	var sources []source
	for _, k := range kustomizations {
		sources = append(sources, source{"kustomize " + k.dir, func() ([]*unstructured.Unstructured, error) { return tool.Kustomize(ctx, k.dir) }})
	}
	for _, v := range chartVariants {
		sources = append(sources, source{"chart " + v.name, func() ([]*unstructured.Unstructured, error) {
			return tool.Chart(ctx, deploytest.ChartOptions{Values: v.values})
		}})
	}
	sources = append(sources, source{"kustomize " + conformanceOverlay + " over the suite's manifest", func() ([]*unstructured.Unstructured, error) {
		return renderConformance(t, ctx, ""), nil
	}})
	for _, s := range sources {
		t.Run(s.name, func(t *testing.T) {
			objs, err := s.objs()
			if err != nil {
				t.Fatal(err)
			}
			ensureNamespaces(t, ctx, objs)
			for _, o := range objs {
				err := env.Client.Create(ctx, o.DeepCopy(), client.DryRunAll)
				if apierrors.IsAlreadyExists(err) {
					// The CRDs (installed by the test control plane) and
					// the namespaces made above: an apply is validated
					// the same way.
					u := o.DeepCopy()
					u.SetResourceVersion("")
					err = env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.DryRunAll, client.ForceOwnership, client.FieldOwner("install-test"))
				}
				if err != nil {
					t.Errorf("dry-run of %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
		})
	}
}

// ensureNamespaces dry-runs each rendered Namespace, then creates every
// namespace the objects live in, so that their dry-runs find it.
func ensureNamespaces(t *testing.T, ctx context.Context, objs []*unstructured.Unstructured) {
	t.Helper()
	names := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			if err := env.Client.Create(ctx, o.DeepCopy(), client.DryRunAll); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Errorf("dry-run of Namespace %s: %v", o.GetName(), err)
			}
			names[o.GetName()] = true
		}
		if ns := o.GetNamespace(); ns != "" {
			names[ns] = true
		}
	}
	for ns := range names {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind("Namespace")
		u.SetName(ns)
		if err := env.Client.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// TestChartNeverReplacesCRDs: asked to install CRDs, the chart renders none
// that the API server already has, and the ones it renders are poolpicker's
// own, marked to be kept on uninstall.
func TestChartNeverReplacesCRDs(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := writeKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	present, err := tool.Chart(ctx, deploytest.ChartOptions{Values: "crds: {install: true}\n", Kubeconfig: kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range present {
		if o.GetKind() == "CustomResourceDefinition" {
			t.Errorf("chart renders CRD %s although the API server has it", o.GetName())
		}
	}
	absent, err := tool.Chart(ctx, deploytest.ChartOptions{Values: "crds: {install: true}\n"})
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range absent {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		n++
		if got := o.GetAnnotations()["helm.sh/resource-policy"]; got != "keep" {
			t.Errorf("CRD %s: helm.sh/resource-policy %q, want keep", o.GetName(), got)
		}
	}
	if n != len(files) {
		t.Errorf("chart renders %d CRDs with none present, want the %d of config/crd/bases", n, len(files))
	}
}

// TestChartCRDsAreConfigCRDs keeps charts/poolpicker/files/crds a copy of
// config/crd/bases (`make manifests` copies them).
func TestChartCRDsAreConfigCRDs(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in config/crd/bases: %v", err)
	}
	copies, _ := filepath.Glob(filepath.Join(root, "charts", "poolpicker", "files", "crds", "*.yaml"))
	if len(copies) != len(files) {
		t.Errorf("charts/poolpicker/files/crds holds %d files, config/crd/bases %d: run `make manifests`", len(copies), len(files))
	}
	for _, f := range files {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(root, "charts", "poolpicker", "files", "crds", filepath.Base(f)))
		if err != nil || string(got) != string(want) {
			t.Errorf("charts/poolpicker/files/crds/%s differs from config/crd/bases (%v): run `make manifests`", filepath.Base(f), err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(want, &m); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
