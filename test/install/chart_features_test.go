// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package install

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/poolpicker/poolpicker/internal/deploytest"
	"github.com/poolpicker/poolpicker/scheduling"
)

// container returns the Deployment's container.
func container(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	d := deploytest.Find(objs, "Deployment", "poolpicker")
	if d == nil {
		t.Fatal("no Deployment rendered")
	}
	cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	return cs[0].(map[string]any)
}

func podSpec(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	spec, _, _ := unstructured.NestedMap(deploytest.Find(objs, "Deployment", "poolpicker").Object, "spec", "template", "spec")
	return spec
}

// named returns the element of a list of objects whose name is name.
func named(list any, name string) map[string]any {
	items, _ := list.([]any)
	for _, it := range items {
		if m, ok := it.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	return nil
}

func envValue(c map[string]any, name string) (string, bool) {
	e := named(c["env"], name)
	if e == nil {
		return "", false
	}
	v, _ := e["value"].(string)
	return v, true
}

// values renders v (any YAML-able value) as chart values.
func values(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// upstreamSchedulerConfig is the Inference Extension chart's default
// scheduler config, the one an upstream user brings along.
func upstreamSchedulerConfig(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "scheduling", "testdata", "upstream", "inference-extension-chart-default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestChartFeatureValues renders the values an upstream user sets and
// checks what each one puts in the pod.
func TestChartFeatureValues(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	config := upstreamSchedulerConfig(t)
	if _, err := scheduling.LoadConfig([]byte(config)); err != nil {
		t.Fatalf("the upstream scheduler config does not load: %v", err)
	}
	for _, tc := range []struct {
		name   string
		values string
		check  func(t *testing.T, objs []*unstructured.Unstructured)
	}{{
		name:   "scheduler config inline",
		values: values(t, map[string]any{"scheduler": map[string]any{"config": config}}),
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			cm := deploytest.Find(objs, "ConfigMap", "poolpicker-scheduler")
			if cm == nil {
				t.Fatal("no ConfigMap poolpicker-scheduler")
			}
			text, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
			if _, err := scheduling.LoadConfig([]byte(text)); err != nil || strings.TrimSpace(text) != strings.TrimSpace(config) {
				t.Errorf("ConfigMap data differs from scheduler.config or does not load (%v):\n%s", err, text)
			}
			checkSchedulerMount(t, objs, "poolpicker-scheduler", "config.yaml")
			ann, _, _ := unstructured.NestedString(deploytest.Find(objs, "Deployment", "poolpicker").Object, "spec", "template", "metadata", "annotations", "checksum/scheduler-config")
			if ann == "" {
				t.Error("no checksum/scheduler-config annotation: a changed config would not roll the pods")
			}
		},
	}, {
		name:   "scheduler config from an existing ConfigMap",
		values: "scheduler: {existingConfigMap: team-scheduler, key: epp.yaml}\n",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, o := range objs {
				if o.GetKind() == "ConfigMap" {
					t.Errorf("renders ConfigMap %s although the config is the user's", o.GetName())
				}
			}
			checkSchedulerMount(t, objs, "team-scheduler", "epp.yaml")
		},
	}, {
		name: "env, extra volumes and mounts",
		values: `
env: [{name: GOMEMLIMIT, value: 1200MiB}]
extraVolumes: [{name: plugins, configMap: {name: plugin-data}}]
extraVolumeMounts: [{name: plugins, mountPath: /etc/plugins, readOnly: true}]
`,
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			c := container(t, objs)
			if v, _ := envValue(c, "GOMEMLIMIT"); v != "1200MiB" {
				t.Errorf("env GOMEMLIMIT %q, want 1200MiB", v)
			}
			if _, ok := envValue(c, "POD_NAMESPACE"); !ok {
				t.Error("env lost POD_NAMESPACE")
			}
			if m := named(c["volumeMounts"], "plugins"); m == nil || m["mountPath"] != "/etc/plugins" {
				t.Errorf("volumeMounts %v lack plugins at /etc/plugins", c["volumeMounts"])
			}
			if named(c["volumeMounts"], "peer-sync-key") == nil {
				t.Error("the extra mount replaced the peer-sync key's")
			}
			if v := named(podSpec(t, objs)["volumes"], "plugins"); v == nil {
				t.Errorf("volumes %v lack plugins", podSpec(t, objs)["volumes"])
			}
		},
	}, {
		name:   "tracing",
		values: "tracing: {enabled: true, otlpEndpoint: 'http://otel-collector.monitoring:4317', samplerArg: '0.5', serviceName: epp}\n",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			c := container(t, objs)
			if got := argValue(containerArgs(deploytest.Find(objs, "Deployment", "poolpicker")), "tracing"); got != "true" {
				t.Errorf("--tracing is %q, want on", got)
			}
			for k, want := range map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.monitoring:4317",
				"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5", "OTEL_SERVICE_NAME": "epp"} {
				if got, _ := envValue(c, k); got != want {
					t.Errorf("env %s %q, want %q", k, got, want)
				}
			}
		},
	}, {
		name:   "tracing off by default",
		values: "",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			args := containerArgs(deploytest.Find(objs, "Deployment", "poolpicker"))
			if got := argValue(args, "tracing"); got != "false" {
				t.Errorf("--tracing is %q by default, want false", got)
			}
			if got := argValue(args, "v"); got != "2" {
				t.Errorf("-v is %q by default, want 2", got)
			}
			if slices.Contains(args, "--zap-encoder=json") {
				t.Error("JSON logs by default")
			}
		},
	}, {
		name:   "JSON logs at verbosity 0",
		values: "logFormat: json\nlogVerbosity: 0\n",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			args := containerArgs(deploytest.Find(objs, "Deployment", "poolpicker"))
			if got := argValue(args, "v"); got != "0" {
				t.Errorf("-v is %q with logVerbosity 0, want 0", got)
			}
			if argValue(args, "zap-encoder") != "json" {
				t.Errorf("args %v lack --zap-encoder=json", args)
			}
		},
	}, {
		name:   "topology spread by default",
		values: "",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			spec := podSpec(t, objs)
			spread, _ := spec["topologySpreadConstraints"].([]any)
			var keys []string
			for _, s := range spread {
				m := s.(map[string]any)
				keys = append(keys, fmt.Sprint(m["topologyKey"]))
				sel, _, _ := unstructured.NestedStringMap(m, "labelSelector", "matchLabels")
				if sel["app.kubernetes.io/name"] != "poolpicker" || sel["app.kubernetes.io/instance"] != "poolpicker" {
					t.Errorf("spread over %s selects %v, want the release's pods", m["topologyKey"], sel)
				}
			}
			if !slices.Equal(keys, []string{"topology.kubernetes.io/zone", "kubernetes.io/hostname"}) {
				t.Errorf("spread over %v, want zones and nodes", keys)
			}
			if _, ok := spec["affinity"]; ok {
				t.Errorf("affinity %v by default, want none", spec["affinity"])
			}
		},
	}, {
		name:   "hard anti-affinity",
		values: "podAntiAffinity: hard\naffinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: pool, operator: In, values: [cpu]}]}]}}}\n",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			spec := podSpec(t, objs)
			terms, _, _ := unstructured.NestedSlice(spec, "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
			if len(terms) != 1 || terms[0].(map[string]any)["topologyKey"] != "kubernetes.io/hostname" {
				t.Errorf("required anti-affinity %v, want one term by node", terms)
			}
			if _, ok, _ := unstructured.NestedMap(spec, "affinity", "nodeAffinity"); !ok {
				t.Error("the node affinity of affinity was lost")
			}
		},
	}, {
		name:   "soft anti-affinity",
		values: "podAntiAffinity: soft\n",
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			terms, _, _ := unstructured.NestedSlice(podSpec(t, objs), "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution")
			if len(terms) != 1 {
				t.Errorf("preferred anti-affinity %v, want one term", terms)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if out, err := tool.LintChart(ctx, deploytest.ChartOptions{Values: tc.values}); err != nil {
				t.Fatalf("lint: %v\n%s", err, out)
			}
			objs, err := tool.Chart(ctx, deploytest.ChartOptions{Values: tc.values})
			if err != nil {
				t.Fatal(err)
			}
			checkDeployment(t, deploytest.Find(objs, "Deployment", "poolpicker"))
			checkFlagsExist(t, containerArgs(deploytest.Find(objs, "Deployment", "poolpicker")))
			tc.check(t, objs)
		})
	}
}

