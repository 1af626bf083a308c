// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/api/v1alpha2"
	"github.com/poolpicker/poolpicker/datastore"
)

var pickerSeq atomic.Int64

func uniquePickerName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, pickerSeq.Add(1))
}

// haOptions are the options of one replica of a replicated deployment.
func haOptions(name, pickerNS string, namespaces ...string) Options {
	return Options{
		Namespaces: namespaces, PickerName: name, PickerNamespace: pickerNS, PickerPort: 9002,
		ProvisionPickerServices: true, LeaderElection: true,
		// A renew deadline of seconds, so that a busy test machine's slow
		// answer does not depose the leader; a stopped leader releases the
		// Lease, so the other still takes over within one retry period.
		LeaseDuration: 10 * time.Second, RenewDeadline: 8 * time.Second, RetryPeriod: 200 * time.Millisecond,
	}
}

// sliceIPs returns the addresses of the picker slice of a Service, nil when
// there is none.
func sliceIPs(t *testing.T, ns, service, picker string) []string {
	var s discoveryv1.EndpointSlice
	if err := env.Client.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: service + "-" + picker}, &s); err != nil {
		return nil
	}
	out := []string{}
	for _, e := range s.Endpoints {
		if e.Conditions.Ready != nil && *e.Conditions.Ready {
			out = append(out, e.Addresses...)
		}
	}
	slices.Sort(out)
	return out
}

func leaseHolder(t *testing.T, ns, name string) string {
	var l coordinationv1.Lease
	if err := env.Client.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: name}, &l); err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// hasEvent reports whether an Event with reason regards the pool.
func hasEvent(t *testing.T, key datastore.PoolKey, reason, mentions string) bool {
	var evs eventsv1.EventList
	if err := env.Client.List(ctx(t), &evs, client.InNamespace(key.Namespace)); err != nil {
		return false
	}
	for _, e := range evs.Items {
		if e.Reason == reason && e.Regarding.Name == key.Name && strings.Contains(e.Note, mentions) {
			return true
		}
	}
	return false
}

// Two replicas elect one leader with a Lease; it provisions a picker Service
// and EndpointSlice in each pool's namespace listing the ready replicas,
// which follow replicas turning unready and new ones; when the leader stops,
// the other takes the Lease over and keeps the slices right.
func TestLeaderProvisionsPickerServices(t *testing.T) {
	pickerNS, nsA, nsB := env.Namespace(t, "ppsys"), env.Namespace(t, "team-a"), env.Namespace(t, "team-b")
	name := uniquePickerName("ha")
	self := map[string]string{PickerLabel: name}
	p1 := createPod(t, pickerNS, "picker-1", self, podState{ip: "10.30.0.1", ready: true})
	createPod(t, pickerNS, "picker-2", self, podState{ip: "10.30.0.2", ready: true})
	createPod(t, pickerNS, "stranger", map[string]string{PickerLabel: "other"}, podState{ip: "10.30.0.99", ready: true})
	lbls := map[string]string{"app": "m"}
	createPod(t, nsA, "server", lbls, podState{ip: "10.31.0.1", ready: true})
	poolA := createPool(t, nsA, "chat", lbls, []int32{8000}, withPicker("epp-chat", 9002))
	createPool(t, nsB, "code", lbls, []int32{8000}, withPicker("epp-code", 9102))

	r1 := start(t, nil, haOptions(name, pickerNS, nsA, nsB))
	r2 := start(t, nil, haOptions(name, pickerNS, nsA, nsB))
	var leader, follower *running
	r1.waitFor(t, "a leader", func() bool { return r1.parts.Leader.IsLeader() || r2.parts.Leader.IsLeader() })
	leader, follower = r1, r2
	if r2.parts.Leader.IsLeader() {
		leader, follower = r2, r1
	}
	if follower.parts.Leader.IsLeader() {
		t.Fatal("two leaders")
	}
	holder := leaseHolder(t, pickerNS, name)
	if holder == "" {
		t.Fatal("no Lease holder")
	}
	// Both replicas serve the data plane.
	for _, r := range []*running{r1, r2} {
		r.waitEndpoints(t, datastore.PoolKey{Namespace: nsA, Name: "chat"}, "10.31.0.1:8000")
	}

	want := []string{"10.30.0.1", "10.30.0.2"}
	leader.waitFor(t, "slices listing both replicas", func() bool {
		return slices.Equal(sliceIPs(t, nsA, "epp-chat", name), want) && slices.Equal(sliceIPs(t, nsB, "epp-code", name), want)
	})
	var svc corev1.Service
	if err := env.Client.Get(ctx(t), client.ObjectKey{Namespace: nsA, Name: "epp-chat"}, &svc); err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.Selector) != 0 || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9002 ||
		svc.Spec.Ports[0].AppProtocol == nil || *svc.Spec.Ports[0].AppProtocol != "kubernetes.io/h2c" {
		t.Fatalf("picker Service spec %+v", svc.Spec)
	}
	if len(svc.OwnerReferences) != 1 || svc.OwnerReferences[0].UID != poolA.UID || svc.OwnerReferences[0].Kind != "InferencePool" {
		t.Fatalf("picker Service owners %+v, want the pool", svc.OwnerReferences)
	}
	var slice discoveryv1.EndpointSlice
	if err := env.Client.Get(ctx(t), client.ObjectKey{Namespace: nsB, Name: "epp-code-" + name}, &slice); err != nil {
		t.Fatal(err)
	}
	if slice.Labels[discoveryv1.LabelServiceName] != "epp-code" || slice.Labels[discoveryv1.LabelManagedBy] == "endpointslice-controller.k8s.io" ||
		len(slice.Ports) != 1 || *slice.Ports[0].Port != 9002 || *slice.Ports[0].Name != "grpc-ext-proc" {
		t.Fatalf("slice labels %v ports %+v", slice.Labels, slice.Ports)
	}
	if got := leader.metric("poolpicker_leader"); got != 1 {
		t.Fatalf("poolpicker_leader on the leader = %v", got)
	}

	// A replica turning unready leaves the slices.
	setPodStatus(t, p1, "10.30.0.1", false)
	leader.waitFor(t, "the unready replica dropped", func() bool {
		return slices.Equal(sliceIPs(t, nsA, "epp-chat", name), []string{"10.30.0.2"}) && slices.Equal(sliceIPs(t, nsB, "epp-code", name), []string{"10.30.0.2"})
	})

	// The leader goes; the follower takes the Lease and the writing over.
	leader.stop(t)
	follower.waitFor(t, "the follower elected", follower.parts.Leader.IsLeader)
	if h := leaseHolder(t, pickerNS, name); h == holder || h == "" {
		t.Fatalf("Lease holder %q after the leader stopped (was %q)", h, holder)
	}
	setPodStatus(t, p1, "10.30.0.1", true)
	createPod(t, pickerNS, "picker-3", self, podState{ip: "10.30.0.3", ready: true})
	want = []string{"10.30.0.1", "10.30.0.2", "10.30.0.3"}
	follower.waitFor(t, "the new leader's slices", func() bool {
		return slices.Equal(sliceIPs(t, nsA, "epp-chat", name), want) && slices.Equal(sliceIPs(t, nsB, "epp-code", name), want)
	})
}

