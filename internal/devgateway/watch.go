// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package devgateway

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	v1 "github.com/poolpicker/poolpicker/api/v1"
)

// watchRoutes keeps the route table current from the API server: it starts
// a cache of HTTPRoutes and InferencePools, builds the table once both are
// synced, then rebuilds it after every change. It returns when ctx ends;
// ready is closed after the first table is in place.
func (g *Gateway) watchRoutes(ctx context.Context, c cache.Cache, ready chan<- struct{}) error {
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	watched := []client.Object{&gwv1.HTTPRoute{}, &v1.InferencePool{}}
	if g.opts.ResolveThroughEndpointSlices {
		// Read per request by sliceAddrs; synced before the gateway is ready.
		watched = append(watched, &corev1.Service{}, &discoveryv1.EndpointSlice{})
	}
	for _, obj := range watched {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("devgateway: informer for %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("devgateway: event handler for %T: %w", obj, err)
		}
	}
	if !c.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	if err := g.rebuild(ctx, c); err != nil {
		return err
	}
	close(ready)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			if err := g.rebuild(ctx, c); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				g.log.Error(err, "rebuilding routes")
			}
		}
	}
}

func (g *Gateway) rebuild(ctx context.Context, c client.Reader) error {
	var routes gwv1.HTTPRouteList
	if err := c.List(ctx, &routes); err != nil {
		return fmt.Errorf("devgateway: listing HTTPRoutes: %w", err)
	}
	var pools v1.InferencePoolList
	if err := c.List(ctx, &pools); err != nil {
		return fmt.Errorf("devgateway: listing InferencePools: %w", err)
	}
	var mine []gwv1.HTTPRoute
	for _, r := range routes.Items {
		if g.attached(&r) {
			mine = append(mine, r)
		}
	}
	t := buildTable(mine, pools.Items)
	if g.opts.Authority != nil {
		for _, pt := range t.pools {
			if pt.service != "" {
				pt.authority = g.opts.Authority(pt.key.Namespace, pt.service, pt.port)
			}
		}
	}
	g.table.Store(t)
	g.log.V(2).Info("routes updated", "routes", len(mine), "matches", len(t.entries), "pools", len(t.pools))
	return nil
}

// attached reports whether a route belongs to this gateway.
func (g *Gateway) attached(r *gwv1.HTTPRoute) bool {
	if g.opts.Gateway.Name == "" {
		return true
	}
	for _, p := range r.Spec.ParentRefs {
		if p.Kind != nil && *p.Kind != "Gateway" {
			continue
		}
		if p.Group != nil && *p.Group != gwv1.GroupName {
			continue
		}
		ns := r.Namespace
		if p.Namespace != nil {
			ns = string(*p.Namespace)
		}
		if string(p.Name) == g.opts.Gateway.Name && ns == g.opts.Gateway.Namespace {
			return true
		}
	}
	return false
}
