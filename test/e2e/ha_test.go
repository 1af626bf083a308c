// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/internal/localstack"
)

// pickerIPs are the IPs listed ready in a picker Service's EndpointSlices.
func pickerIPs(t *testing.T, ns, service string) []string {
	t.Helper()
	var list discoveryv1.EndpointSliceList
	if err := stack.Env.Client.List(context.Background(), &list, crclient.InNamespace(ns), crclient.MatchingLabels{discoveryv1.LabelServiceName: service}); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				out = append(out, e.Addresses...)
			}
		}
	}
	slices.Sort(out)
	return out
}

func replicaIPs(rs ...*localstack.Replica) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.PodIP)
	}
	slices.Sort(out)
	return out
}

// samplePickerServices are the endpointPickerRef Services of the sample pools.
var samplePickerServices = []types.NamespacedName{
	{Namespace: "team-a", Name: "epp-chat"}, {Namespace: "team-a", Name: "epp-lora"}, {Namespace: "team-b", Name: "epp-code"},
}

// slicesList waits until every sample pool's picker Service lists exactly want.
func slicesList(t *testing.T, what string, want []string) {
	t.Helper()
	eventually(t, what, func() bool {
		for _, svc := range samplePickerServices {
			if !slices.Equal(pickerIPs(t, svc.Namespace, svc.Name), want) {
				return false
			}
		}
		return true
	})
}

// The sample pools, in team-a and team-b, are reached only through the
// picker Services poolpicker provisioned there, whose slices list both
// replicas in poolpicker-system; the gateway spreads streams over both.
func TestPoolsServedThroughProvisionedServices(t *testing.T) {
	slicesList(t, "picker slices listing both replicas", replicaIPs(stack.Replicas()...))
	for _, name := range samplePickerServices {
		var svc corev1.Service
		if err := stack.Env.Client.Get(context.Background(), crclient.ObjectKey(name), &svc); err != nil {
			t.Fatal(err)
		}
		if len(svc.Spec.Selector) != 0 || svc.Labels["poolpicker.io/picker"] != "poolpicker" || len(svc.OwnerReferences) != 1 || svc.OwnerReferences[0].Kind != "InferencePool" {
			t.Fatalf("Service %s is not a provisioned picker Service: labels %v selector %v owners %v", name, svc.Labels, svc.Spec.Selector, svc.OwnerReferences)
		}
	}
	for _, sp := range samplePools {
		for i := range 6 {
			if o := send(context.Background(), sp.host, "/v1/completions", completion(sp.model, fmt.Sprintf("through the slices %d", i), 2, false), nil); !o.ok() || o.pool != sp.pool {
				t.Fatalf("%s: %v", sp.pool, o)
			}
		}
	}
	// Both replicas answered streams.
	for _, r := range stack.Replicas() {
		if v := replicaMetricTotal(t, r.MetricsAddr, "inference_objective_request_total"); v == 0 {
			t.Fatalf("replica %s took no stream", r.Pod)
		}
	}
}

// A pool that did not opt in (no poolpicker.io/picker label) is not served:
// no claim, no picker Service, no watch; a labelled pool created after it is.
func TestPoolWithoutOptInNotServed(t *testing.T) {
	ctx := context.Background()
	manifest := strings.Replace(string(fill(poolManifest, "{{ns}}", "e2e-optout", "{{name}}", "optout")),
		"    poolpicker.io/picker: poolpicker # opts in to the poolpicker deployment of that name\n", "", 1)
	if !strings.Contains(manifest, "kind: InferencePool") || strings.Contains(manifest, "poolpicker.io/picker") {
		t.Fatal("manifest still opts in")
	}
	if err := stack.Apply(ctx, []byte(manifest)); err != nil {
		t.Fatal(err)
	}
	addDeployment(t, "e2e-optout", "optout-v1", 1, "--port=8000")
	in := newPool(t, "optin", 1, "--port=8000")
	if ips := pickerIPs(t, in.ns, "epp-optin"); len(ips) == 0 {
		t.Fatal("the opted-in pool has no picker slice")
	}
	var svc corev1.Service
	if err := stack.Env.Client.Get(ctx, crclient.ObjectKey{Namespace: "e2e-optout", Name: "epp-optout"}, &svc); !apierrors.IsNotFound(err) {
		t.Fatalf("a picker Service exists for the pool that did not opt in (%v)", err)
	}
	var pool v1.InferencePool
	if err := stack.Env.Client.Get(ctx, types.NamespacedName{Namespace: "e2e-optout", Name: "optout"}, &pool); err != nil {
		t.Fatal(err)
	}
	if c := pool.Annotations["poolpicker.io/served-by"]; c != "" {
		t.Fatalf("the pool that did not opt in is claimed by %q", c)
	}
	for _, r := range stack.Replicas() {
		if _, ok := replicaMetric(t, r.MetricsAddr, "inference_pool_ready_pods", types.NamespacedName{Namespace: "e2e-optout", Name: "optout"}); ok {
			t.Fatalf("replica %s watches the pool that did not opt in", r.Pod)
		}
	}
}

// The leader is killed (SIGKILL) under traffic on every sample pool: no
// request fails beyond the gateway's retry window, the other replica takes
// the lease and keeps the slices right (the dead replica out, then back in
// once it is restarted and ready).
func TestLeaderKilledUnderTraffic(t *testing.T) {
	all := stack.Replicas()
	slicesList(t, "picker slices listing both replicas", replicaIPs(all...))
	var leader *localstack.Replica
	eventually(t, "exactly one leader", func() bool {
		var leaders []*localstack.Replica
		for _, r := range all {
			if r.Leader() {
				leaders = append(leaders, r)
			}
		}
		if len(leaders) == 1 {
			leader = leaders[0]
		}
		return len(leaders) == 1
	})
	var survivors []*localstack.Replica
	for _, r := range all {
		if r != leader {
			survivors = append(survivors, r)
		}
	}
	before := stack.Gateway.Stats()
	l := startLoad(6, func(w, i int) (string, string) {
		sp := samplePools[w%len(samplePools)]
		return sp.host, completion(sp.model, fmt.Sprintf("leader kill w%d-%d", w, i), 6, i%2 == 0)
	})
	l.waitFor(t, 20)
	killed := time.Now()
	if err := leader.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a new leader", func() bool { return survivors[0].Leader() })
	elected := time.Since(killed)
	slicesList(t, "the new leader's slices without the dead replica", replicaIPs(survivors...))
	l.waitFor(t, 40)
	if err := leader.Process.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	slicesList(t, "the new leader's slices with the restarted replica", replicaIPs(all...))
	l.waitFor(t, 60)
	out := l.stop()
	after, _ := nothingLost(t, "the leader kill", out, before)
	t.Logf("leader %s killed; %s elected after %s; %d requests, none failed; %d held and retried by the gateway",
		leader.Pod, survivors[0].Pod, elected.Round(time.Millisecond), len(out), after.ExtProcRetried-before.ExtProcRetried)
}

// replicaMetricTotal sums every series of a counter on one replica.
func replicaMetricTotal(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("replica metrics: %v", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, m := range fams[name].GetMetric() {
		total += m.GetCounter().GetValue()
	}
	return total
}