// A Service poolpicker did not create is never modified: the conflict is
// reported on the pool (Event, metric) and no slice is written for it.
func TestForeignPickerServiceLeftAlone(t *testing.T) {
	pickerNS, ns := env.Namespace(t, "ppsys"), env.Namespace(t, "team")
	name := uniquePickerName("foreign")
	createPod(t, pickerNS, "picker-1", map[string]string{PickerLabel: name}, podState{ip: "10.32.0.1", ready: true})
	mine := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "epp", Labels: map[string]string{"team": "mine"}},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "my-picker"}, Ports: []corev1.ServicePort{{Name: "grpc", Port: 9002}}},
	}
	if err := env.Client.Create(ctx(t), mine); err != nil {
		t.Fatal(err)
	}
	lbls := map[string]string{"app": "m"}
	createPool(t, ns, "pool", lbls, []int32{8000}, withPicker("epp", 9002))
	key := datastore.PoolKey{Namespace: ns, Name: "pool"}
	opts := haOptions(name, pickerNS, ns)
	opts.LeaderElection = false
	r := start(t, nil, opts)
	r.waitFor(t, "the conflict reported", func() bool {
		return r.metric("poolpicker_pool_conflicts", ns, "pool", "Service") == 1 &&
			hasEvent(t, key, "PickerServiceConflict", "was not created by poolpicker")
	})
	var after corev1.Service
	if err := env.Client.Get(ctx(t), client.ObjectKeyFromObject(mine), &after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != mine.ResourceVersion {
		t.Fatalf("the foreign Service was modified: %+v", after)
	}
	if ips := sliceIPs(t, ns, "epp", name); ips != nil {
		t.Fatalf("a slice %v was written for a foreign Service", ips)
	}
	// Once the foreign Service is gone, poolpicker provisions its own.
	if err := env.Client.Delete(ctx(t), mine); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "the provisioned Service and slice", func() bool {
		return slices.Equal(sliceIPs(t, ns, "epp", name), []string{"10.32.0.1"}) &&
			r.metric("poolpicker_pool_conflicts", ns, "pool", "Service") == 0
	})
}

