// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package framework

import (
	"iter"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Plugins see pools and endpoints through the read-only views below, which
// this package owns: the scheduler adapts its own objects to them (package
// scheduling), and package frameworktest builds them for a plugin's tests.
// What a plugin may not change (the pods of a pool, an endpoint's metrics or
// in-flight count, a pool's sync state), it cannot reach. A host implements
// Endpoint, EndpointSet and Pool with pointer-shaped, comparable types, so
// handing views to plugins costs the pick path no allocation. The values a
// getter returns (a scrape, a label map) are shared with every other reader
// and must not be modified.

// PoolKey is the namespace/name of an InferencePool.
type PoolKey = types.NamespacedName

// EndpointKey identifies an endpoint across snapshots: a pod (by UID) and a
// target port.
type EndpointKey struct {
	UID  types.UID
	Port int32
}

// Endpoint is a read-only view of one endpoint of a pool: one target port
// of one ready pod. Views of one endpoint object are ==.
type Endpoint interface {
	// Address is "ip:port", the value sent to the gateway.
	Address() string
	// IP is the pod IP.
	IP() string
	// Port is the target port.
	Port() int32
	// Pod is the namespace/name of the pod.
	Pod() types.NamespacedName
	// PodUID tells a recreated pod with the same name apart.
	PodUID() types.UID
	// Labels are the pod's labels; shared, never to be modified.
	Labels() map[string]string
	// Key identifies the endpoint across snapshots: the pod UID and the
	// port.
	Key() EndpointKey
	// Metrics returns the endpoint's latest scrape; IsZero when it was never
	// scraped. A Candidate's Metrics is this one when it is fresh enough to
	// schedule on.
	Metrics() Metrics
	// InFlight is the number of requests the picker sent to the endpoint
	// and has not yet seen finish; it moves while a plugin reads it.
	InFlight() int64
}

// EndpointSet is a read-only view of a pool's endpoint snapshot, sorted by
// address. Two views are == when they view the same snapshot, so a plugin
// may cache what it derived from one and check it with ==.
type EndpointSet interface {
	// Len is the number of endpoints.
	Len() int
	// At returns the i-th endpoint, 0 <= i < Len().
	At(i int) Endpoint
	// Get returns the endpoint with address "ip:port", if in the set.
	Get(address string) (Endpoint, bool)
}

// All yields each endpoint of s with its position, in order; nothing for a
// nil s.
func All(s EndpointSet) iter.Seq2[int, Endpoint] {
	return func(yield func(int, Endpoint) bool) {
		if s == nil {
			return
		}
		for i := range s.Len() {
			if !yield(i, s.At(i)) {
				return
			}
		}
	}
}

// Pool is a read-only view of one served InferencePool. Views of one pool
// are ==, so a plugin keeps per-pool state in a map keyed by Pool; a pool
// removed and added again is another pool.
type Pool interface {
	// Key is the pool's namespace/name.
	Key() PoolKey
	// Annotations are the pool object's annotations; shared, never to be
	// modified.
	Annotations() map[string]string
	// Endpoints returns the pool's current endpoint snapshot.
	Endpoints() EndpointSet
	// Synced reports whether the pool's pod watch has listed at least once.
	Synced() bool
	// Removed reports whether the pool has left the registry: a plugin
	// holding state for it may drop it.
	Removed() bool
	// Requests is the number of requests recorded for the pool.
	Requests() uint64
	// LastRequest is when a request for the pool was last recorded (to
	// within 100 ms); zero when none was.
	LastRequest() time.Time
}

// Scrape is one scrape of a model server, immutable once published: the
// values a Metrics view reads. The scheduler's own scrape record has these
// fields in this order, so it shows one to plugins without a copy.
type Scrape struct {
	// WaitingRequests is the number of requests queued in the server.
	WaitingRequests int
	// RunningRequests is the number of requests the server is decoding.
	RunningRequests int
	// KVCacheUsage is the fraction of KV-cache blocks in use, 0..1.
	KVCacheUsage float64
	// RunningAdapters are the LoRA adapters the server is running requests for.
	RunningAdapters []string
	// WaitingAdapters are the LoRA adapters requests are queued for.
	WaitingAdapters []string
	// MaxAdapters is how many adapters the server can hold at once; 0 unknown.
	MaxAdapters int
	// BlockSize is the number of tokens per KV-cache block; 0 unknown.
	BlockSize int
	// NumBlocks is the number of KV-cache blocks of the server; 0 unknown.
	NumBlocks int
	// PrefixCacheQueries and PrefixCacheHits are the server's counters of
	// prompt tokens looked up in its prefix cache and found there, since
	// it started. Both 0: unknown.
	PrefixCacheQueries float64
	PrefixCacheHits    float64
	// ScrapedAt is when the scrape finished.
	ScrapedAt time.Time
	// Interval is the time until the server's next scrape when these values
	// were published; zero means the refresh interval.
	Interval time.Duration
}

// Metrics is a read-only view of one scrape of a model server. The zero
// Metrics is the view of no scrape (load unknown, never zero): IsZero
// reports it, and its other getters must not be called. Views of one
// scrape are ==.
type Metrics struct{ s *Scrape }

// MetricsOf returns the view of s (nil: the zero view).
func MetricsOf(s *Scrape) Metrics { return Metrics{s: s} }

// IsZero reports whether the view is of no scrape.
func (m Metrics) IsZero() bool { return m.s == nil }

// WaitingRequests is the number of requests queued in the server.
func (m Metrics) WaitingRequests() int { return m.s.WaitingRequests }

// RunningRequests is the number of requests the server is decoding.
func (m Metrics) RunningRequests() int { return m.s.RunningRequests }

// KVCacheUsage is the fraction of KV-cache blocks in use, 0..1.
func (m Metrics) KVCacheUsage() float64 { return m.s.KVCacheUsage }

// HasAdapter reports whether the LoRA adapter is running or waiting on the
// server.
func (m Metrics) HasAdapter(name string) (running, waiting bool) {
	for _, a := range m.s.RunningAdapters {
		if a == name {
			running = true
			break
		}
	}
	for _, a := range m.s.WaitingAdapters {
		if a == name {
			waiting = true
			break
		}
	}
	return running, waiting
}

// NumRunningAdapters is the number of LoRA adapters the server is running
// requests for.
func (m Metrics) NumRunningAdapters() int { return len(m.s.RunningAdapters) }

// RunningAdapter is the i-th running adapter, 0 <= i < NumRunningAdapters().
func (m Metrics) RunningAdapter(i int) string { return m.s.RunningAdapters[i] }

// NumWaitingAdapters is the number of LoRA adapters requests are queued for.
func (m Metrics) NumWaitingAdapters() int { return len(m.s.WaitingAdapters) }

// WaitingAdapter is the i-th waiting adapter, 0 <= i < NumWaitingAdapters().
func (m Metrics) WaitingAdapter(i int) string { return m.s.WaitingAdapters[i] }

// MaxAdapters is how many adapters the server can hold at once; 0 unknown.
func (m Metrics) MaxAdapters() int { return m.s.MaxAdapters }

// BlockSize is the number of tokens per KV-cache block; 0 unknown.
func (m Metrics) BlockSize() int { return m.s.BlockSize }

// NumBlocks is the number of KV-cache blocks of the server; 0 unknown.
func (m Metrics) NumBlocks() int { return m.s.NumBlocks }

// PrefixCacheQueries is the server's count of prompt tokens looked up in its
// prefix cache since it started; 0: unknown.
func (m Metrics) PrefixCacheQueries() float64 { return m.s.PrefixCacheQueries }

// PrefixCacheHits is the server's count of prompt tokens found in its prefix
// cache since it started; 0 with PrefixCacheQueries 0: unknown.
func (m Metrics) PrefixCacheHits() float64 { return m.s.PrefixCacheHits }

// ScrapedAt is when the scrape finished.
func (m Metrics) ScrapedAt() time.Time { return m.s.ScrapedAt }

// Interval is the time until the server's next scrape when these values
// were published; zero means the refresh interval.
func (m Metrics) Interval() time.Duration { return m.s.Interval }
