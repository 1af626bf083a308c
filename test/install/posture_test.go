// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package install

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/poolpicker/poolpicker/internal/deploytest"
)

// lastFlag is the value a bool flag ends with in args (the last occurrence
// wins, as in flag parsing), or def when args do not set it.
func lastFlag(args []string, name string, def bool) bool {
	on := def
	for _, a := range args {
		switch a {
		case "--" + name, "--" + name + "=true":
			on = true
		case "--" + name + "=false":
			on = false
		}
	}
	return on
}

// TestSecureByDefault renders the chart with its default values and the
// kustomize base, and asserts what a tenant's pod that reaches the Service
// can get: the metrics port wants a token (the reviews' ClusterRole bound to
// the picker, a reader ClusterRole for scrapers), Go's profiles are not
// served, ext_proc is TLS; and a NetworkPolicy is offered (chart value,
// overlay) that admits each port only from the namespaces it names, and a
// ServiceMonitor that sends Prometheus' token. Peer sync is on, its port on
// no Service, and the NetworkPolicy admits only the picker's own pods to
// it.
func TestSecureByDefault(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	type install struct {
		name string
		// installed is what the default install renders; policy and
		// monitor what the offered NetworkPolicy and ServiceMonitor
		// options render.
		installed, policy, monitor func() ([]*unstructured.Unstructured, error)
	}
	chart := func(values string) func() ([]*unstructured.Unstructured, error) {
		return func() ([]*unstructured.Unstructured, error) {
			return tool.Chart(ctx, deploytest.ChartOptions{Values: values})
		}
	}
	kustomize := func(dir string) func() ([]*unstructured.Unstructured, error) {
		return func() ([]*unstructured.Unstructured, error) { return tool.Kustomize(ctx, dir) }
	}
	for _, in := range []install{
		{"chart", chart(""), chart("networkPolicy: {enabled: true}\n"), chart("metrics: {serviceMonitor: {enabled: true}}\n")},
		{"kustomize", kustomize("config/deploy/base"), kustomize("config/deploy/overlays/networkpolicy"), kustomize("config/deploy/overlays/servicemonitor")},
	} {
		t.Run(in.name, func(t *testing.T) {
			objs, err := in.installed()
			if err != nil {
				t.Fatal(err)
			}
			deploy := deploytest.Find(objs, "Deployment", "poolpicker")
			if deploy == nil {
				t.Fatal("no Deployment poolpicker")
			}
			args := containerArgs(deploy)
			if !lastFlag(args, "metrics-endpoint-auth", true) {
				t.Errorf("metrics endpoint authentication is off by default: args %v", args)
			}
			if lastFlag(args, "enable-pprof", false) {
				t.Errorf("pprof is served by default: args %v", args)
			}
			if !lastFlag(args, "secure-serving", true) {
				t.Errorf("ext_proc is plaintext by default: args %v", args)
			}
			checkMetricsAuth(t, objs, deploy) // the reviews' role bound, the reader role rendered
			// The replicas share their picks, on a port of their own that
			// no Service exposes, over TLS (the ext_proc certificate).
			if peerSyncPort(t, args) == 0 {
				t.Errorf("peer sync is off by default: args %v", args)
			}
			checkPeerSync(t, objs, deploy)
			for _, o := range objs {
				if o.GetKind() == "NetworkPolicy" || o.GetKind() == "ServiceMonitor" {
					t.Errorf("the default install renders %s %s; it is offered, not imposed", o.GetKind(), o.GetName())
				}
			}

			policy, err := in.policy()
			if err != nil {
				t.Fatal(err)
			}
			checkNetworkPolicy(t, policy)

			monitor, err := in.monitor()
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, o := range monitor {
				if o.GetKind() != "ServiceMonitor" {
					continue
				}
				n++
				endpoints, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
				for _, e := range endpoints {
					// The kustomize overlay sends Prometheus' own token, the
					// chart a scraper account's through authorization.
					secret, _, _ := unstructured.NestedString(e.(map[string]any), "authorization", "credentials", "name")
					if e.(map[string]any)["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" && secret == "" {
						t.Errorf("ServiceMonitor %s endpoint %v sends no bearer token", o.GetName(), e)
					}
				}
			}
			if n != 1 {
				t.Errorf("the ServiceMonitor option renders %d ServiceMonitors, want 1", n)
			}
		})
	}
	// Asked for, pprof is served.
	objs, err := tool.Chart(ctx, deploytest.ChartOptions{Values: "metrics: {pprof: {enabled: true}}\n"})
	if err != nil {
		t.Fatal(err)
	}
	if args := containerArgs(deploytest.Find(objs, "Deployment", "poolpicker")); !lastFlag(args, "enable-pprof", false) {
		t.Errorf("metrics.pprof.enabled: args %v turn pprof off", args)
	}
}

// checkNetworkPolicy: one NetworkPolicy selects the Deployment's pods,
// restricts ingress, and admits each of the container's ports only from
// a namespace selector that is not empty (an empty one admits every
// namespace), or from the picker's own pods (a pod selector alone, which
// matches pods of the policy's namespace only); the peer-sync port is
// admitted from the picker's own pods and from no one else; every
// container port is covered, or the probes', gateways' and peers' traffic
// would be cut.
func checkNetworkPolicy(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	deploy := deploytest.Find(objs, "Deployment", "poolpicker")
	var policies []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "NetworkPolicy" {
			policies = append(policies, o)
		}
	}
	if len(policies) != 1 || deploy == nil {
		t.Fatalf("%d NetworkPolicies, Deployment %v; want one of each", len(policies), deploy != nil)
	}
	np := policies[0]
	if np.GetNamespace() != deploy.GetNamespace() {
		t.Errorf("NetworkPolicy in %q, Deployment in %q", np.GetNamespace(), deploy.GetNamespace())
	}
	podLabels, _, _ := unstructured.NestedStringMap(deploy.Object, "spec", "template", "metadata", "labels")
	selectsPicker := func(sel map[string]string) bool {
		for k, v := range sel {
			if podLabels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	sel, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
	if len(sel) == 0 {
		t.Errorf("NetworkPolicy selects every pod of its namespace")
	}
	if !selectsPicker(sel) {
		t.Errorf("NetworkPolicy selects %v, labels the picker's pods (%v) lack", sel, podLabels)
	}
	if types, _, _ := unstructured.NestedStringSlice(np.Object, "spec", "policyTypes"); !slices.Contains(types, "Ingress") {
		t.Errorf("NetworkPolicy policyTypes %v lack Ingress", types)
	}
	peerPort := strconv.Itoa(peerSyncPort(t, containerArgs(deploy)))
	admitted := map[string]bool{}
	rules, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	for _, r := range rules {
		rule := r.(map[string]any)
		from, _, _ := unstructured.NestedSlice(rule, "from")
		if len(from) == 0 {
			t.Errorf("ingress rule %v admits every source", rule)
		}
		onlyPeers := len(from) > 0
		for _, f := range from {
			peer := f.(map[string]any)
			nsLabels, hasNS, _ := unstructured.NestedStringMap(peer, "namespaceSelector", "matchLabels")
			podSel, hasPods, _ := unstructured.NestedStringMap(peer, "podSelector", "matchLabels")
			switch {
			case hasNS && !hasPods:
				onlyPeers = false
				if len(nsLabels) == 0 {
					t.Errorf("ingress rule source %v admits every namespace", peer)
				}
			case hasPods && !hasNS && len(peer) == 1:
				if !selectsPicker(podSel) {
					t.Errorf("ingress rule source %v admits pods other than the picker's own (%v)", peer, podLabels)
				}
			default:
				onlyPeers = false
				t.Errorf("ingress rule source %v is neither a namespace selector nor the picker's own pods", peer)
			}
		}
		ports, _, _ := unstructured.NestedSlice(rule, "ports")
		if len(ports) == 0 {
			t.Errorf("ingress rule %v admits every port", rule)
		}
		for _, p := range ports {
			port := fmt.Sprint(p.(map[string]any)["port"])
			admitted[port] = true
			if port == peerPort && !onlyPeers {
				t.Errorf("ingress rule %v admits sources other than the picker's own pods to the peer-sync port %s", rule, port)
			}
			if port != peerPort && onlyPeers {
				t.Errorf("ingress rule %v admits the picker's own pods to port %s, which they do not use", rule, port)
			}
		}
	}
	containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
	ports, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "ports")
	var missing []string
	for _, p := range ports {
		if port := fmt.Sprint(p.(map[string]any)["containerPort"]); !admitted[port] {
			missing = append(missing, port)
		}
	}
	if len(missing) > 0 {
		t.Errorf("NetworkPolicy admits no one to container ports %s", strings.Join(missing, ", "))
	}
}

// TestChartClientCA: tls.clientCA mounts the Secret's or ConfigMap's key as
// a whole volume (a subPath mount never sees an update, so a rotation
// would not reach the reload) and points --client-ca-file at it, with
// --enable-cert-reload; contradictory values fail the render, naming them.
func TestChartClientCA(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	for _, c := range []struct {
		name, values string
		source, key  string
	}{
		{"Secret", "tls: {clientCA: {secretName: gateway-ca}}\n", "secret", "ca.crt"},
		{"ConfigMap", "tls: {clientCA: {configMapName: istio-ca-root-cert, key: root-cert.pem}}\n", "configMap", "root-cert.pem"},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs, err := tool.Chart(ctx, deploytest.ChartOptions{Values: c.values})
			if err != nil {
				t.Fatal(err)
			}
			deploy := deploytest.Find(objs, "Deployment", "poolpicker")
			args := containerArgs(deploy)
			var file string
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "--client-ca-file="); ok {
					file = v
				}
			}
			if file == "" || !slices.Contains(args, "--enable-cert-reload") {
				t.Fatalf("args %v: want --client-ca-file and --enable-cert-reload", args)
			}
			containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
			mounts, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "volumeMounts")
			volumes, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "volumes")
			found := false
			for _, m := range mounts {
				mount := m.(map[string]any)
				dir := fmt.Sprint(mount["mountPath"])
				if !strings.HasPrefix(file, dir+"/") {
					continue
				}
				if _, sub := mount["subPath"]; sub {
					t.Errorf("mount %v uses a subPath", mount)
				}
				for _, v := range volumes {
					vol := v.(map[string]any)
					if vol["name"] != mount["name"] {
						continue
					}
					src, ok := vol[c.source].(map[string]any)
					items := fmt.Sprint(src["items"])
					if !ok || !strings.Contains(items, "key:"+c.key) || !strings.Contains(items, "path:"+strings.TrimPrefix(file, dir+"/")) {
						t.Errorf("volume %v does not put the %s's key %s at %s", vol, c.source, c.key, file)
					}
					found = true
				}
			}
			if !found {
				t.Errorf("--client-ca-file=%s is on no mounted volume (mounts %v)", file, mounts)
			}
		})
	}
	for _, c := range []struct{ name, values, want string }{
		{"both sources", "tls: {clientCA: {secretName: a, configMapName: b}}\n", "not both"},
		{"without TLS", "tls: {enabled: false, clientCA: {secretName: a}}\n", "needs tls.enabled"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := tool.Chart(ctx, deploytest.ChartOptions{Values: c.values}); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("render: %v, want an error containing %q", err, c.want)
			}
		})
	}
}
