// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package flowcontrol

import (
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/poolpicker/poolpicker/datastore"
)

// Defaults of Options.
const (
	DefaultQueueTTL        = 30 * time.Second
	DefaultMaxBandRequests = 1000
	DefaultMaxBandBytes    = 64 << 20
	DefaultMaxQueuedBytes  = 512 << 20
	DefaultStealBelow      = 1
	// MaxFlowKeyBytes bounds a flow's key (the flow header's value): longer
	// values are refused with 400, so a client cannot make the queue keep
	// arbitrary strings.
	MaxFlowKeyBytes = 256
)

// Options configures a Controller. The zero value of every field means its
// documented default; flags are bound to it in cmd/poolpicker.
type Options struct {
	// EndpointSaturated reports whether an endpoint has no free slot for
	// one more request: the scheduler's saturation detector (scheduling's
	// Scheduler.EndpointSaturated). Required.
	EndpointSaturated func(e *datastore.Endpoint) bool
	// EndpointStartsAtOnce reports whether an endpoint would start one more
	// request at once rather than queue it (scheduling's
	// Scheduler.EndpointStartsAtOnce). With it, a request of a priority
	// below the highest its pool has seen goes only to such an endpoint, so
	// that a server's waiting places are left to the highest band and a
	// request of it waits there behind no lower one. Nil: every band takes
	// any endpoint that is not saturated.
	EndpointStartsAtOnce func(e *datastore.Endpoint) bool
	// PerEndpoint has a request scheduled before it waits, and wait for the
	// endpoint picked for it (Request.Endpoints), counted as load there
	// (datastore.Hold) for the requests scheduled meanwhile.
	// False: a request waits until any endpoint of its pool has a free
	// slot, and is scheduled then (Request.Endpoints empty).
	PerEndpoint bool
	// StealBelow is the in-flight count below which an endpoint with a free
	// slot takes a request that waits for another, busy endpoint (its
	// preferred one, holding its prompt's prefix) while none waits for it.
	// Zero: 1, only an endpoint with nothing in flight. Higher keeps fewer
	// slots idle at the cost of prefix-cache misses.
	StealBelow int
	// StealAfter is how long a request waits for its preferred endpoint
	// before any endpoint with a free slot takes it. Zero: for as long as
	// the preferred endpoint stays busy and no endpoint is idle.
	StealAfter time.Duration

	// QueueTTL is the longest a request waits in a pool's queue; then it is
	// answered 429 (QueueTTLExpired). Zero: 30s.
	QueueTTL time.Duration
	// NoEndpointTTL is the longest a request to a pool without a ready
	// endpoint waits for one (the waiting room); then it is answered 503
	// (NoEndpointsTimeout). Zero: no waiting room; such a request is
	// answered 503 at once, as without flow control.
	NoEndpointTTL time.Duration
	// MaxBandRequests bounds the requests queued in one band of one pool;
	// one more is answered 429 (QueueFull). Zero: 1000.
	MaxBandRequests int
	// MaxBandBytes bounds the request body bytes queued in one band of one
	// pool; one more is answered 429 (QueueFull). Zero: 64 MiB.
	MaxBandBytes int64
	// MaxQueuedBytes bounds the request body bytes queued (and in waiting
	// rooms) over every pool of the process, shared fairly between
	// namespaces and pools (FairShareReservePercent): a request its pool's
	// share cannot take is answered 429 (QueueBytesExceeded). Zero: 512 MiB.
	MaxQueuedBytes int64
	// FairShareReservePercent is the part of MaxQueuedBytes kept for pools
	// that queue nothing yet; the rest is guaranteed in equal shares to the
	// namespaces queueing, and within each to its pools, which may borrow
	// what others leave idle (internal/fairshare). Zero: 10. Negative: none.
	FairShareReservePercent int
	// FlowHeader names the request header whose value is a request's flow
	// within its band (fairness key), e.g. a tenant header the gateway sets.
	// Empty: the flow is the request's objective.
	FlowHeader string

	// Waiting, when set, is told when a pool's waiting room turns from empty
	// to occupied: something is waiting for an endpoint (an autoscaler's
	// cue). Called with the pool queue's lock held: it must return at once.
	Waiting func(pool *datastore.Pool)
	// Drained, when set, is told when a pool's waiting room turns empty
	// again: its requests went on to an endpoint, left, or timed out, or
	// the pool is no longer served. Called with the pool queue's lock held:
	// it must return at once.
	Drained func(pool *datastore.Pool)
	// Registerer receives the flow-control metrics. Nil: a private registry.
	Registerer prometheus.Registerer
	// Logger receives the controller's logs (keys pool, request). Zero: discard.
	Logger logr.Logger
}

func (o *Options) setDefaults() {
	if o.QueueTTL <= 0 {
		o.QueueTTL = DefaultQueueTTL
	}
	if o.NoEndpointTTL < 0 {
		o.NoEndpointTTL = 0
	}
	if o.MaxBandRequests <= 0 {
		o.MaxBandRequests = DefaultMaxBandRequests
	}
	if o.MaxBandBytes <= 0 {
		o.MaxBandBytes = DefaultMaxBandBytes
	}
	if o.MaxQueuedBytes <= 0 {
		o.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.StealBelow <= 0 {
		o.StealBelow = DefaultStealBelow
	}
}
