// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/devgateway"
)

func TestRoutedPools(t *testing.T) {
	pool := func(name, ns string) httpBackendRef {
		return httpBackendRef{Group: "inference.networking.k8s.io", Kind: "InferencePool", Name: name, Namespace: ns}
	}
	tests := []struct {
		name string
		refs [][]httpBackendRef
		want []datastore.PoolKey
	}{
		{"a pool of the route's namespace", [][]httpBackendRef{{pool("chat", "")}}, []datastore.PoolKey{{Namespace: "apps", Name: "chat"}}},
		{"a pool of another namespace", [][]httpBackendRef{{pool("chat", "models")}}, []datastore.PoolKey{{Namespace: "models", Name: "chat"}}},
		{"each pool once across rules", [][]httpBackendRef{{pool("chat", ""), pool("code", "")}, {pool("chat", "apps")}},
			[]datastore.PoolKey{{Namespace: "apps", Name: "chat"}, {Namespace: "apps", Name: "code"}}},
		{"a Service (the default kind) is no pool", [][]httpBackendRef{{{Name: "chat"}}}, nil},
		{"the core group with kind InferencePool is no pool", [][]httpBackendRef{{{Kind: "InferencePool", Name: "chat"}}}, nil},
		{"the alpha group's pools are not served here", [][]httpBackendRef{{{Group: "inference.networking.x-k8s.io", Kind: "InferencePool", Name: "chat"}}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &httpRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "r"}}
			for _, refs := range tt.refs {
				r.Spec.Rules = append(r.Spec.Rules, httpRouteRule{BackendRefs: refs})
			}
			if got := routedPools(r); !slices.Equal(got, tt.want) {
				t.Errorf("routedPools = %v, want %v", got, tt.want)
			}
		})
	}
}

// The cache keeps of a route its identity and its pool backendRefs only.
func TestLeanRouteKeepsOnlyPoolBackends(t *testing.T) {
	r := &httpRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "r", Generation: 3, ResourceVersion: "7",
		Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 4096)},
		Labels:      map[string]string{"team": "a"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	r.Spec.Rules = []httpRouteRule{
		{BackendRefs: []httpBackendRef{{Name: "svc"}}},
		{BackendRefs: []httpBackendRef{{Name: "svc"}, {Group: "inference.networking.k8s.io", Kind: "InferencePool", Name: "chat"}}},
	}
	out, err := leanRoute(r)
	if err != nil {
		t.Fatal(err)
	}
	lean := out.(*httpRoute)
	if lean.Annotations != nil || lean.Labels != nil || lean.ManagedFields != nil {
		t.Errorf("metadata beyond identity kept: %+v", lean.ObjectMeta)
	}
	if lean.Name != "r" || lean.Namespace != "apps" || lean.Generation != 3 || lean.ResourceVersion != "7" {
		t.Errorf("identity lost: %+v", lean.ObjectMeta)
	}
	if got, want := routedPools(lean), routedPools(r); !slices.Equal(got, want) || len(lean.Spec.Rules) != 1 || len(lean.Spec.Rules[0].BackendRefs) != 1 {
		t.Errorf("rules %+v, want the one pool backendRef (%v)", lean.Spec.Rules, want)
	}
}