// TestChartRefusesBadValues: values that cannot work fail the render with a
// message naming them.
func TestChartRefusesBadValues(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	for _, tc := range []struct{ values, want string }{
		{"scheduler: {config: 'kind: EndpointPickerConfig', existingConfigMap: x}\n", "scheduler: set config or existingConfigMap, not both"},
		{"tracing: {enabled: true}\n", "tracing.enabled needs tracing.otlpEndpoint"},
		{"logFormat: logfmt\n", `logFormat "logfmt": want text or json`},
		{"podAntiAffinity: always\n", `podAntiAffinity "always"`},
		{"podAntiAffinity: soft\naffinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: []}}\n", "podAntiAffinity and affinity.podAntiAffinity: set one"},
	} {
		_, err := tool.Chart(ctx, deploytest.ChartOptions{Values: tc.values})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %q: error %v, want one saying %q", tc.values, err, tc.want)
		}
	}
}

// argValue is the last value of --name (or -name) in args; "true" for a
// bare boolean flag, "" when absent.
func argValue(args []string, name string) string {
	v := ""
	for _, a := range args {
		a = strings.TrimLeft(a, "-")
		if a == name {
			v = "true"
		} else if rest, ok := strings.CutPrefix(a, name+"="); ok {
			v = rest
		}
	}
	return v
}

