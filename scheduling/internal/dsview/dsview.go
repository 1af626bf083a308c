// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Package dsview shows the datastore's pools, endpoints and scrapes to
// plugins as the framework's read-only views: the scheduler's adapter
// between two packages that import nothing of each other. A view is the
// datastore object's pointer in an interface (or, for a scrape, the same
// pointer read as a framework.Scrape), so handing views to plugins costs
// the pick path no copy and no allocation.
package dsview

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
	"github.com/poolpicker/poolpicker/scheduling/framework"
)

// Pool is the view of p; nil for a nil p.
func Pool(p *datastore.Pool) framework.Pool {
	if p == nil {
		return nil
	}
	return pool{p}
}

// Endpoint is the view of e; nil for a nil e.
func Endpoint(e *datastore.Endpoint) framework.Endpoint {
	if e == nil {
		return nil
	}
	return endpoint{e}
}

// Endpoints are the views of eps, nil when there are none.
func Endpoints(eps []*datastore.Endpoint) []framework.Endpoint {
	if len(eps) == 0 {
		return nil
	}
	out := make([]framework.Endpoint, len(eps))
	for i, e := range eps {
		out[i] = endpoint{e}
	}
	return out
}

// EndpointSet is the view of s.
func EndpointSet(s *datastore.EndpointSet) framework.EndpointSet { return endpointSet{s} }

// Metrics is the view of m (nil: the zero view). datastore.Metrics and
// framework.Scrape have the same fields in the same order, which this
// conversion checks at compile time: a field added to one and not the
// other fails the build here.
func Metrics(m *datastore.Metrics) framework.Metrics {
	return framework.MetricsOf((*framework.Scrape)(m))
}

type pool struct{ p *datastore.Pool }

func (p pool) Key() framework.PoolKey { return p.p.Key }

func (p pool) Annotations() map[string]string {
	if s := p.p.Spec(); s != nil {
		return s.Annotations
	}
	return nil
}

func (p pool) Endpoints() framework.EndpointSet { return endpointSet{p.p.Endpoints()} }
func (p pool) Synced() bool                     { return p.p.Synced() }
func (p pool) Removed() bool                    { return p.p.Removed() }
func (p pool) Requests() uint64                 { return p.p.Requests() }
func (p pool) LastRequest() time.Time           { return p.p.LastRequest() }

type endpoint struct{ e *datastore.Endpoint }

func (e endpoint) Address() string            { return e.e.Address }
func (e endpoint) IP() string                 { return e.e.IP }
func (e endpoint) Port() int32                { return e.e.Port }
func (e endpoint) Pod() types.NamespacedName  { return e.e.Pod }
func (e endpoint) PodUID() types.UID          { return e.e.PodUID }
func (e endpoint) Labels() map[string]string  { return e.e.Labels }
func (e endpoint) Key() framework.EndpointKey { return framework.EndpointKey(e.e.Key()) }
func (e endpoint) Metrics() framework.Metrics { return Metrics(e.e.Metrics()) }
func (e endpoint) InFlight() int64            { return e.e.InFlight() }

type endpointSet struct{ s *datastore.EndpointSet }

func (s endpointSet) Len() int                    { return s.s.Len() }
func (s endpointSet) At(i int) framework.Endpoint { return endpoint{s.s.Endpoints[i]} }

func (s endpointSet) Get(address string) (framework.Endpoint, bool) {
	e, ok := s.s.Get(address)
	if !ok {
		return nil, false
	}
	return endpoint{e}, true
}