// Without the HTTPRoute CRD the picker starts and serves, saying once that
// it reads no routes; with it, a pool that an HTTPRoute sends traffic to
// (from its own namespace or another) but that lacks the opt-in label gets a
// Warning Event naming the label and the routes, while the pool the picker
// serves, and a pool only named by a route's Service backend, get none.
func TestHTTPRouteToUnservedPoolWarns(t *testing.T) {
	ns := env.Namespace(t, "routes")
	other := env.Namespace(t, "routes-other")
	name := uniquePickerName("routes")
	lbls := map[string]string{"app": "m"}
	createPool(t, ns, "served", lbls, []int32{8000}, withLabels(map[string]string{PickerLabel: name}))
	createPool(t, ns, "unserved", lbls, []int32{8000})
	createPool(t, ns, "service-named", lbls, []int32{8000})
	opts := haOptions(name, ns, ns, other)
	opts.ProvisionPickerServices = false
	opts.PoolSelector = PickerLabel + "=" + name

	t.Run("without the HTTPRoute CRD", func(t *testing.T) {
		if ok, err := servesHTTPRoutes(mustMapper(t)); err != nil || ok {
			t.Fatalf("the control plane serves HTTPRoutes (%v, %v) before the test installs them", ok, err)
		}
		lines := &logLines{}
		o := opts
		o.Logger = lines.logger(2)
		r := start(t, nil, o)
		r.waitFor(t, "the initial sync", r.parts.InitialSync.HasSynced)
		r.waitFor(t, "the labelled pool served", func() bool {
			_, ok := r.reg.Get(datastore.PoolKey{Namespace: ns, Name: "served"})
			return ok
		})
		var said []string
		for _, l := range lines.all() {
			if strings.Contains(l, "serves no HTTPRoutes") {
				said = append(said, l)
			}
		}
		if len(said) != 1 {
			t.Errorf("%d lines say HTTPRoutes are not served, want 1: %q", len(said), said)
		}
		r.stop(t)
	})

	dir, err := devgateway.CRDDir(ctx(t), env.Root)
	if err != nil {
		t.Fatal(err)
	}
	crds, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join(dir, "gateway.networking.k8s.io_httproutes.yaml")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := envtest.UninstallCRDs(env.Config, envtest.CRDInstallOptions{CRDs: crds}); err != nil {
			t.Errorf("removing the HTTPRoute CRD: %v", err)
		}
	})
	poolRef := func(name, namespace string) any {
		ref := map[string]any{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": name}
		if namespace != "" {
			ref["namespace"] = namespace
		}
		return ref
	}
	createRoute(t, ns, "chat", []any{poolRef("unserved", ""), poolRef("served", "")}, []any{map[string]any{"name": "service-named", "port": int64(80)}})
	createRoute(t, other, "cross", []any{poolRef("unserved", ns)})

	r := start(t, nil, opts)
	r.waitFor(t, "the Lease", r.parts.Leader.IsLeader)
	waitClaim(t, r, datastore.PoolKey{Namespace: ns, Name: "served"}, ns+"/"+name)
	notes := func(pool string) []string {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx(t), &evs, client.InNamespace(ns)); err != nil {
			return nil
		}
		var out []string
		for _, e := range evs.Items {
			if e.Reason == "PoolNotServed" && e.Regarding.Name == pool {
				out = append(out, e.Note)
			}
		}
		return out
	}
	r.waitFor(t, "a PoolNotServed Event on the unserved pool", func() bool { return len(notes("unserved")) > 0 })
	note := notes("unserved")[0]
	for _, want := range []string{PickerLabel, "HTTPRoute chat", "HTTPRoute " + other + "/cross"} {
		if !strings.Contains(note, want) {
			t.Errorf("the Event %q does not name %q", note, want)
		}
	}
	for _, pool := range []string{"served", "service-named"} {
		if got := notes(pool); len(got) > 0 {
			t.Errorf("pool %s got PoolNotServed Events: %q", pool, got)
		}
	}
}

// mustMapper is a REST mapper of the control plane, as a manager makes.
func mustMapper(t *testing.T) meta.RESTMapper {
	t.Helper()
	hc, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	m, err := apiutil.NewDynamicRESTMapper(env.Config, hc)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// createRoute creates an HTTPRoute with one rule per backendRefs list.
func createRoute(t *testing.T, ns, name string, rules ...[]any) {
	t.Helper()
	var rs []any
	for _, refs := range rules {
		rs = append(rs, map[string]any{"backendRefs": refs})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": httpRouteGroupVersion.String(), "kind": "HTTPRoute",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     map[string]any{"rules": rs},
	}}
	if err := env.Client.Create(context.Background(), u); err != nil {
		t.Fatalf("create HTTPRoute %s/%s: %v", ns, name, err)
	}
}
