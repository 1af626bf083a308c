// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package controllers

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/poolpicker/poolpicker/api/v1"
	"github.com/poolpicker/poolpicker/controllers/podsource"
	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/testenv"
)

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{name: "zero", opts: Options{}},
		{name: "full multi-pool", opts: Options{Namespaces: []string{"a", "b"}, PoolSelector: "shard in (x,y),!legacy", PickerServices: []string{"epp", "epp-2"}}},
		{name: "single pool", opts: Options{PoolName: "llama", PoolNamespace: "serving"}},
		{name: "single pool, default namespace", opts: Options{PoolName: "llama"}},
		{name: "bad selector", opts: Options{PoolSelector: "shard in (x"}, wantErr: `pool selector "shard in (x"`},
		{name: "bad namespace", opts: Options{Namespaces: []string{"Not_A_Namespace"}}, wantErr: `watch namespace "Not_A_Namespace" is not a valid namespace name`},
		{name: "namespace without name", opts: Options{PoolNamespace: "serving"}, wantErr: "pool namespace is set without a pool name"},
		{name: "bad pool name", opts: Options{PoolName: "Llama!"}, wantErr: `pool name "Llama!" is not a valid object name`},
		{name: "pool outside namespaces", opts: Options{PoolName: "p", PoolNamespace: "x", Namespaces: []string{"y"}}, wantErr: "pool x/p is outside the watched namespaces [y]"},
		{name: "bad pod watch plan", opts: Options{PodWatchPlan: "per-namespace"}, wantErr: `pod watch plan "per-namespace": must be one of [auto per-pool namespace]`},
		{name: "pod watch plans", opts: Options{PodWatchPlan: podsource.PlanNamespace, NamespaceWatchThreshold: 3}},
		{name: "bad service name", opts: Options{PickerServices: []string{"epp.svc"}}, wantErr: `endpoint picker Service name "epp.svc" is not a valid Service name`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
	mgr, err := manager.New(env.Config, manager.Options{Scheme: Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Setup(mgr, Options{}); err == nil || !strings.Contains(err.Error(), "Registry is required") {
		t.Fatalf("Setup without a registry: %v", err)
	}
}

// TestWhichPoolsAreServed starts pickers with different options over the
// same pools and checks which each serves.
func TestWhichPoolsAreServed(t *testing.T) {
	ns1, ns2 := env.Namespace(t, "sel1"), env.Namespace(t, "sel2")
	svc := func(name string) poolOpt { return withPicker(name, 9002) }
	noRef := func(p *v1.InferencePool) { p.Spec.EndpointPickerRef = nil }
	otherKind := func(p *v1.InferencePool) {
		p.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Kind: "Gateway", Name: "gw"}
	}
	otherGroup := func(p *v1.InferencePool) {
		g := v1.Group("example.com")
		p.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Group: &g, Kind: "Service", Name: "epp", Port: &v1.Port{Number: 9002}}
	}
	sel := map[string]string{"app": "m"}
	for _, ns := range []string{ns1, ns2} {
		createPool(t, ns, "epp-a", sel, []int32{8000}, svc("epp"), withLabels(map[string]string{"shard": "a"}))
		createPool(t, ns, "epp-b", sel, []int32{8000}, svc("epp"), withLabels(map[string]string{"shard": "b"}))
		createPool(t, ns, "other-svc", sel, []int32{8000}, svc("other-epp"))
		createPool(t, ns, "no-ref", sel, []int32{8000}, noRef)
		createPool(t, ns, "gateway-kind", sel, []int32{8000}, otherKind)
		createPool(t, ns, "other-group", sel, []int32{8000}, otherGroup)
	}
	all := func(ns string) []string {
		return []string{ns + "/epp-a", ns + "/epp-b", ns + "/no-ref", ns + "/other-svc"}
	}
	cases := []struct {
		name string
		opts Options
		want []string
	}{
		{"defaults: every Service-kind or unset ref", Options{}, append(all(ns1), all(ns2)...)},
		{"picker services", Options{PickerServices: []string{"epp"}}, []string{ns1 + "/epp-a", ns1 + "/epp-b", ns2 + "/epp-a", ns2 + "/epp-b"}},
		{"two picker services", Options{PickerServices: []string{"epp", "other-epp"}, Namespaces: []string{ns2}}, []string{ns2 + "/epp-a", ns2 + "/epp-b", ns2 + "/other-svc"}},
		{"namespace filter", Options{Namespaces: []string{ns2}}, all(ns2)},
		{"pool label selector", Options{PoolSelector: "shard=a"}, []string{ns1 + "/epp-a", ns2 + "/epp-a"}},
		{"pool label selector with set", Options{PoolSelector: "shard in (a,b)", Namespaces: []string{ns1}}, []string{ns1 + "/epp-a", ns1 + "/epp-b"}},
		{"single pool", Options{PoolName: "no-ref", PoolNamespace: ns2}, []string{ns2 + "/no-ref"}},
		{"single pool not served by this picker", Options{PoolName: "other-svc", PoolNamespace: ns1, PickerServices: []string{"epp"}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := start(t, nil, tc.opts)
			r.waitFor(t, "HasSynced", r.parts.InitialSync.HasSynced)
			var got []string
			for _, p := range r.reg.Pools() {
				if p.Key.Namespace == ns1 || p.Key.Namespace == ns2 {
					got = append(got, p.Key.String())
				}
			}
			slices.Sort(got)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("served %v, want %v", got, want)
			}
		})
	}
}