// checkSchedulerMount: --config-file names the key in a volume of the
// ConfigMap, mounted whole (so an edit reaches the file).
func checkSchedulerMount(t *testing.T, objs []*unstructured.Unstructured, configMap, key string) {
	t.Helper()
	c := container(t, objs)
	file := argValue(containerArgs(deploytest.Find(objs, "Deployment", "poolpicker")), "config-file")
	m := named(c["volumeMounts"], "scheduler-config")
	if m == nil || m["subPath"] != nil || file != fmt.Sprint(m["mountPath"])+"/"+key {
		t.Errorf("--config-file %q, mount %v: want the key %s in the mounted directory", file, m, key)
	}
	v := named(podSpec(t, objs)["volumes"], "scheduler-config")
	if name, _, _ := unstructured.NestedString(v, "configMap", "name"); name != configMap {
		t.Errorf("scheduler-config volume %v, want ConfigMap %s", v, configMap)
	}
}

// checkFlagsExist: every flag the chart passes is one the binary has (its
// --help lists it).
func checkFlagsExist(t *testing.T, args []string) {
	t.Helper()
	help := pickerHelp(t)
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !regexp.MustCompile(`(?m)^\s+(-\w, )?--?` + regexp.QuoteMeta(name) + `\b`).MatchString(help) {
			t.Errorf("the chart passes %s, which poolpicker --help does not list", a)
		}
	}
}

var helpText string

func pickerHelp(t *testing.T) string {
	t.Helper()
	if helpText != "" {
		return helpText
	}
	out, _ := exec.Command(pickerBinary, "--help").CombinedOutput()
	if !bytes.Contains(out, []byte("--grpc-port")) {
		t.Fatalf("poolpicker --help:\n%s", out)
	}
	helpText = string(out)
	return helpText
}

// Sizing of the chart's resources: the pool count the defaults are sized
// for, the idle-stream cost measured by test/robustness, and the limits'
// defaults.
const (
	sizedForPools         = 10000
	streamBytes           = 58 << 10
	defaultMaxStreams     = 5000
	defaultHeldBodyBudget = 256 << 20
)

