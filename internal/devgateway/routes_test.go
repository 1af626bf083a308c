// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
)

func testPool(ns, name, svc string, port int32) v1.InferencePool {
	return v1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.InferencePoolSpec{
			Selector:          v1.LabelSelector{MatchLabels: map[v1.LabelKey]v1.LabelValue{"app": v1.LabelValue(name)}},
			TargetPorts:       []v1.Port{{Number: 8000}},
			EndpointPickerRef: &v1.EndpointPickerRef{Kind: "Service", Name: v1.ObjectName(svc), Port: &v1.Port{Number: v1.PortNumber(port)}},
		},
	}
}

func poolRef(name string, weight int32) gwv1.HTTPBackendRef {
	return gwv1.HTTPBackendRef{BackendRef: gwv1.BackendRef{
		BackendObjectReference: gwv1.BackendObjectReference{Group: ptr.To(gwv1.Group(PoolGroup)), Kind: ptr.To(gwv1.Kind(PoolKind)), Name: gwv1.ObjectName(name)},
		Weight:                 &weight,
	}}
}

type routeOpt func(*gwv1.HTTPRoute)

func testRoute(ns, name string, age time.Duration, rules []gwv1.HTTPRouteRule, opts ...routeOpt) gwv1.HTTPRoute {
	r := gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(time.Unix(1e9, 0).Add(-age))},
		Spec:       gwv1.HTTPRouteSpec{Rules: rules},
	}
	for _, o := range opts {
		o(&r)
	}
	return r
}

func prefix(p string) []gwv1.HTTPRouteMatch {
	return []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: ptr.To(gwv1.PathMatchPathPrefix), Value: ptr.To(p)}}}
}