// TestIgnoredPoolLoggedOnce updates an ignored pool several times: the
// reason is logged once, and again only when it changes.
func TestIgnoredPoolLoggedOnce(t *testing.T) {
	ns := env.Namespace(t, "ignored")
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		lines = append(lines, args)
		mu.Unlock()
	}, funcr.Options{})
	count := func(substr string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, l := range lines {
			if strings.Contains(l, substr) {
				n++
			}
		}
		return n
	}
	r := start(t, nil, Options{Namespaces: []string{ns}, Logger: logger})
	reg := r.reg

	key := datastore.PoolKey{Namespace: ns, Name: "pool"}
	createPool(t, ns, "pool", map[string]string{"app": "m"}, []int32{8000}, func(p *v1.InferencePool) {
		p.Spec.EndpointPickerRef = &v1.EndpointPickerRef{Kind: "Gateway", Name: "gw"}
	})
	r.waitFor(t, "the reason logged", func() bool { return count(`kind \"Gateway\"`) == 1 })
	for i := range 3 {
		updatePool(t, key, func(p *v1.InferencePool) { p.Annotations = map[string]string{"touch": fmt.Sprint(i)} })
	}
	updatePool(t, key, func(p *v1.InferencePool) { p.Spec.EndpointPickerRef.Kind = "Backend" })
	r.waitFor(t, "the changed reason logged", func() bool { return count(`kind \"Backend\"`) == 1 })
	if n := count(`kind \"Gateway\"`); n != 1 {
		t.Fatalf("the first reason was logged %d times, want once", n)
	}
	if _, ok := reg.Get(key); ok {
		t.Fatal("an ignored pool is served")
	}
}