// TestChartResourcesCoverMeasuredMemory: at the pool count values.yaml names,
// the memory request covers every steady-state RSS the scale harness
// measured with the default plan, and the limit its peak plus every stream
// open and the whole request-body budget held.
func TestChartResourcesCoverMeasuredMemory(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "bench", "scale", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var runs []struct {
		Pools, Pods   int
		Plan          string
		PickerArgs    string
		PickerRSS     int64 `json:"pickerRSS"`
		PickerPeakRSS int64 `json:"pickerPeakRSS"`
	}
	if err := json.Unmarshal(b, &runs); err != nil {
		t.Fatal(err)
	}
	var steady, peak int64
	for _, r := range runs {
		if r.Pools == sizedForPools && r.Plan == "" && r.PickerArgs == "" {
			steady, peak = max(steady, r.PickerRSS), max(peak, r.PickerPeakRSS)
		}
	}
	if steady == 0 {
		t.Fatalf("bench/scale/results.json has no default-plan run at %d pools", sizedForPools)
	}
	vb, err := os.ReadFile(filepath.Join(root, "charts", "poolpicker", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(vb), fmt.Sprintf("sized for %s pools", thousands(sizedForPools))) {
		t.Errorf("values.yaml does not say the resources are sized for %s pools", thousands(sizedForPools))
	}
	var v struct {
		Resources struct {
			Requests map[string]resource.Quantity
			Limits   map[string]resource.Quantity
		}
	}
	if err := yaml.Unmarshal(vb, &v); err != nil {
		t.Fatal(err)
	}
	req, lim := v.Resources.Requests["memory"], v.Resources.Limits["memory"]
	if req.Value() < steady {
		t.Errorf("memory request %s is below the measured steady state %d MiB at %d pools", req.String(), steady>>20, sizedForPools)
	}
	if worst := peak + defaultMaxStreams*streamBytes + defaultHeldBodyBudget; lim.Value() < worst {
		t.Errorf("memory limit %s is below the peak %d MiB at %d pools plus every stream and the body budget (%d MiB)", lim.String(), peak>>20, sizedForPools, worst>>20)
	}
	t.Logf("at %d pools: steady %d MiB, peak %d MiB; request %s, limit %s", sizedForPools, steady>>20, peak>>20, req.String(), lim.String())
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestChartMonitoring renders the ServiceMonitor, the alert rules and the
// dashboards: the ServiceMonitor authenticates with a token Secret of an
// account bound to the metrics reader, every alert and dashboard query
// names metrics poolpicker exports, and the dashboards are the ones under
// config/grafana.
func TestChartMonitoring(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	objs, err := tool.Chart(ctx, deploytest.ChartOptions{Values: "metrics: {serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}, dashboards: {enabled: true}}\n"})
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)

	t.Run("ServiceMonitor", func(t *testing.T) {
		sm := deploytest.Find(objs, "ServiceMonitor", "poolpicker")
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		ep := eps[0].(map[string]any)
		if _, ok := ep["bearerTokenFile"]; ok {
			t.Error("the ServiceMonitor uses the deprecated bearerTokenFile")
		}
		secret, _, _ := unstructured.NestedString(ep, "authorization", "credentials", "name")
		s := deploytest.Find(objs, "Secret", secret)
		if s == nil || s.Object["type"] != "kubernetes.io/service-account-token" {
			t.Fatalf("authorization names Secret %q, which is not a rendered service-account token", secret)
		}
		sa := s.GetAnnotations()["kubernetes.io/service-account.name"]
		if deploytest.Find(objs, "ServiceAccount", sa) == nil {
			t.Errorf("token Secret of service account %q, which is not rendered", sa)
		}
		bound := false
		for _, o := range objs {
			if o.GetKind() != "ClusterRoleBinding" {
				continue
			}
			role, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, sub := range subjects {
				if role == "poolpicker-metrics-reader" && sub.(map[string]any)["name"] == sa {
					bound = true
				}
			}
		}
		if !bound {
			t.Errorf("service account %s is not bound to poolpicker-metrics-reader", sa)
		}
		own, err := tool.Chart(ctx, deploytest.ChartOptions{Values: "metrics: {serviceMonitor: {enabled: true, authorization: {secretName: prom-token, key: t}}}\n"})
		if err != nil {
			t.Fatal(err)
		}
		eps, _, _ = unstructured.NestedSlice(deploytest.Find(own, "ServiceMonitor", "poolpicker").Object, "spec", "endpoints")
		if got := fmt.Sprint(eps[0].(map[string]any)["authorization"]); got != "map[credentials:map[key:t name:prom-token] type:Bearer]" {
			t.Errorf("with the user's Secret, authorization %s", got)
		}
		if deploytest.Find(own, "ServiceAccount", "poolpicker-scraper") != nil {
			t.Error("renders a scraper account although the user brings the token")
		}
	})

	t.Run("PrometheusRule", func(t *testing.T) {
		rule := deploytest.Find(objs, "PrometheusRule", "poolpicker")
		if rule == nil {
			t.Fatal("no PrometheusRule")
		}
		groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
		var alerts []string
		for _, g := range groups {
			rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
			for _, r := range rules {
				m := r.(map[string]any)
				alerts = append(alerts, fmt.Sprint(m["alert"]))
				expr := fmt.Sprint(m["expr"])
				names := queriedMetrics(expr)
				if len(names) == 0 {
					t.Errorf("alert %s queries no poolpicker metric: %s", m["alert"], expr)
				}
				for _, n := range names {
					if !exported[n] {
						t.Errorf("alert %s queries %s, which poolpicker does not export", m["alert"], n)
					}
				}
				if !strings.Contains(expr, `job="poolpicker"`) {
					t.Errorf("alert %s does not select the release's job: %s", m["alert"], expr)
				}
			}
		}
		sort.Strings(alerts)
		want := []string{"PoolpickerLeaderAbsent", "PoolpickerLimitHit", "PoolpickerPeerSyncDown", "PoolpickerPeerSyncKeyMismatch", "PoolpickerPoolConflict", "PoolpickerPoolSyncFailing", "PoolpickerScrapeBudgetStarved"}
		if !slices.Equal(alerts, want) {
			t.Errorf("alerts %v, want %v", alerts, want)
		}
		// Without leader election or peer sync, no alert waits for them.
		off, err := tool.Chart(ctx, deploytest.ChartOptions{Values: "leaderElection: {enabled: false}\npeerSync: {enabled: false}\nmetrics: {prometheusRule: {enabled: true, job: shard-a}}\n"})
		if err != nil {
			t.Fatal(err)
		}
		text := fmt.Sprint(deploytest.Find(off, "PrometheusRule", "poolpicker").Object)
		if strings.Contains(text, "PoolpickerLeaderAbsent") || strings.Contains(text, "PoolpickerPeerSync") || !strings.Contains(text, `job="shard-a"`) {
			t.Errorf("with leader election and peer sync off and job shard-a, rules %s", text)
		}
	})

	t.Run("dashboards", func(t *testing.T) {
		files, _ := filepath.Glob(filepath.Join(root, "config", "grafana", "*.json"))
		if len(files) != 2 {
			t.Fatalf("config/grafana holds %v, want the fleet and the pool dashboards", files)
		}
		for _, f := range files {
			want, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(filepath.Join(root, "charts", "poolpicker", "files", "dashboards", filepath.Base(f))); err != nil || !bytes.Equal(got, want) {
				t.Errorf("charts/poolpicker/files/dashboards/%s differs from config/grafana (%v): run `make manifests`", filepath.Base(f), err)
			}
			var found *unstructured.Unstructured
			for _, o := range objs {
				if o.GetKind() != "ConfigMap" {
					continue
				}
				if _, ok, _ := unstructured.NestedString(o.Object, "data", filepath.Base(f)); ok {
					found = o
				}
			}
			if found == nil {
				t.Errorf("no ConfigMap ships %s", filepath.Base(f))
				continue
			}
			if found.GetLabels()["grafana_dashboard"] != "1" {
				t.Errorf("ConfigMap %s lacks the sidecar's label grafana_dashboard=1: %v", found.GetName(), found.GetLabels())
			}
			data, _, _ := unstructured.NestedString(found.Object, "data", filepath.Base(f))
			if strings.TrimSpace(data) != strings.TrimSpace(string(want)) {
				t.Errorf("ConfigMap %s does not hold %s as it is", found.GetName(), f)
			}
			checkDashboardQueries(t, filepath.Base(f), want, exported)
		}
	})
}

// checkDashboardQueries: every query of the dashboard names metrics
// poolpicker exports, and the fleet dashboard has no per-pool variable.
func checkDashboardQueries(t *testing.T, name string, b []byte, exported map[string]bool) {
	t.Helper()
	var d struct {
		Templating struct {
			List []struct{ Name string } `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			names := queriedMetrics(tg.Expr)
			if len(names) == 0 {
				t.Errorf("%s panel %q queries no poolpicker metric: %s", name, p.Title, tg.Expr)
			}
			for _, n := range names {
				if !exported[n] {
					t.Errorf("%s panel %q queries %s, which poolpicker does not export", name, p.Title, n)
				}
			}
		}
	}
	if strings.Contains(name, "fleet") {
		for _, v := range d.Templating.List {
			if v.Name != "datasource" {
				t.Errorf("the fleet dashboard has variable %s: it shows every pool", v.Name)
			}
		}
	}
}

var metricName = regexp.MustCompile(`\b(?:poolpicker|inference|llm_d_epp)_[a-z0-9_]+`)

// queriedMetrics are the metric families a PromQL expression reads
// (histogram series by their family).
func queriedMetrics(expr string) []string {
	var out []string
	for _, n := range metricName.FindAllString(expr, -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if trimmed, ok := strings.CutSuffix(n, suffix); ok && !strings.HasSuffix(n, "_total_count") {
				n = trimmed
				break
			}
		}
		out = append(out, n)
	}
	return out
}

// exportedMetrics are the metric names poolpicker's production code
// declares: every string literal shaped as one in its non-test Go files.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	literal := regexp.MustCompile(`"((?:poolpicker|inference|llm_d_epp)_[a-z0-9_]+)"`)
	out := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if slices.Contains([]string{"bench", "test", "hack", "conformance", "site-src", "bin", ".git"}, rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range literal.FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Known families: a sanity check that the walk found the code.
	for _, n := range []string{"poolpicker_pool_sync_failing", "poolpicker_leader", "inference_objective_request_total"} {
		if !out[n] {
			t.Fatalf("found no declaration of %s under %s", n, root)
		}
	}
	return out
}
