// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"fmt"
	"strings"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
)

// limitedUser returns a config acting as a user who may read the pool API
// groups everywhere and record Events, and nothing else: pods only where a
// test grants them with grantPods.
func limitedUser(t *testing.T, name string) *rest.Config {
	t.Helper()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"inference.networking.k8s.io", "inference.networking.x-k8s.io", "llm-d.ai"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: name}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := env.Client.Create(ctx(t), o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx(t), o) })
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: name}
	return cfg
}

// grantPods lets user list and watch the pods of ns.
func grantPods(t *testing.T, user, ns string) {
	t.Helper()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pods"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pods"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pods"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := env.Client.Create(ctx(t), o); err != nil {
			t.Fatal(err)
		}
	}
}

// A pool whose pods the picker may not list is reported (its SyncError, a
// metric, an Event naming the reason) while the picker turns ready and the
// other pool is served; granting the permission heals it.
func TestBrokenPoolLeavesOthersServing(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		good, bad := env.Namespace(t, "blast-good"), env.Namespace(t, "blast-bad")
		user := fmt.Sprintf("picker-%s", bad)
		cfg := limitedUser(t, user)
		grantPods(t, user, good)
		lbls := map[string]string{"app": "m"}
		createPod(t, good, "p1", lbls, podState{ip: "10.14.0.1", ready: true})
		createPod(t, bad, "p1", lbls, podState{ip: "10.14.1.1", ready: true})
		createPool(t, good, "pool", lbls, []int32{8000})
		createPool(t, bad, "pool", lbls, []int32{8000})
		goodKey, badKey := datastore.PoolKey{Namespace: good, Name: "pool"}, datastore.PoolKey{Namespace: bad, Name: "pool"}

		r := start(t, cfg, Options{PodWatchPlan: plan, Namespaces: []string{good, bad}})
		r.waitEndpoints(t, goodKey, "10.14.0.1:8000")
		r.waitFor(t, "the broken pool reported", func() bool {
			p, ok := r.reg.Get(badKey)
			return ok && strings.Contains(p.SyncError(), "forbidden")
		})
		r.waitFor(t, "the picker synced despite the broken pool", r.parts.InitialSync.HasSynced)
		p, _ := r.reg.Get(badKey)
		if p.Synced() || p.Endpoints().Len() != 0 {
			t.Fatalf("broken pool synced %v with %d endpoints", p.Synced(), p.Endpoints().Len())
		}
		if got := r.metric("poolpicker_pool_sync_failing", bad, "pool"); got != 1 {
			t.Fatalf("poolpicker_pool_sync_failing for the broken pool = %v, want 1", got)
		}
		if g, _ := r.reg.Get(goodKey); g.SyncError() != "" {
			t.Fatalf("the good pool reports %q", g.SyncError())
		}
		r.waitFor(t, "a PodsNotListed Event on the broken pool", func() bool {
			var evs eventsv1.EventList
			if err := env.Client.List(ctx(t), &evs, client.InNamespace(bad)); err != nil {
				return false
			}
			for _, e := range evs.Items {
				if e.Reason == "PodsNotListed" && e.Regarding.Name == "pool" && strings.Contains(e.Note, "forbidden") {
					return true
				}
			}
			return false
		})

		grantPods(t, user, bad)
		r.waitEndpoints(t, badKey, "10.14.1.1:8000")
		r.waitFor(t, "the failure cleared", func() bool {
			p, _ := r.reg.Get(badKey)
			return p.SyncError() == "" && r.metric("poolpicker_pool_sync_failing", bad, "pool") == 0
		})
	})
}

// A label key the CRD lets through (as upstream's does) but no label
// selector can hold is reported on the pool (an InvalidSelector Event) and
// never turned into a watch of some other selector; the other pool of the
// namespace is served. Fixing the key serves the pool.
func TestInvalidSelectorKeyReported(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns := env.Namespace(t, "badkey")
		createPod(t, ns, "p1", map[string]string{"app": "m"}, podState{ip: "10.14.2.1", ready: true})
		createPool(t, ns, "good", map[string]string{"app": "m"}, []int32{8000})
		// As a selector string "app,tier=x" would mean "has app, and tier=x".
		bad := createPool(t, ns, "bad", map[string]string{"app,tier": "x"}, []int32{8000})
		r := start(t, nil, Options{PodWatchPlan: plan, Namespaces: []string{ns}})
		r.waitEndpoints(t, datastore.PoolKey{Namespace: ns, Name: "good"}, "10.14.2.1:8000")
		r.waitFor(t, "an InvalidSelector Event on the pool", func() bool {
			var evs eventsv1.EventList
			if err := env.Client.List(ctx(t), &evs, client.InNamespace(ns)); err != nil {
				return false
			}
			for _, e := range evs.Items {
				if e.Reason == "InvalidSelector" && e.Regarding.Name == "bad" && strings.Contains(e.Note, "spec.selector.matchLabels") {
					return true
				}
			}
			return false
		})
		badKey := datastore.PoolKey{Namespace: ns, Name: "bad"}
		if _, served := r.reg.Get(badKey); served {
			t.Fatal("a pool whose selector is invalid is served")
		}

		fixed := bad.DeepCopy()
		fixed.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": "m"}
		// A JSON merge patch replaces the whole map, whatever the picker wrote since.
		if err := env.Client.Patch(ctx(t), fixed, client.MergeFrom(bad)); err != nil {
			t.Fatal(err)
		}
		r.waitEndpoints(t, badKey, "10.14.2.1:8000")
	})
}