// TestPodRequestsAreScoped records every request the picker sends to the
// API server while it serves pools in two namespaces, changes a selector and
// drops a pool: each pod request must be namespaced and, in the per-pool
// plan, carry the selector of a pool of that namespace. In the namespace
// plan a namespace is listed once, and a selector change is a re-filter on
// this side that sends nothing.
func TestPodRequestsAreScoped(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns1, ns2 := env.Namespace(t, "scope1"), env.Namespace(t, "scope2")
		// Each namespace's pods have IPs of their own, as live pods do: an
		// IP two namespaces' pods claim is held by the newer pod only.
		for i, ns := range []string{ns1, ns2} {
			createPod(t, ns, "a", map[string]string{"app": "a"}, ready(fmt.Sprintf("10.11.%d.1", i)))
			createPod(t, ns, "b", map[string]string{"app": "b"}, ready(fmt.Sprintf("10.11.%d.2", i)))
			createPod(t, ns, "unrelated", map[string]string{"app": "z"}, ready(fmt.Sprintf("10.11.%d.3", i)))
		}
		var log testenv.RequestLog
		r := start(t, log.Wrap(env.Config), Options{PodWatchPlan: plan, Namespaces: []string{ns1, ns2}})
		k1, k2 := datastore.PoolKey{Namespace: ns1, Name: "pool"}, datastore.PoolKey{Namespace: ns2, Name: "pool"}
		createPool(t, ns1, "pool", map[string]string{"app": "a"}, []int32{8000})
		createPool(t, ns2, "pool", map[string]string{"app": "b"}, []int32{8000})
		r.waitEndpoints(t, k1, "10.11.0.1:8000")
		r.waitEndpoints(t, k2, "10.11.1.2:8000")
		updatePool(t, k1, func(p *v1.InferencePool) {
			p.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": "b"}
		})
		r.waitEndpoints(t, k1, "10.11.0.2:8000")
		deletePool(t, k2)
		r.waitGone(t, k2)
		r.stop(t)

		allowed := map[string][]string{ns1: {"app=a", "app=b"}, ns2: {"app=b"}}
		// One initial list (or streaming-list watch) per watch started: two
		// pools and a selector change.
		wantLists := 3
		if plan == podsource.PlanNamespace {
			allowed = map[string][]string{ns1: {""}, ns2: {""}}
			wantLists = 2
		}
		podPath := regexp.MustCompile(`^/api/v1/namespaces/([^/]+)/pods$`)
		lists := 0
		for _, req := range log.Requests() {
			if !strings.Contains(req.URL.Path, "/pods") {
				continue
			}
			if !req.IsWatch() || req.URL.Query().Get("sendInitialEvents") == "true" {
				lists++
			}
			m := podPath.FindStringSubmatch(req.URL.Path)
			if m == nil || req.Method != "GET" {
				t.Errorf("pod request not a namespaced list/watch: %s %s", req.Method, req.URL)
				continue
			}
			sel := req.URL.Query().Get("labelSelector")
			if !slices.Contains(allowed[m[1]], sel) {
				t.Errorf("pod request in %s with selector %q, want one of %v: %s", m[1], sel, allowed[m[1]], req.URL)
			}
		}
		if lists != wantLists {
			t.Fatalf("saw %d pod lists, want %d (one per watch)", lists, wantLists)
		}
	})
}

// TestPlainListWithoutStreamingLists runs the pod watches as a server
// without streaming lists would have them: a paged list, then a watch from
// its version.
func TestPlainListWithoutStreamingLists(t *testing.T) {
	eachPlan(t, func(t *testing.T, plan podsource.Plan) {
		ns := env.Namespace(t, "plainlist")
		sel := map[string]string{"app": "m"}
		createPod(t, ns, "a", sel, ready("10.13.0.1"))
		var log testenv.RequestLog
		r := start(t, log.Wrap(env.Config), Options{PodWatchPlan: plan, Namespaces: []string{ns}, DisableStreamingLists: true})
		key := datastore.PoolKey{Namespace: ns, Name: "pool"}
		createPool(t, ns, "pool", sel, []int32{8000})
		r.waitEndpoints(t, key, "10.13.0.1:8000")
		createPod(t, ns, "b", sel, ready("10.13.0.2"))
		r.waitEndpoints(t, key, "10.13.0.1:8000", "10.13.0.2:8000")
		deletePod(t, ns, "a")
		r.waitEndpoints(t, key, "10.13.0.2:8000")

		var lists, watches int
		for _, req := range log.Requests() {
			if !strings.HasSuffix(req.URL.Path, "/namespaces/"+ns+"/pods") {
				continue
			}
			q := req.URL.Query()
			if want := watchedSelector(plan, "app=m"); q.Get("labelSelector") != want {
				t.Errorf("pod request with selector %q, want %q: %s", q.Get("labelSelector"), want, req.URL)
			}
			if req.IsWatch() {
				watches++
				if q.Get("sendInitialEvents") != "" || q.Get("resourceVersion") == "" {
					t.Errorf("watch after a plain list is not from the list's version: %s", req.URL)
				}
			} else {
				lists++
			}
		}
		if lists != 1 || watches < 1 {
			t.Fatalf("%d lists and %d watches, want 1 list then watches", lists, watches)
		}
	})
}
