// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package framework

import (
	"iter"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/poolpicker/poolpicker/datastore"
)

// Plugins see pools and endpoints through the read-only views below, never
// the datastore's own objects: what a plugin may not change (the pods of a
// pool, an endpoint's metrics or in-flight count, a pool's sync state), it
// cannot reach. A view is one pointer wide and read through its getters, so
// handing views to plugins costs the pick path nothing: no copy, no
// allocation. The values a getter returns (a metrics snapshot, a spec, a
// label map) are shared with every other reader and must not be modified.

// Endpoint is a read-only view of one endpoint of a pool: one target port
// of one ready pod. The zero Endpoint is the view of no endpoint: IsZero
// reports it, and its getters must not be called.
type Endpoint struct{ e *datastore.Endpoint }

// EndpointOf returns the view of e, for a scheduler handing e to plugins
// and for tests of plugins.
func EndpointOf(e *datastore.Endpoint) Endpoint { return Endpoint{e: e} }

// IsZero reports whether the view is of no endpoint.
func (e Endpoint) IsZero() bool { return e.e == nil }

// Address is "ip:port", the value sent to the gateway.
func (e Endpoint) Address() string { return e.e.Address }

// IP is the pod IP.
func (e Endpoint) IP() string { return e.e.IP }

// Port is the target port.
func (e Endpoint) Port() int32 { return e.e.Port }

// Pod is the namespace/name of the pod.
func (e Endpoint) Pod() types.NamespacedName { return e.e.Pod }

// PodUID tells a recreated pod with the same name apart.
func (e Endpoint) PodUID() types.UID { return e.e.PodUID }

// Labels are the pod's labels; shared, never to be modified.
func (e Endpoint) Labels() map[string]string { return e.e.Labels }

// Key identifies the endpoint across snapshots: the pod UID and the port.
func (e Endpoint) Key() datastore.EndpointKey { return e.e.Key() }

// Metrics returns the endpoint's latest scrape; IsZero when it was never
// scraped. A Candidate's Metrics is this one when it is fresh enough to
// schedule on.
func (e Endpoint) Metrics() Metrics { return Metrics{m: e.e.Metrics()} }

// InFlight is the number of requests poolpicker sent to the endpoint and
// has not yet seen finish; it moves while a plugin reads it.
func (e Endpoint) InFlight() int64 { return e.e.InFlight() }

// Metrics is a read-only view of one scrape of a model server. The zero
// Metrics is the view of no scrape (load unknown, never zero): IsZero
// reports it, and its other getters must not be called.
type Metrics struct{ m *datastore.Metrics }

// MetricsOf returns the view of m (nil: the zero view), for a scheduler
// handing m to plugins and for tests of plugins.
func MetricsOf(m *datastore.Metrics) Metrics { return Metrics{m: m} }

// IsZero reports whether the view is of no scrape.
func (m Metrics) IsZero() bool { return m.m == nil }

// WaitingRequests is the number of requests queued in the server.
func (m Metrics) WaitingRequests() int { return m.m.WaitingRequests }

// RunningRequests is the number of requests the server is decoding.
func (m Metrics) RunningRequests() int { return m.m.RunningRequests }

// KVCacheUsage is the fraction of KV-cache blocks in use, 0..1.
func (m Metrics) KVCacheUsage() float64 { return m.m.KVCacheUsage }

// HasAdapter reports whether the LoRA adapter is running or waiting on the
// server.
func (m Metrics) HasAdapter(name string) (running, waiting bool) { return m.m.HasAdapter(name) }

// NumRunningAdapters is the number of LoRA adapters the server is running
// requests for.
func (m Metrics) NumRunningAdapters() int { return len(m.m.RunningAdapters) }

// RunningAdapter is the i-th running adapter, 0 <= i < NumRunningAdapters().
func (m Metrics) RunningAdapter(i int) string { return m.m.RunningAdapters[i] }

// NumWaitingAdapters is the number of LoRA adapters requests are queued for.
func (m Metrics) NumWaitingAdapters() int { return len(m.m.WaitingAdapters) }

// WaitingAdapter is the i-th waiting adapter, 0 <= i < NumWaitingAdapters().
func (m Metrics) WaitingAdapter(i int) string { return m.m.WaitingAdapters[i] }

