// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package datastore

import (
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/types"
)

// Endpoint is one target port of one ready pod. Its identity fields are
// immutable; its metrics and in-flight count live in a state shared by every
// snapshot the endpoint appears in, so they survive endpoint-set swaps.
type Endpoint struct {
	// Address is "ip:port", the value sent to the gateway.
	Address string
	// IP is the pod IP.
	IP string
	// Port is the target port.
	Port int32
	// Pod is the namespace/name of the pod.
	Pod types.NamespacedName
	// PodUID tells a recreated pod with the same name apart.
	PodUID types.UID
	// Labels are the pod's labels (shared, never mutated).
	Labels map[string]string

	state *endpointState
}

type endpointState struct {
	metrics  atomic.Pointer[Metrics]
	inFlight atomic.Int64
	// inFlightAtMetrics is InFlight when metrics was published.
	inFlightAtMetrics atomic.Int64
	// runningCapacity is RunningCapacity.
	runningCapacity atomic.Int64
	// peerInFlight is the requests the picker's peer replicas say they
	// have in flight on the endpoint (peer sync), as peer sync last set
	// it; zero without peers.
	peerInFlight atomic.Int64
	// held counts the requests flow control holds in the picker for the
	// endpoint (AddHeld); heldAny is their total, read without heldMu.
	heldAny atomic.Int64
	heldMu  sync.Mutex
	held    []heldCount
}

// heldCount is the requests of one priority held for an endpoint.
type heldCount struct {
	priority int
	n        int64
}

// Key identifies the endpoint across snapshots: the pod UID and the port.
func (e *Endpoint) Key() EndpointKey { return EndpointKey{UID: e.PodUID, Port: e.Port} }

// Metrics returns the latest scrape, or nil when the endpoint was never scraped.
func (e *Endpoint) Metrics() *Metrics { return e.state.metrics.Load() }

// SetMetrics publishes a new scrape, and notes the in-flight count of the
// moment (InFlightAtMetrics).
func (e *Endpoint) SetMetrics(m *Metrics) {
	e.state.inFlightAtMetrics.Store(e.InFlight())
	if m != nil && m.WaitingRequests > 0 && m.RunningRequests > 0 {
		e.state.runningCapacity.Store(int64(m.RunningRequests))
	}
	e.state.metrics.Store(m)
}

// RunningCapacity is how many requests the server ran in the last scrape
// that showed others waiting: how many it runs at once (a vLLM server's
// max_num_seqs, or fewer while its KV cache is the bound). Zero until a
// scrape has shown a request waiting.
func (e *Endpoint) RunningCapacity() int64 { return e.state.runningCapacity.Load() }

// InFlightAtMetrics is the in-flight count when the current metrics were
// published. The count now less it is negative once requests the scrape
// saw have finished: slots it showed busy, or requests it showed waiting
// that have started since, which the next scrape would show.
func (e *Endpoint) InFlightAtMetrics() int64 { return e.state.inFlightAtMetrics.Load() }

// InFlight is the number of requests poolpicker sent to the endpoint and has
// not yet seen finish: this replica's (OwnInFlight) and, with peer sync,
// those its peer replicas last reported (SetPeerInFlight).
func (e *Endpoint) InFlight() int64 {
	return e.state.inFlight.Load() + e.state.peerInFlight.Load()
}

// OwnInFlight is the number of requests this replica sent to the endpoint
// and has not yet seen finish: what it reports to its peers.
func (e *Endpoint) OwnInFlight() int64 { return e.state.inFlight.Load() }

// SetPeerInFlight sets the count of the peer replicas' requests in flight
// on the endpoint. Peer sync owns the count: it keeps what each peer said
// per pool and address and sets the sum here, so that the endpoint objects
// of one pod (a relabelled pod's copy shares this count) see one value
// whatever object peer sync found.
func (e *Endpoint) SetPeerInFlight(n int64) { e.state.peerInFlight.Store(n) }

// AddInFlight adjusts the in-flight count by delta (+1 on pick, -1 on finish).
func (e *Endpoint) AddInFlight(delta int64) { e.state.inFlight.Add(delta) }

// AddHeld adjusts by delta the requests of priority that flow control holds
// in the picker for the endpoint: requests scheduled to it that wait for one
// of its slots. They are load the scheduler weighs (HeldAtOrAbove), not
// requests the server has.
func (e *Endpoint) AddHeld(priority int, delta int64) {
	s := e.state
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	s.heldAny.Add(delta)
	for i := range s.held {
		if s.held[i].priority == priority {
			s.held[i].n += delta
			return
		}
	}
	s.held = append(s.held, heldCount{priority: priority, n: delta})
}

// HeldAtOrAbove is the requests flow control holds for the endpoint whose
// priority is at least priority: those a request of that priority would
// wait behind there.
func (e *Endpoint) HeldAtOrAbove(priority int) int64 {
	s := e.state
	if s.heldAny.Load() == 0 {
		return 0
	}
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	var n int64
	for _, h := range s.held {
		if h.priority >= priority {
			n += h.n
		}
	}
	return max(n, 0)
}

// EndpointKey identifies an endpoint: a pod (by UID) and a target port.
type EndpointKey struct {
	UID  types.UID
	Port int32
}

// EndpointSource is what the pool watch knows of a ready pod.
type EndpointSource struct {
	Pod    types.NamespacedName
	UID    types.UID
	IP     string
	Labels map[string]string
}