func TestRouteTable(t *testing.T) {
	pools := []v1.InferencePool{
		testPool("ns", "a", "epp-a", 9002), testPool("ns", "b", "epp-b", 9002), testPool("ns", "c", "epp-c", 9003),
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "noref"}},
	}
	routes := []gwv1.HTTPRoute{
		testRoute("ns", "catchall", time.Hour, []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{poolRef("a", 1)}}}),
		testRoute("ns", "v1", 0, []gwv1.HTTPRouteRule{{Matches: prefix("/v1"), BackendRefs: []gwv1.HTTPBackendRef{poolRef("b", 1)}}}),
		testRoute("ns", "exact", 0, []gwv1.HTTPRouteRule{{
			Matches:     []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: ptr.To(gwv1.PathMatchExact), Value: ptr.To("/v1/models")}}},
			BackendRefs: []gwv1.HTTPBackendRef{poolRef("c", 1)},
		}}),
		testRoute("ns", "header", 0, []gwv1.HTTPRouteRule{{
			Matches:     []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: ptr.To(gwv1.PathMatchPathPrefix), Value: ptr.To("/v1")}, Headers: []gwv1.HTTPHeaderMatch{{Name: "x-tenant", Value: "gold"}}}},
			BackendRefs: []gwv1.HTTPBackendRef{poolRef("c", 1)},
		}}),
		testRoute("ns", "hosted", 0, []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{poolRef("c", 1)}}},
			func(r *gwv1.HTTPRoute) { r.Spec.Hostnames = []gwv1.Hostname{"*.example.com"} }),
		testRoute("ns", "bad", 0, []gwv1.HTTPRouteRule{
			{Matches: prefix("/svc"), BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: "some-service"}}}}},
			{Matches: prefix("/missing"), BackendRefs: []gwv1.HTTPBackendRef{poolRef("nope", 1)}},
			{Matches: prefix("/noref"), BackendRefs: []gwv1.HTTPBackendRef{poolRef("noref", 1)}},
			{Matches: prefix("/zero"), BackendRefs: []gwv1.HTTPBackendRef{poolRef("a", 0)}},
			{Matches: prefix("/redirect"), BackendRefs: []gwv1.HTTPBackendRef{poolRef("a", 1)}, Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect}}},
			{Matches: prefix("/cross"), BackendRefs: []gwv1.HTTPBackendRef{func() gwv1.HTTPBackendRef {
				r := poolRef("a", 1)
				r.Namespace = ptr.To(gwv1.Namespace("other"))
				return r
			}()}},
			{Matches: []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: ptr.To(gwv1.PathMatchRegularExpression), Value: ptr.To("/re/(")}}}, BackendRefs: []gwv1.HTTPBackendRef{poolRef("a", 1)}},
		}),
	}
	tab := buildTable(routes, pools)
	tests := []struct {
		name, method, host, path string
		header                   map[string]string
		wantPool                 string
		wantCode                 int
		wantMsg                  string
	}{
		{name: "catch-all", path: "/healthz", wantPool: "ns/a"},
		{name: "longest prefix wins", path: "/v1/completions", wantPool: "ns/b"},
		{name: "prefix is per path element", path: "/v1x", wantPool: "ns/a"},
		{name: "exact beats prefix", path: "/v1/models", wantPool: "ns/c"},
		{name: "header match beats plain prefix", path: "/v1/completions", header: map[string]string{"X-Tenant": "gold"}, wantPool: "ns/c"},
		{name: "header value must match", path: "/v1/completions", header: map[string]string{"X-Tenant": "silver"}, wantPool: "ns/b"},
		{name: "hostname beats any host", host: "api.example.com", path: "/v1/completions", wantPool: "ns/c"},
		{name: "wildcard needs a label", host: "example.com", path: "/x", wantPool: "ns/a"},
		{name: "not an InferencePool", path: "/svc", wantCode: 500, wantMsg: "is not an InferencePool"},
		{name: "pool missing", path: "/missing", wantCode: 500, wantMsg: "InferencePool ns/nope not found"},
		{name: "pool without picker", path: "/noref", wantCode: 500, wantMsg: "has no spec.endpointPickerRef"},
		{name: "zero weights", path: "/zero", wantCode: 500, wantMsg: "weight 0"},
		{name: "unsupported filter", path: "/redirect", wantCode: 500, wantMsg: "filter type RequestRedirect is not supported"},
		{name: "cross namespace", path: "/cross", wantCode: 500, wantMsg: "ReferenceGrants are not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := tt.method
			if method == "" {
				method = "POST"
			}
			r := httptest.NewRequest(method, "http://gw"+tt.path, nil)
			if tt.host != "" {
				r.Host = tt.host + ":8080"
			}
			for k, v := range tt.header {
				r.Header.Set(k, v)
			}
			_, pool, err := tab.route(r)
			if tt.wantCode != 0 {
				if err == nil || err.code != tt.wantCode || !strings.Contains(err.msg, tt.wantMsg) {
					t.Fatalf("route = %v, %v; want %d %q", pool, err, tt.wantCode, tt.wantMsg)
				}
				return
			}
			if err != nil || pool.key.String() != tt.wantPool {
				t.Fatalf("route = %v, %v; want pool %s", pool, err, tt.wantPool)
			}
		})
	}
	if a := tab.pools[types.NamespacedName{Namespace: "ns", Name: "c"}].authority; a != "epp-c.ns.svc:9003" {
		t.Fatalf("authority %q, want the kgateway form epp-c.ns.svc:9003", a)
	}
	// No route at all: 404, as Envoy answers.
	empty := buildTable(nil, pools)
	if _, _, err := empty.route(httptest.NewRequest("GET", "http://gw/", nil)); err == nil || err.code != http.StatusNotFound {
		t.Fatalf("empty table: %v", err)
	}
}

func TestRouteWeights(t *testing.T) {
	pools := []v1.InferencePool{testPool("ns", "a", "epp", 9002), testPool("ns", "b", "epp", 9002)}
	tab := buildTable([]gwv1.HTTPRoute{testRoute("ns", "split", 0, []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{poolRef("a", 1), poolRef("b", 3)}}})}, pools)
	counts := map[string]int{}
	const n = 4000
	for range n {
		_, p, err := tab.route(httptest.NewRequest("GET", "http://gw/", nil))
		if err != nil {
			t.Fatal(err)
		}
		counts[p.key.Name]++
	}
	// Expected 1000 for a; the binomial standard deviation is ~27, so ±150
	// fails by chance with probability far below 1e-6.
	if counts["a"] < 850 || counts["a"] > 1150 {
		t.Fatalf("weights 1:3 gave %v", counts)
	}
}
