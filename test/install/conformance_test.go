// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package install

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/poolpicker/poolpicker/internal/deploytest"
	"github.com/poolpicker/poolpicker/internal/eppclient"
	"github.com/poolpicker/poolpicker/internal/localstack"
	"github.com/poolpicker/poolpicker/internal/modelsim"
	"github.com/poolpicker/poolpicker/internal/permissions"
)

const (
	conformanceNS      = "inference-conformance-app-backend"
	conformanceOverlay = "config/deploy/overlays/conformance"
	// suiteManifestURL is the suite's base manifest the overlay renders over.
	suiteManifestURL = "https://raw.githubusercontent.com/kubernetes-sigs/gateway-api-inference-extension/v1.6.0/conformance/resources/base.yaml"
)

// renderConformance renders the conformance overlay (or, with sub, one of
// its directories) over testdata's stand-in for the suite's manifest: a copy
// of config/deploy whose suite/upstream names the stand-in instead of the
// release's URL, which tests cannot fetch.
func renderConformance(t *testing.T, ctx context.Context, sub string) []*unstructured.Unstructured {
	t.Helper()
	upstream := filepath.Join(conformanceOverlay, "suite", "upstream", "kustomization.yaml")
	b, err := os.ReadFile(filepath.Join(root, upstream))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "- "+suiteManifestURL+"\n") {
		t.Fatalf("%s does not name %s, the manifest testdata stands in for:\n%s", upstream, suiteManifestURL, b)
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(root+"/config/deploy")); err != nil {
		t.Fatal(err)
	}
	copyUp := filepath.Join(dir, "overlays", "conformance", "suite", "upstream")
	stand, err := os.ReadFile(filepath.Join(root, "test", "install", "testdata", "conformance-suite-base.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string][]byte{
		"kustomization.yaml": []byte("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- base.yaml\n"),
		"base.yaml":          stand,
	} {
		if err := os.WriteFile(filepath.Join(copyUp, name), text, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := tool.Run(ctx, "kustomize", filepath.Join(dir, "overlays", "conformance", sub))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploytest.Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// number is the integer at path in m, however the decoder typed it.
func number(m map[string]any, path ...string) int64 {
	v, _, _ := unstructured.NestedFieldNoCopy(m, path...)
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	}
	return 0
}

// flagValue is the value of --name=value in args ("" when absent).
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// TestConformanceOverlayRenders: the overlay turns the suite's manifest into
// one poolpicker serving its five pools: no lwepp Deployment is left, every
// pool's EPP Service selects poolpicker's pods on its ext_proc port,
// poolpicker serves exactly those Services' pools with lwepp's ports and
// encoder and the conformance-test behaviours on, hardened as the base is,
// and the Role grants what poolpicker's start-up check asks for with these
// args, no more.
func TestConformanceOverlayRenders(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	objs := renderConformance(t, ctx, "")
	var deploys []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Deployment" && strings.HasSuffix(o.GetName(), "-app-endpoint-picker") {
			t.Errorf("lwepp Deployment %s left", o.GetName())
		}
		if o.GetKind() == "Deployment" && strings.Contains(fmt.Sprint(o.Object["spec"]), "poolpicker") {
			deploys = append(deploys, o)
		}
		if o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding" {
			t.Errorf("%s %s: the overlay needs nothing cluster-wide", o.GetKind(), o.GetName())
		}
	}
	if len(deploys) != 1 {
		t.Fatalf("%d poolpicker Deployments, want 1", len(deploys))
	}
	deploy := deploys[0]
	checkDeployment(t, deploy)
	args := containerArgs(deploy)
	for _, want := range []string{"--zap-encoder=json", "--grpc-port=9002", "--grpc-health-port=9003", "--enable-conformance-test-behaviors",
		"--watch-namespaces=" + conformanceNS, "--metrics-endpoint-auth=false"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	if deploy.GetNamespace() != conformanceNS {
		t.Errorf("poolpicker in namespace %q, want the suite's %s", deploy.GetNamespace(), conformanceNS)
	}
	podLabels, _, _ := unstructured.NestedStringMap(deploy.Object, "spec", "template", "metadata", "labels")
	services := strings.Split(flagValue(args, "epp-service-name"), ",")
	pools := 0
	for _, o := range objs {
		if o.GetKind() != "InferencePool" {
			continue
		}
		pools++
		svcName, _, _ := unstructured.NestedString(o.Object, "spec", "endpointPickerRef", "name")
		port := number(o.Object, "spec", "endpointPickerRef", "port", "number")
		if !slices.Contains(services, svcName) {
			t.Errorf("pool %s: its EPP Service %s is not among --epp-service-name %v", o.GetName(), svcName, services)
		}
		svc := deploytest.Find(objs, "Service", svcName)
		if svc == nil {
			t.Errorf("pool %s: no Service %s", o.GetName(), svcName)
			continue
		}
		sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
		for k, v := range sel {
			if podLabels[k] != v {
				t.Errorf("Service %s selects %s=%s, which poolpicker's pods (%v) do not carry", svcName, k, v, podLabels)
			}
		}
		if len(sel) == 0 {
			t.Errorf("Service %s selects nothing", svcName)
		}
		ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
		found := false
		for _, p := range ports {
			pm := p.(map[string]any)
			if fmt.Sprint(pm["port"]) == strconv.FormatInt(port, 10) && fmt.Sprint(pm["targetPort"]) == flagValue(args, "grpc-port") {
				found = true
			}
		}
		if !found {
			t.Errorf("Service %s has no port %d to poolpicker's --grpc-port %s: %v", svcName, port, flagValue(args, "grpc-port"), ports)
		}
	}
	if pools != 5 || len(services) != 5 {
		t.Errorf("%d pools, %d --epp-service-name entries: want the suite's 5", pools, len(services))
	}

	// The Role: permissions.Rules with these args, every scope in the
	// pools' namespace (the deployment's own).
	needed := permissions.Needed(permissions.Rules, func(feature string) bool { return slices.Contains(args, "--"+feature) })
	want := map[string]bool{}
	for _, r := range needed {
		for _, v := range r.Verbs {
			want[r.Group+"|"+r.Resource+"|"+v] = true
		}
	}
	role := deploytest.Find(objs, "Role", "poolpicker-conformance")
	if role == nil {
		t.Fatal("no Role poolpicker-conformance")
	}
	got := map[string]bool{}
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	for _, r := range rules {
		m := r.(map[string]any)
		groups, _, _ := unstructured.NestedStringSlice(m, "apiGroups")
		resources, _, _ := unstructured.NestedStringSlice(m, "resources")
		verbs, _, _ := unstructured.NestedStringSlice(m, "verbs")
		for _, g := range groups {
			for _, res := range resources {
				for _, v := range verbs {
					got[g+"|"+res+"|"+v] = true
				}
			}
		}
	}
	for k := range want {
		if !got[k] {
			t.Errorf("Role lacks %s, which poolpicker needs with args %v", k, args)
		}
	}
	for k := range got {
		if !want[k] {
			t.Errorf("Role grants %s, which poolpicker does not need with args %v", k, args)
		}
	}
}