// Two deployments (shards) selecting the same pool: the first claims it,
// the later one reports the conflict and does not serve it; when the claim
// is released the later one takes the pool.
func TestShardConflictReported(t *testing.T) {
	ns := env.Namespace(t, "shards")
	lbls := map[string]string{"app": "m"}
	createPod(t, ns, "server", lbls, podState{ip: "10.33.0.1", ready: true})
	createPool(t, ns, "pool", lbls, []int32{8000})
	key := datastore.PoolKey{Namespace: ns, Name: "pool"}
	nameA, nameB := uniquePickerName("shard-a"), uniquePickerName("shard-b")
	a := start(t, nil, Options{Namespaces: []string{ns}, PickerName: nameA, PickerNamespace: "picker-system"})
	a.waitEndpoints(t, key, "10.33.0.1:8000")
	claim := func() string {
		var p v1.InferencePool
		if err := env.Client.Get(ctx(t), key, &p); err != nil {
			return ""
		}
		return p.Annotations[ClaimAnnotation]
	}
	a.waitFor(t, "the first shard's claim", func() bool { return claim() == "picker-system/"+nameA })

	b := start(t, nil, Options{Namespaces: []string{ns}, PickerName: nameB, PickerNamespace: "picker-system"})
	b.waitFor(t, "the later shard reporting the conflict", func() bool {
		return b.metric("poolpicker_pool_conflicts", ns, "pool", "claim") == 1 &&
			hasEvent(t, key, "ClaimedByOtherPicker", "picker-system/"+nameA)
	})
	b.waitFor(t, "the later shard synced", b.parts.InitialSync.HasSynced)
	if _, ok := b.reg.Get(key); ok {
		t.Fatal("the later shard serves a pool claimed by the first")
	}
	if claim() != "picker-system/"+nameA {
		t.Fatalf("claim %q changed", claim())
	}

	// The first shard stops selecting the pool (here: it stops), and its
	// claim is removed by hand, as documented for a removed deployment.
	a.stop(t)
	updatePool(t, key, func(p *v1.InferencePool) { delete(p.Annotations, ClaimAnnotation) })
	b.waitEndpoints(t, key, "10.33.0.1:8000")
	b.waitFor(t, "the later shard's claim", func() bool { return claim() == "picker-system/"+nameB })
}

// Only the leader writes Accepted conditions; a follower publishes the
// policy to its data plane and leaves the objects alone, and writes them
// once it is elected. The leader here watches another namespace, so that
// the objectives are the follower's alone.
func TestOnlyLeaderWritesAccepted(t *testing.T) {
	pickerNS, ns, elsewhere := env.Namespace(t, "ppsys"), env.Namespace(t, "team"), env.Namespace(t, "other")
	name := uniquePickerName("acc")
	leaderOpts, followerOpts := haOptions(name, pickerNS, elsewhere), haOptions(name, pickerNS, ns)
	leaderOpts.ProvisionPickerServices, followerOpts.ProvisionPickerServices = false, false
	leader := start(t, nil, leaderOpts)
	leader.waitFor(t, "the first replica elected", leader.parts.Leader.IsLeader)
	follower := start(t, nil, followerOpts)
	key := datastore.PoolKey{Namespace: ns, Name: "pool"}
	createPool(t, ns, "pool", map[string]string{"app": "m"}, []int32{8000})
	follower.waitEndpoints(t, key)

	batch := objective(ns, "batch", "pool", ptr.To(-1))
	create(t, batch)
	follower.waitPolicy(t, key, &datastore.Policy{Objectives: map[string]int{"batch": -1}, Rewrites: map[string][]datastore.RewriteTarget{}})
	// A second objective published means the reconcile of the first one
	// (which would have written its condition) is over.
	critical := objective(ns, "critical", "pool", ptr.To(10))
	create(t, critical)
	follower.waitPolicy(t, key, &datastore.Policy{Objectives: map[string]int{"batch": -1, "critical": 10}, Rewrites: map[string][]datastore.RewriteTarget{}})
	if follower.parts.Leader.IsLeader() {
		t.Fatal("two leaders")
	}
	for _, o := range []client.Object{batch, critical} {
		if s, why := accepted(t, o); s != "" {
			t.Fatalf("%s has Accepted=%s/%s, written by a follower", o.GetName(), s, why)
		}
	}

	leader.stop(t)
	follower.waitFor(t, "the follower elected", follower.parts.Leader.IsLeader)
	for _, o := range []client.Object{batch, critical} {
		follower.waitAccepted(t, o, metav1.ConditionTrue, v1alpha2.ReasonAccepted)
	}
}

// A pool deleted while another shard holds its claim takes its conflict
// series with it: conflicts of pools that are gone must not accumulate.
func TestConflictForgottenWithPool(t *testing.T) {
	ns := env.Namespace(t, "shardgone")
	lbls := map[string]string{"app": "m"}
	createPod(t, ns, "server", lbls, podState{ip: "10.34.0.1", ready: true})
	createPool(t, ns, "pool", lbls, []int32{8000})
	key := datastore.PoolKey{Namespace: ns, Name: "pool"}
	nameA, nameB := uniquePickerName("shard-a"), uniquePickerName("shard-b")
	a := start(t, nil, Options{Namespaces: []string{ns}, PickerName: nameA, PickerNamespace: "picker-system"})
	a.waitEndpoints(t, key, "10.34.0.1:8000")
	b := start(t, nil, Options{Namespaces: []string{ns}, PickerName: nameB, PickerNamespace: "picker-system"})
	b.waitFor(t, "the later shard reporting the conflict", func() bool {
		return b.metric("poolpicker_pool_conflicts", ns, "pool", "claim") == 1
	})
	deletePool(t, key)
	b.waitFor(t, "the conflict series gone with the pool", func() bool {
		return b.series("poolpicker_pool_conflicts") == 0
	})
}
