// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// pickerAddr returns the picker address of a pool's attempt n: with
// ResolveThroughEndpointSlices, the n-th (round robin) ready endpoint of the
// endpointPickerRef Service's EndpointSlices; else ResolveEPP's address.
// No ready endpoint is errNotReady, which the caller retries within its
// window: a replica set in the middle of a failover.
func (g *Gateway) pickerAddr(pool *poolTarget, n int) (string, error) {
	if !g.opts.ResolveThroughEndpointSlices {
		return g.opts.ResolveEPP(pool.key.Namespace, pool.service, pool.port), nil
	}
	addrs, err := g.sliceAddrs(context.Background(), pool.key.Namespace, pool.service, pool.port)
	if err != nil {
		return "", fmt.Errorf("%w (%w)", errNotReady, err)
	}
	if len(addrs) == 0 {
		return "", fmt.Errorf("%w (no ready endpoint in the EndpointSlices of Service %s/%s port %d)", errNotReady, pool.key.Namespace, pool.service, pool.port)
	}
	return addrs[n%len(addrs)], nil
}

// outageKey is what an outage is recorded against: the picker address, or
// with EndpointSlices the Service, since any of its replicas will do.
func (g *Gateway) outageKey(pool *poolTarget, addr string) string {
	if g.opts.ResolveThroughEndpointSlices {
		return "service " + pool.key.Namespace + "/" + pool.service
	}
	return addr
}

// sliceAddrs resolves a Service port as Envoy's EDS does: the Service's port
// by number gives its name; each EndpointSlice of the Service
// (kubernetes.io/service-name) with a port of that name lists ip:port for
// its ready endpoints. Sorted, without duplicates.
func (g *Gateway) sliceAddrs(ctx context.Context, ns, service string, port int32) ([]string, error) {
	var svc corev1.Service
	if err := g.objects.Get(ctx, client.ObjectKey{Namespace: ns, Name: service}, &svc); err != nil {
		return nil, fmt.Errorf("picker Service %s/%s: %w", ns, service, err)
	}
	portName, found := "", false
	for _, p := range svc.Spec.Ports {
		if p.Port == port {
			portName, found = p.Name, true
			break
		}
	}
	if !found {
		return nil, fmt.Errorf("picker Service %s/%s has no port %d", ns, service, port)
	}
	var list discoveryv1.EndpointSliceList
	if err := g.objects.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: service}); err != nil {
		return nil, err
	}
	var out []string
	for _, s := range list.Items {
		target := int32(0)
		for _, p := range s.Ports {
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			if name == portName && p.Port != nil {
				target = *p.Port
			}
		}
		if target == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				if g.opts.SliceAddressMap != nil {
					a = g.opts.SliceAddressMap(a)
				}
				out = append(out, net.JoinHostPort(a, strconv.Itoa(int(target))))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