// TestConformanceChartValues: the chart with values-conformance.yaml, as
// the release poolpicker-conformance in the suite's namespace, runs
// poolpicker with the overlay's serving args, on pods the overlay's
// re-selected Services select.
func TestConformanceChartValues(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	values, err := os.ReadFile(filepath.Join(root, "charts", "poolpicker", "values-conformance.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	opts := deploytest.ChartOptions{Values: string(values), Namespace: conformanceNS, Release: "poolpicker-conformance"}
	if out, err := tool.LintChart(ctx, opts); err != nil {
		t.Fatalf("lint: %v\n%s", err, out)
	}
	chart, err := tool.Chart(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	deploy := deploytest.Find(chart, "Deployment", "poolpicker-conformance")
	if deploy == nil {
		t.Fatal("no Deployment poolpicker-conformance")
	}
	checkDeployment(t, deploy)
	checkRBAC(t, chart, deploy)
	overlay := deploytest.Find(renderConformance(t, ctx, ""), "Deployment", "poolpicker-conformance")
	chartArgs, overlayArgs := containerArgs(deploy), containerArgs(overlay)
	for _, name := range []string{"watch-namespaces", "epp-service-name", "picker-name", "grpc-port", "grpc-health-port", "zap-encoder", "metrics-endpoint-auth"} {
		if c, o := flagValue(chartArgs, name), flagValue(overlayArgs, name); c != o {
			t.Errorf("--%s: %q in the chart, %q in the overlay", name, c, o)
		}
	}
	if !slices.Contains(chartArgs, "--enable-conformance-test-behaviors") {
		t.Errorf("chart args %v lack --enable-conformance-test-behaviors", chartArgs)
	}
	podLabels, _, _ := unstructured.NestedStringMap(deploy.Object, "spec", "template", "metadata", "labels")
	for _, svc := range renderConformance(t, ctx, "suite") {
		if svc.GetKind() != "Service" {
			continue
		}
		sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
		for k, v := range sel {
			if podLabels[k] != v {
				t.Errorf("Service %s selects %s=%s, which the chart's pods (%v) do not carry", svc.GetName(), k, v, podLabels)
			}
		}
	}
}

// TestConformanceOverlayActsAsLwepp starts poolpicker with the overlay's
// Deployment args against the suite's pools on the API server, their pods
// run by model servers on loopback, and plays the suite's gateway: for each
// pool, reached through its own EPP Service, the test-epp-endpoint-selection
// header picks the endpoint (one, two or three IPs; ip:port on the
// data-parallel pool), and the served endpoint the gateway reports comes
// back in x-conformance-test-served-endpoint, or the failure text when it
// reports none, as lwepp answers.
func TestConformanceOverlayActsAsLwepp(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	objs := renderConformance(t, ctx, "")
	ensureNamespaces(t, ctx, objs)
	dir := t.TempDir()
	binary := pickerBinary

	// The model servers' pods: three per Deployment, each on its own
	// loopback address, serving every container port.
	podIPs := map[string][]string{} // pool selector app label → pod IPs
	next := 2
	for _, d := range objs {
		if d.GetKind() != "Deployment" || d.GetName() == "poolpicker-conformance" {
			continue
		}
		labels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
		containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		var ports []int64
		for _, c := range containers {
			cps, _, _ := unstructured.NestedSlice(c.(map[string]any), "ports")
			for _, p := range cps {
				ports = append(ports, number(p.(map[string]any), "containerPort"))
			}
		}
		if len(ports) == 0 {
			t.Fatalf("Deployment %s: no container ports", d.GetName())
		}
		for i := 0; i < 3; i++ {
			ip := fmt.Sprintf("127.0.24.%d", next)
			next++
			for _, p := range ports {
				srv, err := modelsim.New(modelsim.Options{Addr: net.JoinHostPort(ip, strconv.FormatInt(p, 10)), Model: "m"})
				if err != nil {
					t.Fatal(err)
				}
				if err := srv.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(srv.Stop)
			}
			readyPod(t, ctx, conformanceNS, fmt.Sprintf("%s-%d", d.GetName(), i), ip, labels)
			podIPs[labels["app"]] = append(podIPs[labels["app"]], ip)
		}
	}
	for _, o := range objs {
		if o.GetKind() == "InferencePool" || o.GetKind() == "Service" {
			if err := env.Client.Create(ctx, o.DeepCopy()); err != nil {
				t.Fatal(err)
			}
		}
	}

	ports, err := localstack.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	// The Deployment's args; the fixed ports would collide with other
	// tests' (the last occurrence of a flag wins).
	args := append(containerArgs(deploytest.Find(objs, "Deployment", "poolpicker-conformance")), "--kubeconfig="+kubeconfig,
		fmt.Sprintf("--grpc-port=%d", ports[0]), fmt.Sprintf("--grpc-health-port=%d", ports[1]), fmt.Sprintf("--metrics-port=%d", ports[2]))
	p := &localstack.Process{Path: binary, Args: args, Log: filepath.Join(dir, "poolpicker.log"), HealthAddr: fmt.Sprintf("127.0.0.1:%d", ports[1])}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })

	c := eppclient.New(fmt.Sprintf("127.0.0.1:%d", ports[0]), eppclient.Options{TLS: true})
	t.Cleanup(func() { _ = c.Close() })
	for _, pool := range objs {
		if pool.GetKind() != "InferencePool" {
			continue
		}
		app, _, _ := unstructured.NestedString(pool.Object, "spec", "selector", "matchLabels", "app")
		svc, _, _ := unstructured.NestedString(pool.Object, "spec", "endpointPickerRef", "name")
		tps, _, _ := unstructured.NestedSlice(pool.Object, "spec", "targetPorts")
		var targetPorts []string
		for _, tp := range tps {
			targetPorts = append(targetPorts, fmt.Sprint(tp.(map[string]any)["number"]))
		}
		ips := podIPs[app]
		authority := svc + "." + conformanceNS + ".svc:9002"
		cases := [][]string{{ips[1]}, {ips[0], ips[2]}, {ips[2], ips[1], ips[0]}}
		if len(targetPorts) > 1 {
			cases = append(cases, []string{net.JoinHostPort(ips[2], targetPorts[1])})
		}
		for _, sel := range cases {
			t.Run(fmt.Sprintf("%s/%s", pool.GetName(), strings.Join(sel, ",")), func(t *testing.T) {
				res, err := c.Do(ctx, eppclient.Request{Authority: authority, Headers: []eppclient.Header{{Key: eppclient.HeaderTestSelection, Value: strings.Join(sel, ",")}},
					Body: []byte(`{"model":"m","prompt":"hello"}`), Response: &eppclient.Response{Status: 200, Body: []byte(`{"choices":[{"text":"hi"}]}`), ServedPrimary: true}})
				if err != nil {
					t.Fatalf("%v; log:\n%s", err, tailLog(p.Log))
				}
				if res.Immediate != nil || len(res.Endpoints()) == 0 {
					t.Fatalf("not routed: %+v", res)
				}
				for _, e := range res.Endpoints() {
					host, port, _ := net.SplitHostPort(e)
					if !slices.Contains(sel, host) && !slices.Contains(sel, e) {
						t.Errorf("endpoint %s outside the selection %v", e, sel)
					}
					if !slices.Contains(targetPorts, port) {
						t.Errorf("endpoint %s not on the pool's target ports %v", e, targetPorts)
					}
				}
				if got, want := res.ResponseHeaders[eppclient.HeaderTestServedResult], res.Endpoints()[0]; got != want {
					t.Errorf("%s = %q, want the served endpoint the gateway reported, %s", eppclient.HeaderTestServedResult, got, want)
				}
			})
		}
		t.Run(pool.GetName()+"/served endpoint missing", func(t *testing.T) {
			res, err := c.Do(ctx, eppclient.Request{Authority: authority, Body: []byte(`{"model":"m","prompt":"hello"}`),
				Response: &eppclient.Response{Status: 200, Body: []byte(`{"choices":[{"text":"hi"}]}`)}})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := res.ResponseHeaders[eppclient.HeaderTestServedResult], "fail: missing destination endpoint served metadata"; got != want {
				t.Errorf("%s = %q, want lwepp's %q", eppclient.HeaderTestServedResult, got, want)
			}
		})
	}
}

// readyPod creates a Ready pod in namespace with ip and labels, its status
// set through the status subresource as a kubelet would.
func readyPod(t *testing.T, ctx context.Context, namespace, name, ip string, labels map[string]string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "server", Image: "echo-basic"}}}}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := env.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

func tailLog(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