// MaxAdapters is how many adapters the server can hold at once; 0 unknown.
func (m Metrics) MaxAdapters() int { return m.m.MaxAdapters }

// BlockSize is the number of tokens per KV-cache block; 0 unknown.
func (m Metrics) BlockSize() int { return m.m.BlockSize }

// NumBlocks is the number of KV-cache blocks of the server; 0 unknown.
func (m Metrics) NumBlocks() int { return m.m.NumBlocks }

// PrefixCacheQueries is the server's count of prompt tokens looked up in its
// prefix cache since it started; 0: unknown.
func (m Metrics) PrefixCacheQueries() float64 { return m.m.PrefixCacheQueries }

// PrefixCacheHits is the server's count of prompt tokens found in its prefix
// cache since it started; 0 with PrefixCacheQueries 0: unknown.
func (m Metrics) PrefixCacheHits() float64 { return m.m.PrefixCacheHits }

// ScrapedAt is when the scrape finished.
func (m Metrics) ScrapedAt() time.Time { return m.m.ScrapedAt }

// Interval is the time until the server's next scrape when these values
// were published; zero means the refresh interval.
func (m Metrics) Interval() time.Duration { return m.m.Interval }

// EndpointSet is a read-only view of a pool's endpoint snapshot, sorted by
// address. Two views are == when they view the same snapshot, so a plugin
// may cache what it derived from one and check it with ==.
type EndpointSet struct{ s *datastore.EndpointSet }

// EndpointSetOf returns the view of s.
func EndpointSetOf(s *datastore.EndpointSet) EndpointSet { return EndpointSet{s: s} }

// Len is the number of endpoints.
func (s EndpointSet) Len() int { return s.s.Len() }

// At returns the i-th endpoint, 0 <= i < Len().
func (s EndpointSet) At(i int) Endpoint { return Endpoint{e: s.s.Endpoints[i]} }

// All yields each endpoint with its position, in order.
func (s EndpointSet) All() iter.Seq2[int, Endpoint] {
	return func(yield func(int, Endpoint) bool) {
		if s.s == nil {
			return
		}
		for i, e := range s.s.Endpoints {
			if !yield(i, Endpoint{e: e}) {
				return
			}
		}
	}
}

// Get returns the endpoint with address "ip:port", if in the set.
func (s EndpointSet) Get(address string) (Endpoint, bool) {
	e, ok := s.s.Get(address)
	return Endpoint{e: e}, ok
}

// Pool is a read-only view of one served InferencePool. Views of one pool
// are ==, so a plugin keeps per-pool state in a map keyed by Pool; a pool
// removed and added again is another pool. The zero Pool is the view of no
// pool: IsZero reports it, and its getters must not be called.
type Pool struct{ p *datastore.Pool }

// PoolOf returns the view of p, for a scheduler handing p to plugins and
// for tests of plugins.
func PoolOf(p *datastore.Pool) Pool { return Pool{p: p} }

// IsZero reports whether the view is of no pool.
func (p Pool) IsZero() bool { return p.p == nil }

// Key is the pool's namespace/name.
func (p Pool) Key() datastore.PoolKey { return p.p.Key }

// Spec returns the pool's current spec; immutable.
func (p Pool) Spec() *datastore.PoolSpec { return p.p.Spec() }

// Endpoints returns the pool's current endpoint snapshot.
func (p Pool) Endpoints() EndpointSet { return EndpointSet{s: p.p.Endpoints()} }

// Synced reports whether the pool's pod watch has listed at least once.
func (p Pool) Synced() bool { return p.p.Synced() }

// Policy returns the pool's objectives and rewrites; immutable, never nil.
func (p Pool) Policy() *datastore.Policy { return p.p.Policy() }

// Removed reports whether the pool has left the registry: a plugin holding
// state for it may drop it.
func (p Pool) Removed() bool { return p.p.Removed() }

// Requests is the number of requests recorded for the pool.
func (p Pool) Requests() uint64 { return p.p.Requests() }

// LastRequest is when a request for the pool was last recorded (to within
// 100 ms); zero when none was.
func (p Pool) LastRequest() time.Time { return p.p.LastRequest() }
