// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/internal/modelsim"
)

// podNetwork routes the test's pod IPs 10.61.0.N to the loopback addresses
// 127.0.61.N the pickers listen on (slices may not list loopback IPs).
func podNetwork(ip string) string {
	if rest, ok := strings.CutPrefix(ip, "10.61.0."); ok {
		return "127.0.61." + rest
	}
	return ip
}

// With ResolveThroughEndpointSlices the gateway reaches a pool's picker
// through its Service's EndpointSlices, as Envoy's EDS does: streams spread
// over the ready replicas, and a replica that goes away is failed over.
// Each replica here answers with its own model servers, so the server that
// answers tells which replica decided.
func TestResolvesPickersThroughEndpointSlices(t *testing.T) {
	ns := env.Namespace(t, "eds")
	simsA, portA := simGroup(t, 1, fastSim)
	simsB, _ := simGroup(t, 1, fastSim)
	regA, regB := datastore.NewRegistry(), datastore.NewRegistry()
	addPool(regA, ns, "pool", "epp", 9002, simsA)
	addPool(regB, ns, "pool", "epp", 9002, simsB)
	pa := startPicker(t, "127.0.61.2:0", regA)
	_, port, _ := net.SplitHostPort(pa.addr)
	pb := startPicker(t, "127.0.61.3:"+port, regB)
	pickerPort, _ := strconv.Atoi(port)

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "epp"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc-ext-proc", Port: 9002}}},
	}
	// A slice of another Service and an unready endpoint are not used.
	ready := func(v bool) discoveryv1.EndpointConditions { return discoveryv1.EndpointConditions{Ready: ptr.To(v)} }
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "epp-1", Labels: map[string]string{discoveryv1.LabelServiceName: "epp"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.61.0.2"}, Conditions: ready(true)},
			{Addresses: []string{"10.61.0.3"}, Conditions: ready(true)},
			{Addresses: []string{"10.61.0.9"}, Conditions: ready(false)},
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("grpc-ext-proc"), Port: ptr.To(int32(pickerPort))}},
	}
	other := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "other-1", Labels: map[string]string{discoveryv1.LabelServiceName: "other"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.61.0.8"}, Conditions: ready(true)}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("grpc-ext-proc"), Port: ptr.To(int32(pickerPort))}},
	}
	for _, create := range []func() error{
		func() error { return env.Client.Create(context.Background(), svc) },
		func() error { return env.Client.Create(context.Background(), slice) },
		func() error { return env.Client.Create(context.Background(), other) },
	} {
		if err := create(); err != nil {
			t.Fatal(err)
		}
	}
	createPool(t, ns, "pool", "epp", 9002, portA, "")
	createRoute(t, ns, "r", gwv1.HTTPRouteRule{BackendRefs: []gwv1.HTTPBackendRef{poolRef("pool", 1)}})
	g := startGateway(t, ns, Options{ResolveThroughEndpointSlices: true, SliceAddressMap: podNetwork})
	c := newClient(t)

	// HeaderPicker names the replica whose stream decided.
	pickerOf := map[string]string{simsA[0].Addr(): "127.0.61.2:" + port, simsB[0].Addr(): "127.0.61.3:" + port}
	served := map[string]int{}
	for range 8 {
		r := do(t, c, g, "/v1/completions", completion(false), nil)
		if r.code != 200 {
			t.Fatalf("status %d: %s", r.code, r.body)
		}
		server := r.header.Get(modelsim.HeaderServer)
		if got := r.header.Get(HeaderPicker); got != pickerOf[server] {
			t.Fatalf("served by %s, %s names picker %q, want %q", server, HeaderPicker, got, pickerOf[server])
		}
		served[server]++
	}
	if served[simsA[0].Addr()] == 0 || served[simsB[0].Addr()] == 0 || len(served) != 2 {
		t.Fatalf("streams were not spread over both replicas: servers %v", served)
	}

	// Replica A goes away while the slice still lists it: every request
	// fails over to B.
	pa.stop()
	for i := range 6 {
		r := do(t, c, g, "/v1/completions", completion(false), nil)
		if r.code != 200 || r.header.Get(modelsim.HeaderServer) != simsB[0].Addr() {
			t.Fatalf("request %d after replica A stopped: %d from %s: %s", i, r.code, r.header.Get(modelsim.HeaderServer), r.body)
		}
	}
	if got := g.Stats().ExtProcGaveUp; got != 0 {
		t.Fatalf("%d requests gave up", got)
	}
	pb.stop()
}
